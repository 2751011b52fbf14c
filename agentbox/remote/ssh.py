"""The transport to a remote host: OpenSSH with one multiplexed connection per host (ControlMaster).

Every call is `ssh -o ControlMaster=auto -o ControlPath=... [-p PORT] [-l USER] HOST -- COMMAND`: the first call
opens the master connection and leaves it running for ControlPersist seconds, later calls ride on it (no new
handshake, no new authentication). ssh uses the user's own configuration, keys and agent; agentbox adds only
what keeps the connection narrow: no agent or X11 forwarding, no forwards from the user's configuration on a
command connection, never a password prompt (BatchMode). A port forward is asked of the running master
(`-O forward`), so it lives exactly as long as the connection.

The remote command is one string for the remote user's shell, quoted with shlex.quote from agentbox's own
words (subcommands, task keys, numbers); nothing secret and no user data travels on the command line, only on
stdin.

ssh exits 255 for its own failures, and also when the remote command exits 255. The two are told apart by
asking the master (`-O check`, a local socket call): alive, the 255 was the command's; gone, the host was not
reached or the connection broke, and that is `Unreachable`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from typing import NamedTuple

from agentbox import hosttools, paths
from agentbox.errors import AgentboxError
from agentbox.safetext import visible

CONTROL_PERSIST = 300  # seconds an idle master connection stays
CONNECT_TIMEOUT = 10
SSH_FAILED = 255  # ssh's own exit status for its failures

# The master's ControlPath is a unix socket: its path must stay under ~104 bytes (macOS; 108 on Linux), with room
# for the ".XXXXXXXXXXXXXXXX" suffix ssh adds while it creates the socket.
_MAX_CONTROL_DIR = 64


class Target(NamedTuple):
    """Where a host is: its agentbox name, and what ssh is told (user and port None: ssh's configuration says)."""

    name: str
    user: str | None
    hostname: str
    port: int | None


class Completed(NamedTuple):
    code: int
    stdout: bytes
    stderr: bytes


class Unreachable(AgentboxError):
    """ssh could not reach the host, or the connection broke: the host, not the remote command."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(f"host {host} is unreachable: {detail}",
                         hint=f"check that `ssh {host}` works from this machine (agentbox hosts doctor {host})")
        self.host = host
        self.detail = detail


def control_dir() -> str:
    """A private folder for the master connections' sockets: short (socket path limit), ours, mode 0700."""
    base = tempfile.gettempdir()
    if len(base) > _MAX_CONTROL_DIR - 20:
        base = "/tmp"
    folder = os.path.join(base, f"agentbox-ssh-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise AgentboxError(f"{folder} is not a private folder of this user (mode 0700): agentbox keeps its ssh "
                            f"connections' sockets there", hint=f"remove {folder} and try again")
    return folder


def _last_line(stderr: bytes) -> str:
    """ssh's last word, escaped: a host (its banner, its shell) can put any bytes there."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return visible(lines[-1][:500]) if lines else "ssh ended without saying why"


class Transport:
    def __init__(self, host: Target) -> None:
        self.host = host
        ssh = hosttools.which("ssh")
        if ssh is None:
            raise AgentboxError(f"ssh was not found on PATH, so agentbox cannot reach host {host.name}",
                                hint="install OpenSSH's client (apt-get install openssh-client)")
        self._ssh = ssh
        # One master per host and per agentbox state folder: two states (two users' set-ups, tests) never share.
        key = "\0".join([host.name, host.user or "", host.hostname, str(host.port or ""), str(paths.state_dir())])
        self.control_path = os.path.join(control_dir(), "cm-" + hashlib.sha256(key.encode()).hexdigest()[:16])

    # -- the ssh command line -------------------------------------------------------------------------------

    def _base(self, *, command: bool = True) -> list[str]:
        argv = [self._ssh, "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}",
                "-o", f"ControlPersist={CONTROL_PERSIST}", "-o", "BatchMode=yes", "-o", "ForwardAgent=no",
                "-o", "ForwardX11=no", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}", "-o", "ServerAliveInterval=10",
                "-o", "ServerAliveCountMax=3", "-o", "LogLevel=ERROR"]
        if command:
            argv += ["-o", "ClearAllForwardings=yes"]
        if self.host.port is not None:
            argv += ["-p", str(self.host.port)]
        if self.host.user:
            argv += ["-l", self.host.user]
        return argv

    def _command(self, argv: Sequence[str], tty: bool = False) -> list[str]:
        if not argv:
            raise ValueError("an empty remote command")
        return [*self._base(), "-t" if tty else "-T", self.host.hostname, "--", shlex.join(argv)]

    def _control(self, operation: str, *extra: str) -> list[str]:
        return [*self._base(command=False), "-O", operation, *extra, self.host.hostname]

    def _master_alive(self) -> bool:
        return self.master_pid() is not None

    def raise_if_unreachable(self, code: int, stderr: bytes) -> None:
        """Raise Unreachable when ssh's 255 was ssh's own (no master connection left), not the command's; for
        the callers of `stream`, with the process's exit code and stderr."""
        if code == SSH_FAILED and not self._master_alive():
            raise Unreachable(self.host.name, _last_line(stderr))

    # -- the API ----------------------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], stdin: bytes | None = None, timeout: float = 60) -> Completed:
        """Run argv on the host; its exit code, stdout and stderr as they came. Unreachable when ssh failed."""
        try:
            result = subprocess.run(self._command(argv), input=stdin if stdin is not None else b"",
                                    capture_output=True, timeout=timeout, env=hosttools.environ())
        except subprocess.TimeoutExpired as e:
            raise Unreachable(self.host.name, f"no answer within {timeout:g} s to `{shlex.join(argv)}`") from e
        self.raise_if_unreachable(result.returncode, result.stderr)
        return Completed(result.returncode, result.stdout, result.stderr)

    def stream(self, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """argv running on the host, its stdout piped (to follow output); stdin is empty, stderr piped. When it
        ends, `raise_if_unreachable(code, stderr)` tells a lost connection from the command's own end."""
        return subprocess.Popen(self._command(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=hosttools.environ())

    def attached(self, argv: Sequence[str], tty: bool) -> int:
        """argv running on the host with this process's stdin, stdout and stderr (a terminal with tty)."""
        code = subprocess.call(self._command(argv, tty=tty), env=hosttools.environ())
        if code == SSH_FAILED and not self._master_alive():
            raise Unreachable(self.host.name, "the connection ended (ssh exited 255)")
        return code

    def _ensure_master(self) -> None:
        if not self._master_alive():
            self.run(["true"])

    def master_pid(self) -> int | None:
        """The master connection's process id (None: there is none). A new one means forwards made on the old
        one are gone."""
        try:
            result = subprocess.run(self._control("check"), stdin=subprocess.DEVNULL, capture_output=True,
                                    timeout=CONNECT_TIMEOUT, env=hosttools.environ())
        except subprocess.TimeoutExpired:
            return None
        found = re.search(rb"pid=(\d+)", result.stderr)
        return int(found.group(1)) if result.returncode == 0 and found else None

    def forward_remote(self, local_port: int, remote_port: int = 0) -> int:
        """Make the host's 127.0.0.1:PORT reach this machine's 127.0.0.1:local_port for the master connection's
        lifetime; return PORT (chosen by the host's sshd when remote_port is 0, else remote_port: the same port
        again after the connection was remade)."""
        self._ensure_master()
        spec = f"{int(remote_port)}:127.0.0.1:{int(local_port)}"
        result = subprocess.run(self._control("forward", "-R", spec), stdin=subprocess.DEVNULL, capture_output=True,
                                timeout=CONNECT_TIMEOUT * 3, env=hosttools.environ())
        found = re.fullmatch(rb"\s*(\d+)\s*", result.stdout) if remote_port == 0 else None
        if result.returncode != 0 or (remote_port == 0 and found is None):
            if not self._master_alive():
                raise Unreachable(self.host.name, _last_line(result.stderr))
            raise AgentboxError(f"host {self.host.name} refused to forward its port {remote_port or '(any)'} back "
                                f"to 127.0.0.1:{local_port}: {_last_line(result.stderr)}",
                                hint="its sshd must allow TCP forwarding (AllowTcpForwarding yes or remote)")
        return int(found.group(1)) if found is not None else remote_port

    def cancel_forward(self, local_port: int, remote_port: int) -> None:
        """End a forward_remote; nothing when the master connection is gone (and the forward with it).

        The master knows a forward by the words it was asked with (`0:...` when the host chose the port, else
        `PORT:...`): both are tried (ssh exits 0 even when nothing matched)."""
        for asked in (0, remote_port):
            subprocess.run(self._control("cancel", "-R", f"{int(asked)}:127.0.0.1:{int(local_port)}"),
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=CONNECT_TIMEOUT * 3,
                           env=hosttools.environ())

    def close(self) -> None:
        """End the master connection (its forwards with it); nothing when there is none."""
        subprocess.run(self._control("exit"), stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=CONNECT_TIMEOUT * 3, env=hosttools.environ())
