"""The last base build's log, STATE/bases/build.log: what each step printed (Lima's create and start, each agent's
install, the check, the seal) and, when the build failed, the guest's provisioning log and Lima's host-agent log.
The unfinished VM is deleted, so this file is what is left to read: `agentbox base log` prints it. Most of it
came from the VM, so it is only ever printed through agentbox.safetext.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from agentbox import lazyre, paths
from agentbox.fsutil import private_dir
from agentbox.safetext import visible_text

LIMIT = 4 << 20  # the file stops growing here; `base log` reads at most this much
NAME = "build.log"
# npm's last line only says where its own log is: the error is above it.
_NPM_ERROR = lazyre.compile(r"^npm (?:error|ERR!)\s*(.*)$")
_NPM_NOISE = lazyre.compile(r"^(?:A complete log of this run can be found in|Log files were not written|code |errno |"
                        r"syscall |\d{3}\s*$|$)")


def path() -> Path:
    return paths.bases_dir() / NAME


class BuildLog:
    """Appends to the last build's log (started empty), each write flushed, at most LIMIT bytes."""

    def __init__(self, title: str) -> None:
        private_dir(paths.bases_dir())
        target = path()
        target.unlink(missing_ok=True)  # never write through a link someone left there
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        self._file = os.fdopen(descriptor, "w", encoding="utf-8", errors="replace")
        self._size = 0
        self.section(f"{title}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")

    def section(self, title: str) -> None:
        self.write(f"\n== {title}\n")

    def line(self, text: str) -> None:
        self.write(text.rstrip("\n") + "\n")

    def write(self, text: str) -> None:
        if self._size >= LIMIT or self._file.closed:
            return
        text = text[: LIMIT - self._size]
        self._size += len(text.encode("utf-8", errors="replace"))
        self._file.write(text)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def shown() -> str | None:
    """The last build's log, every line made safe to print; None when there is none."""
    try:
        descriptor = os.open(path(), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as file:
        data = file.read(LIMIT)
    return visible_text(data.decode("utf-8", errors="replace"))


def failure_line(output: str) -> str:
    """The line that says why a command failed: npm's real error rather than its pointer to its log file, else
    the last line that is not such a pointer. Not yet made safe to print."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        found = _NPM_ERROR.match(line)
        if found and not _NPM_NOISE.match(found.group(1)):
            return line
    return next((line for line in reversed(lines) if not _NPM_NOISE.match(_strip_npm(line))), "")


def _strip_npm(line: str) -> str:
    found = _NPM_ERROR.match(line)
    return found.group(1) if found else line
