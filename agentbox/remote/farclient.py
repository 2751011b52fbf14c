"""The far end's client: runs agentbox/remote/far.py on a remote host through a transport, installing it first when
the host does not have this version yet.

The script is installed as `~/.agentbox-remote/bin/far-<sha256[:12] of its bytes>.py`, so a laptop never runs
another version by mistake. A call is one run of the transport; a host without this version answers 127, and then
the script is installed (one more run) and the call made again, once per version and host.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from agentbox.errors import AgentboxError
from agentbox.safetext import visible

FAR_SCRIPT = Path(__file__).with_name("far.py")
FAR_ROOT = "~/.agentbox-remote"  # the far end's folder on a host (far.py's ROOT_NAME in the remote home)
REMOTE_BIN = ".agentbox-remote/bin"  # below the remote home
MISSING = 127  # the far end is not installed (or python3 is missing: told apart by installing once)
ERROR_EXIT = 3  # far.py's {"error": ...}
INSTALL_TIMEOUT = 60.0
COLLECT_LIMIT = 128 * 1024 * 1024


class Completed(NamedTuple):
    code: int
    stdout: bytes
    stderr: bytes


class Runs(Protocol):
    """What Far needs of a transport (agentbox.remote.ssh.Transport, or a local one in tests)."""

    def run(self, argv: Sequence[str], stdin: bytes | None = None, timeout: float = 60) -> Any: ...


class FarError(AgentboxError):
    """The far end's {"error": ...}, or an answer that is not its JSON."""


def script_bytes() -> bytes:
    return FAR_SCRIPT.read_bytes()


def script_name(data: bytes | None = None) -> str:
    """far-<digest>.py: the installed name of this version of the far end."""
    digest = hashlib.sha256(script_bytes() if data is None else data).hexdigest()[:12]
    return f"far-{digest}.py"


class Far:
    def __init__(self, transport: Runs) -> None:
        self.transport = transport
        self.script = script_bytes()
        self.path = f'"$HOME"/{REMOTE_BIN}/{script_name(self.script)}'

    @property
    def host(self) -> str:
        host = getattr(self.transport, "host", None)
        return str(getattr(self.transport, "name", None) or getattr(host, "name", None) or "the remote host")

    def call(self, command: str, *args: str, stdin: bytes | None = None, timeout: float = 60) -> dict[str, Any]:
        """The far end's JSON answer to COMMAND ARGS; FarError for its error or an answer that is not its JSON."""
        done = self._run(command, args, stdin, timeout)
        if done.code not in (0, ERROR_EXIT):
            raise self._failed(command, done)
        answer = self._json(command, done)
        if done.code == ERROR_EXIT or "error" in answer:
            raise FarError(f"{self.host}: the far end's `{command}` failed: {visible(str(answer.get('error')))}",
                           hint=f"Check the host with `agentbox hosts doctor {self.host}`.")
        return answer

    def call_bytes(self, command: str, *args: str, timeout: float = 60, limit: int = COLLECT_LIMIT) -> bytes:
        """COMMAND's stdout as bytes (collect's tar), at most limit; FarError when it failed."""
        done = self._run(command, args, None, timeout)
        if done.code == ERROR_EXIT:
            answer = self._json(command, done)
            raise FarError(f"{self.host}: the far end's `{command}` failed: {visible(str(answer.get('error')))}")
        if done.code != 0:
            raise self._failed(command, done)
        if len(done.stdout) > limit:
            raise FarError(f"{self.host}: the far end's `{command}` answered {len(done.stdout):,} bytes, more than "
                           f"the {limit:,} agentbox takes")
        return bytes(done.stdout)

    # -- the runs --------------------------------------------------------------------------------------

    def _run(self, command: str, args: Sequence[str], stdin: bytes | None, timeout: float) -> Completed:
        done = self._once(command, args, stdin, timeout)
        if done.code != MISSING:
            return done
        self.install()
        done = self._once(command, args, stdin, timeout)
        if done.code == MISSING:
            raise FarError(f"{self.host}: the far end does not run there even after installing it "
                           f"({_last_line(done.stderr) or 'exit status 127'})",
                           hint="The far end needs `python3` (3.8 or newer) on the host's PATH for ssh commands.")
        return done

    def argv(self, command: str, *args: str) -> list[str]:
        """The remote command that runs the installed far end's COMMAND (exit 127 when it is not installed)."""
        script = f'test -f {self.path} || exit {MISSING}; exec python3 {self.path} "$@"'
        return ["sh", "-c", script, "far", command, *args]

    def _once(self, command: str, args: Sequence[str], stdin: bytes | None, timeout: float) -> Completed:
        done = self.transport.run(self.argv(command, *args), stdin=stdin, timeout=timeout)
        return Completed(int(done.code), bytes(done.stdout), bytes(done.stderr))

    def install(self) -> None:
        """Copy this version of far.py to the host (its folders 0700)."""
        folder = f'"$HOME"/{REMOTE_BIN}'
        script = (f"umask 077 && mkdir -p {folder} && chmod 700 \"$HOME\"/.agentbox-remote {folder} && "
                  f"cat > {self.path}.$$ && mv -f {self.path}.$$ {self.path}")
        done = self.transport.run(["sh", "-c", script], stdin=self.script, timeout=INSTALL_TIMEOUT)
        if done.code != 0:
            raise FarError(f"{self.host}: installing the far end in ~/{REMOTE_BIN} failed "
                           f"({_last_line(bytes(done.stderr)) or f'exit status {done.code}'})")

    # -- the answers -----------------------------------------------------------------------------------

    def _json(self, command: str, done: Completed) -> dict[str, Any]:
        try:
            answer = json.loads(done.stdout.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            answer = None
        if not isinstance(answer, dict):
            raise FarError(f"{self.host}: the far end's `{command}` did not answer with its JSON "
                           f"(exit status {done.code}; {_last_line(done.stderr) or 'nothing on stderr'})")
        return answer

    def _failed(self, command: str, done: Completed) -> FarError:
        return FarError(f"{self.host}: the far end's `{command}` failed with exit status "
                        f"{done.code} ({_last_line(done.stderr) or 'nothing on stderr'})")


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    return visible(lines[-1][:300]) if lines else ""
