"""limactl's stderr during a `shell` that may find its VM stopped or missing: passed on, but Lima's own answer kept.

A warm launch runs `limactl shell` first, without asking `limactl list`. When the VM is stopped or gone, Lima
says so before ssh runs, as one logrus line on stderr (a pipe here, so the text format: `time="..." level=fatal
msg="instance `N` is stopped, ..."`) and exits 1, which a program's own exit 1 cannot be told from. So the
shell's stderr goes through a pipe of agentbox's: while what arrives could still be Lima's (lines starting
`time="`), it is read a line at a time, Lima's fatal about the instance is kept (not shown: agentbox starts the
VM and says so) and anything else is passed on; from the first byte that cannot be Lima's, everything is passed
on as it arrives, byte for byte. A held line followed by anything was the program's (Lima's fatal is its last
word): it is passed on then, in order (agentbox.session.warm shows it too when it was the program's last).
With a terminal the program's own output goes to the terminal through ssh's stdout; only ssh's and Lima's
messages pass here.
"""

from __future__ import annotations

import os
import select
import threading

from agentbox.logline import parse_log_line

STOPPED = "stopped"
MISSING = "missing"

_LIMA_LINE = b'time="'
_LINE_LIMIT = 64 * 1024  # a longer "line" is no logrus line of Lima's
_DRAIN_SECONDS = 0.2  # after the child ended: what it wrote is in the pipe already; a process it left may hold it


def lima_verdict(message: str, vm_name: str) -> str | None:
    """STOPPED or MISSING when `message` is Lima's fatal about `vm_name` (cmd/limactl/shell.go), else None."""
    if message == f"instance `{vm_name}` is stopped, run `limactl start {vm_name}` to start the instance":
        return STOPPED
    if message == f"instance `{vm_name}` does not exist, run `limactl create {vm_name}` to create a new instance":
        return MISSING
    return None


class StderrWatch:
    """The reading end of the pipe given to limactl as stderr, relayed to fd 2 in a thread."""

    def __init__(self, vm_name: str) -> None:
        self.name = vm_name
        self.verdict: str | None = None
        self.held = b""  # the line Lima's verdict came in: the program's own, should the program have run
        self._read, self.write_end = os.pipe()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._relay, name="agentbox-shell-stderr", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close_write_end(self) -> None:
        """After the child has it: only the child (and what it starts) keeps the pipe open."""
        os.close(self.write_end)

    def finish(self) -> str | None:
        """The child ended: pass on what is left, stop, and say what Lima said (STOPPED, MISSING or None)."""
        self._ended.set()
        self._thread.join()
        os.close(self._read)
        return self.verdict

    # -- in the thread --------------------------------------------------------------------------------
    def _relay(self) -> None:
        pending = b""
        watching = True
        while True:
            ready, _, _ = select.select([self._read], [], [], _DRAIN_SECONDS if self._ended.is_set() else 0.5)
            if not ready:
                if self._ended.is_set():
                    break
                continue
            chunk = os.read(self._read, 65536)
            if not chunk:
                break
            if not watching:
                _write_all(chunk)
                continue
            self._release()
            pending += chunk
            pending, watching = self._lines(pending)
            if not watching:
                _write_all(pending)
                pending = b""
        _write_all(pending)

    def _lines(self, pending: bytes) -> tuple[bytes, bool]:
        """Take Lima's complete lines off `pending`; (what is left, whether it may still be Lima's)."""
        while pending:
            self._release()
            if not (pending.startswith(_LIMA_LINE) or _LIMA_LINE.startswith(pending)):
                return pending, False
            end = pending.find(b"\n")
            if end < 0:
                return pending, len(pending) < _LINE_LIMIT
            line, pending = pending[:end + 1], pending[end + 1:]
            parsed = parse_log_line(line.decode("utf-8", "replace"))
            verdict = lima_verdict(parsed.message, self.name) if parsed.level == "fatal" else None
            if verdict is not None:
                self.verdict = verdict
                self.held += line
            else:
                _write_all(line)
        return pending, True

    def _release(self) -> None:
        """Lima's fatal is its last word: anything after the held line shows it was the program's."""
        if self.held:
            _write_all(self.held)
            self.held, self.verdict = b"", None


def write_stderr(data: bytes) -> None:
    """Show what was held back after all (a program that ran printed it, however unlikely)."""
    _write_all(data)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(2, view)
        except BlockingIOError:
            select.select([], [2], [])
            continue
        except OSError:
            return  # stderr closed: nothing to show it on
        view = view[written:]
