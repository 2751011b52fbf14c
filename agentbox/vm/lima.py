"""The only module that runs limactl, or ssh into a Lima VM. Everything else asks it.

Captured calls (list, create, clone, rename, start, stop, delete, edit) return parsed results or raise LimaError
naming the command and exit code, with Lima's own messages (and, from the long ones, the last
lines of their output). `shell` is attached: the terminal, stdin, stdout and stderr pass straight
through and its exit code is returned.

Ports. Lima's host agent forwards every TCP port a guest program listens on to the same port on the
host's 127.0.0.1 and, when that host port is taken, only logs a warning. `port_forwards` reads what
it did from the instance folder (no limactl call, so a launch can afford it). `forward_port` adds one
forward on demand to a running VM without restarting it: a detached `ssh -N -L` through the
ssh.config Lima writes in the instance folder (`limactl tunnel` only offers a SOCKS proxy, and
`portForwards` are read at start), which lives until the VM stops or `stop_port_forward`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import hosttools, lazyre, terminal
from agentbox.errors import Interrupted, LimaError
from agentbox.logline import parse_log_line
from agentbox.safetext import visible
from agentbox.vm import calllog

RUNNING = "Running"
STOPPED = "Stopped"
BROKEN = "Broken"
NOT_CREATED = "NotCreated"

INSTALL_HINT = (
    "Install Lima 2.x: on macOS `brew install lima`; on Linux see "
    "https://lima-vm.io/docs/installation/ (or `brew install lima` with Homebrew)."
)


def not_found_hint(executable: str) -> str:
    """INSTALL_HINT, or where PATH has limactl in a folder agentbox does not search (relative, or the workspace)."""
    skipped = hosttools.ignored(executable)
    if skipped is None:
        return INSTALL_HINT
    return (f"PATH has {skipped}, in a folder agentbox does not run host tools from (an empty or relative PATH "
            f"entry, or inside the workspace, which the VM can write). Put Lima's folder on PATH by its absolute "
            f"path, outside the workspace. {INSTALL_HINT}")


# limactl start's own --timeout covers boot plus provisioning; a first boot downloads and installs a lot.
MIN_START_TIMEOUT = 600
EDIT_FLAGS = ("cpus", "memory", "disk")  # what agentbox changes with `limactl edit`, in Lima's order
# Lima's `the YAML is invalid, saved the buffer as "lima.REJECTED.yaml": REASON`: the file is in a folder that is gone.
_REJECTED_FILE = lazyre.compile(
    r',? *(?:attempted to )?saved? the buffer as [`"]?[^`"]*lima\.REJECTED\.yaml[`"]?(?: but failed)?'
)


class Instance(NamedTuple):
    """One row of `limactl list --json`; unknown fields are kept in raw."""

    name: str
    status: str
    dir: str
    vm_type: str
    arch: str
    cpus: int
    memory: int
    disk: int
    config: dict[str, Any]
    param: dict[str, str]
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Instance:
        return cls(
            name=data.get("name", ""),
            status=data.get("status", "") or "",
            dir=data.get("dir", ""),
            vm_type=data.get("vmType", "") or "",
            arch=data.get("arch", "") or "",
            cpus=int(data.get("cpus", 0) or 0),
            memory=int(data.get("memory", 0) or 0),
            disk=int(data.get("disk", 0) or 0),
            config=data.get("config") or {},
            param=data.get("param") or (data.get("config") or {}).get("param") or {},
            raw=data,
        )

    @property
    def log_path(self) -> str:
        return os.path.join(self.dir, "ha.stderr.log")

    @property
    def ssh_host(self) -> str:
        """The Host of Lima's ssh.config: lima-NAME with dots and underscores as dashes."""
        return "lima-" + self.name.replace(".", "-").replace("_", "-")


class LimaSaid(NamedTuple):
    """Lima's own answer to a `shell` (agentbox.vm.shellwatch): STOPPED or MISSING, and the line it came in."""

    verdict: str
    line: bytes


class PortForward(NamedTuple):
    """A guest TCP listener Lima's host agent forwards; `forwarded` is False when the host address was
    taken (Lima logged `failed to listen tcp: ADDR` and nothing else), `error` says why."""

    guest_addr: str
    host_addr: str
    forwarded: bool
    error: str = ""

    @property
    def host_port(self) -> int:
        return int(self.host_addr.rpartition(":")[2])

    @property
    def guest_port(self) -> int:
        return int(self.guest_addr.rpartition(":")[2])


class Lima:
    """Runs limactl. `on_output` receives every stderr/stdout line of long operations.

    Quick captured calls (list, delete, --version) and the attached `shell` use subprocess;
    the long streamed ones (create, start, stop) use `sh`, whose line callbacks feed the progress
    display. Importing `sh` costs about 45 ms, a third of a warm launch's budget, so the warm path
    (one shell, or list + shell) never imports it.
    """

    def __init__(self, debug: bool = False, executable: str = "limactl") -> None:
        self.debug = debug
        self.executable = executable
        self._command: Any = None
        self._path: str | None = None
        self.listed: dict[str, Instance] = {}  # the last `list`: other VMs' folders without another call

    # -- state ---------------------------------------------------------------------------------
    def instances(self) -> dict[str, Instance]:
        """Every instance, by name. Any failure is an error: never mistake it for "not created"."""
        stdout, _ = self._captured(["list", "--json"])
        instances = {}
        for number, line in enumerate(stdout.splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LimaError(
                    f"`limactl list --json` printed something that is not JSON (line {number}: {line[:120]!r})",
                    hint="agentbox stops here rather than guess whether the VM exists. Check `limactl list`.",
                ) from exc
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                raise LimaError(f"`limactl list --json` line {number} has no instance name: {line[:120]!r}")
            instances[data["name"]] = Instance.from_json(data)
        self.listed = instances
        return instances

    def get(self, vm_name: str) -> Instance | None:
        return self.instances().get(vm_name)

    def create(self, vm_name: str, template: Path, on_output: Callable[[str], None] | None = None) -> None:
        self._streamed(["--tty=false", "create", "--name", vm_name, str(template)], on_output)

    def start(self, vm_name: str, timeout_sec: int, on_output: Callable[[str], None] | None = None,
              env: Mapping[str, str] | None = None) -> None:
        """`limactl start`; `env`: added to its environment (a held start's QEMU_SYSTEM_<ARCH>, agentbox.net.hold:
        Lima's host agent, which starts QEMU, inherits it)."""
        self._streamed(["--tty=false", "start", "--timeout", f"{timeout_sec}s", vm_name], on_output, env=env)

    def stop(self, vm_name: str, force: bool = False, on_output: Callable[[str], None] | None = None) -> None:
        self._streamed(["--tty=false", "stop", *(["--force"] if force else []), vm_name], on_output)

    def delete(self, vm_name: str, force: bool = False) -> None:
        self._captured(["--tty=false", "delete", *(["--force"] if force else []), vm_name])

    def clone(self, source: str, vm_name: str, edits: Sequence[str], cwd: str,
              on_output: Callable[[str], None] | None = None) -> None:
        """`limactl clone SOURCE NAME` with edit flags (--set, --cpus, ...), run in `cwd`: Lima writes an
        edit it rejects to ./lima.REJECTED.yaml there. Copying the disk can take a while without CoW."""
        self._streamed(["--tty=false", "clone", source, vm_name, *edits], on_output, cwd=cwd)

    def rename(self, old: str, new: str) -> None:
        self._captured(["--tty=false", "rename", old, new])

    def edit(self, vm_name: str, flags: dict[str, str]) -> None:
        """`limactl edit NAME --cpus N --memory GiB --disk GiB` (the flags given, in that order) on a stopped VM.

        Lima saves a rejected edit as ./lima.REJECTED.yaml in its current folder, so it runs in a temporary
        folder of its own (gone afterwards); the error keeps Lima's reason without that file's name.
        """
        args = ["--tty=false", "edit", vm_name]
        for flag in EDIT_FLAGS:
            if flag in flags:
                args += [f"--{flag}", flags[flag]]
        with tempfile.TemporaryDirectory(prefix="agentbox-edit-") as folder:
            try:
                self._captured(args, cwd=folder)
            except LimaError as error:
                reasons = [_REJECTED_FILE.sub("", line) for line in error.stderr_lines] or [error.message]
                raise LimaError(f"Lima refused to change {vm_name}: {reasons[-1]}", stderr_lines=reasons) from None

    # -- attached ------------------------------------------------------------------------------
    def shell(
        self,
        vm_name: str,
        argv: Sequence[str],
        workdir: str | None = None,
        reconnect: bool = False,
        stdin_data: bytes | None = None,
    ) -> int:
        """Run argv in the VM with stdio passed through; return its exit code.

        The terminal is restored afterwards (agentbox.terminal): the program may have left it in any state.
        agentbox stays the parent (it checks the workspace after the session), so it ignores
        SIGINT/SIGQUIT meanwhile: Ctrl-C belongs to the program in the VM.
        """
        return self._attached(vm_name, argv, workdir, reconnect, stdin_data)[0]

    def shell_unlisted(self, vm_name: str, argv: Sequence[str], reconnect: bool = False,
                       stdin_data: bytes | None = None) -> tuple[int, LimaSaid | None]:
        """`shell` without a `list` before it: (exit code, what Lima said instead of running argv: the VM is
        stopped or missing, else None). With --tty=false Lima never asks whether to start a stopped VM; its answer
        is kept from stderr (agentbox.vm.shellwatch), not shown."""
        return self._attached(vm_name, argv, None, reconnect, stdin_data, watch=True)

    def _attached(self, vm_name: str, argv: Sequence[str], workdir: str | None, reconnect: bool,
                  stdin_data: bytes | None, watch: bool = False) -> tuple[int, LimaSaid | None]:
        args = ["shell", "--tty=false"] if watch else ["shell"]
        if workdir:
            args += ["--workdir", workdir]
        if reconnect:
            args.append("--reconnect")
        args += [vm_name, "--", *argv] if argv else [vm_name]

        started = time.monotonic()
        full = [self._resolve(), *args]
        stderr = None
        if watch:
            # deferred: start-up (vm.shellwatch: only an attached shell watches stderr, not the launch's own calls)
            from agentbox.vm.shellwatch import StderrWatch

            stderr = StderrWatch(vm_name)
            stderr.start()
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
        verdict = None
        try:
            try:
                process = subprocess.Popen(full, env=hosttools.environ(), preexec_fn=_restore_signals,
                                           stdin=subprocess.PIPE if stdin_data is not None else None,
                                           stderr=stderr.write_end if stderr is not None else None)
            finally:
                if stderr is not None:
                    stderr.close_write_end()
            if stdin_data is not None:
                process.communicate(stdin_data)
            code = process.wait()
        finally:
            if stderr is not None:
                found = stderr.finish()
                verdict = LimaSaid(found, stderr.held) if found is not None else None
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            terminal.restore()  # before agentbox prints anything after the session
        calllog.record(full, time.monotonic() - started, code, echo=self.debug)
        return (128 - code if code < 0 else code), verdict  # a signal death reads like a shell's 128+N

    # -- plumbing ------------------------------------------------------------------------------
    def _resolve(self) -> str:
        if self._path is None:
            found = hosttools.which(self.executable)
            if not found:
                raise LimaError("limactl was not found on PATH, so agentbox cannot run any VM.",
                                hint=not_found_hint(self.executable))
            self._path = found
        return self._path

    def _sh(self) -> Any:
        if self._command is None:
            # deferred: start-up (sh, ~70 ms: only streamed/long calls use it; the warm launch runs subprocess)
            import sh

            self._command = sh.Command(self._resolve())
        return self._command

    def _captured(self, args: list[str], cwd: str | None = None) -> tuple[str, str]:
        full = [self._resolve(), *args]
        started = time.monotonic()
        try:
            result = subprocess.run(full, stdin=subprocess.DEVNULL, capture_output=True, cwd=cwd,
                                    env=hosttools.environ())
        except KeyboardInterrupt:
            calllog.record(full, time.monotonic() - started, 130, echo=self.debug)
            raise Interrupted("interrupted") from None
        except OSError as exc:
            raise LimaError(f"cannot run {full[0]}: {exc.strerror}", hint=INSTALL_HINT) from exc
        calllog.record(full, time.monotonic() - started, result.returncode, echo=self.debug)
        stderr = result.stderr.decode(errors="replace")
        if result.returncode != 0:
            raise self._error(args, result.returncode, stderr)
        return result.stdout.decode(errors="replace"), stderr

    def version(self) -> str:
        """limactl's version without a leading v (`limactl version 2.2.0` -> `2.2.0`)."""
        stdout, _ = self._captured(["--version"])
        match = re.match(r"^limactl version v?(\S+)", stdout.strip())
        if not match:
            raise LimaError(f"cannot read limactl's version from {stdout.strip()!r}")
        return match.group(1)

    def shell_output(self, vm_name: str, argv: list[str], stdin_data: bytes | None = None) -> tuple[int, str]:
        """Run argv in the VM with output captured (for checks, not sessions); any exit code is returned.
        `stdin_data` is what the command reads on its stdin (a secret goes there, never on the command line)."""
        full = [self._resolve(), "shell", vm_name, "--", *argv]
        started = time.monotonic()
        if stdin_data is None:
            result = subprocess.run(full, stdin=subprocess.DEVNULL, capture_output=True, env=hosttools.environ())
        else:
            result = subprocess.run(full, input=stdin_data, capture_output=True, env=hosttools.environ())
        calllog.record(full, time.monotonic() - started, result.returncode, echo=self.debug)
        return result.returncode, result.stdout.decode(errors="replace")

    def shell_bytes(self, vm_name: str, argv: list[str], limit: int,
                    stdin_data: bytes | None = None) -> tuple[int, bytes, str]:
        """Run argv in the VM and return (exit code, stdout, stderr): stdout as bytes, read up to limit.

        What the VM prints is untrusted: more than `limit` bytes stops the command (LimaError) rather
        than filling the host's memory. `stdin_data` (small: it is written before stdout is read) is what
        the command reads on its stdin.
        """
        full = [self._resolve(), "shell", vm_name, "--", *argv]
        started = time.monotonic()
        chunks: list[bytes] = []
        size = 0
        with tempfile.TemporaryFile() as errors:
            process = subprocess.Popen(full, stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=errors, env=hosttools.environ())
            assert process.stdout is not None
            if process.stdin is not None:
                with suppress(BrokenPipeError):
                    process.stdin.write(stdin_data or b"")
                with suppress(BrokenPipeError):
                    process.stdin.close()
            try:
                while chunk := process.stdout.read(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        process.kill()
                        process.wait()
                        calllog.record(full, time.monotonic() - started, -9, echo=self.debug)
                        raise LimaError(f"the VM {vm_name} sent more than {limit:,} bytes; agentbox stopped reading",
                                        hint="Nothing was copied. Make the folders smaller in the VM and try again.")
                    chunks.append(chunk)
            finally:
                process.stdout.close()
            code = process.wait()
            errors.seek(0)
            stderr = errors.read(1 << 16).decode(errors="replace")
        calllog.record(full, time.monotonic() - started, code, echo=self.debug)
        return code, b"".join(chunks), stderr

    def _streamed(self, args: list[str], on_output: Callable[[str], None] | None, cwd: str | None = None,
                  env: Mapping[str, str] | None = None) -> None:
        """Run a long operation, feeding each output line to on_output as it arrives."""
        # deferred: start-up (sh, ~70 ms: only streamed/long calls use it; the warm launch runs subprocess)
        import sh

        command = self._sh()
        lines: list[str] = []

        def feed(line: str) -> None:
            line = line.rstrip("\n")
            lines.append(line)
            if on_output:
                on_output(line)

        started = time.monotonic()
        code = 0
        process = None
        try:
            # stdin from /dev/null: without `_in`, a callable `_out` makes sh feed stdin from a Queue, whose
            # writer thread notices the exit only between 0.1 s waits on that queue, and wait() joins it.
            with open(os.devnull, "rb") as devnull:
                with _sigint_held() as held:
                    process = command(*args, _in=devnull, _tty_out=False, _tty_in=False, _bg=True, _bg_exc=False,
                                      _out=feed, _err=feed, _env={**hosttools.environ(), **(env or {})},
                                      **({"_cwd": cwd} if cwd else {}))
                if held:
                    raise KeyboardInterrupt
                process.wait()
        except sh.ErrorReturnCode as exc:
            code = exc.exit_code
            raise self._error(args, code, "\n".join(lines), tail=lines[-20:]) from None
        except KeyboardInterrupt:
            code = 130
            _stop_child(process)
            raise Interrupted("interrupted") from None
        finally:
            calllog.record([self._resolve(), *args], time.monotonic() - started, code, echo=self.debug)

    def _error(self, args: list[str], code: int, stderr: str, tail: list[str] | None = None) -> LimaError:
        messages = meaningful_lines(stderr)
        if "must not run as the root user" in stderr:
            return LimaError(
                "limactl refuses to run as root, so agentbox cannot manage VMs from this account.",
                hint="Run agentbox as your normal user (not with sudo or as root).",
                stderr_lines=messages,
            )
        summary = messages[-1] if messages else f"exit code {code}"
        return LimaError(
            f"`limactl {' '.join(args)}` failed (exit {code}): {summary}", stderr_lines=messages, tail=tail
        )


    # -- on-demand port forwards (ssh) -------------------------------------------------------------
    def forward_port(self, instance: Instance, guest_port: int, host_port: int, log: Path) -> int:
        """Forward 127.0.0.1:host_port to the guest's 127.0.0.1:guest_port; return the ssh process's pid.

        The ssh runs detached (its own session, output to `log`) and is waited for until it listens,
        or fails: a taken host port is fatal to it (ExitOnForwardFailure).
        """
        ssh = hosttools.which("ssh")
        if ssh is None:
            raise LimaError("ssh was not found on PATH, so agentbox cannot forward a port",
                            hint="Install OpenSSH's client (Lima needs it too).")
        argv = [ssh, "-F", os.path.join(instance.dir, "ssh.config"), "-N", "-o", "ExitOnForwardFailure=yes",
                "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "LogLevel=ERROR",
                "-L", forward_spec(guest_port, host_port), instance.ssh_host]
        started = time.monotonic()
        with open(log, "wb") as output:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                       start_new_session=True, env=hosttools.environ())
        deadline = started + FORWARD_TIMEOUT
        while True:
            code = process.poll()
            if code is not None:
                calllog.record(argv, time.monotonic() - started, code, echo=self.debug)
                lines = [line for line in _tail(log) if line.strip()]
                raise LimaError(
                    f"ssh could not forward 127.0.0.1:{host_port} to port {guest_port} of {instance.name} "
                    f"(exit {code}){': ' + lines[-1] if lines else ''}",
                    stderr_lines=lines,
                )
            if host_port_in_use(host_port):
                calllog.record(argv, time.monotonic() - started, 0, echo=self.debug)
                return process.pid
            if time.monotonic() > deadline:
                process.terminate()
                raise LimaError(f"ssh did not set up the forward of 127.0.0.1:{host_port} within "
                                f"{FORWARD_TIMEOUT} s; its output is in {log}")
            time.sleep(0.05)


FORWARD_TIMEOUT = 20


def is_running(vm_name: str) -> bool:
    """Whether Lima says the instance `vm_name` is Running (one `limactl list --json`): False when it is stopped,
    broken, deleted or was never a local instance (a remote task's mirror). LimaError when limactl cannot say."""
    instance = Lima().get(vm_name)
    return instance is not None and instance.status == RUNNING


def forward_spec(guest_port: int, host_port: int) -> str:
    return f"127.0.0.1:{host_port}:127.0.0.1:{guest_port}"


def port_forward_alive(pid: int, guest_port: int, host_port: int) -> bool:
    """Is pid still the ssh that forward_port started for this forward (not a reused pid)?"""
    spec = forward_spec(guest_port, host_port)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return spec.encode() in handle.read().split(b"\0")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
    except OSError:
        return False

    ps = hosttools.which("ps")
    if ps is None:
        return False
    try:  # macOS has no /proc
        result = subprocess.run([ps, "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and spec in result.stdout.split()


def stop_port_forward(pid: int, guest_port: int, host_port: int) -> bool:
    """End the ssh of an on-demand forward; False when it had already ended."""
    if not port_forward_alive(pid, guest_port, host_port):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def host_port_in_use(port: int, ip: str = "127.0.0.1") -> bool:
    """Something listens on ip:port (binding it fails with EADDRINUSE)."""
    # deferred: start-up (socket, ~4 ms: only a port check needs it, never the warm launch)
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ip, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _tail(path: Path, limit: int = 8192) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - limit))
            return [visible(line) for line in handle.read().decode(errors="replace").splitlines()]
    except OSError:
        return []


# -- what the host agent forwards (read from the instance folder) ------------------------------

LOG_READ_LIMIT = 4 << 20
_FORWARDING = lazyre.compile(r"^Forwarding TCP from (\S+) to (\S+)$")
_LISTEN_FAILED = lazyre.compile(r"^failed to listen tcp: (\S+)$")
_NOT_FORWARDING = lazyre.compile(r"^Not forwarding TCP (\S+)$")
_ADDRESS = lazyre.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[0-9.]+):[0-9]{1,5}$")  # Go's net.JoinHostPort of an IP


def port_forwards(instance_dir: str) -> list[PortForward]:
    """The guest TCP listeners Lima's host agent forwards now, from its logs in the instance folder.

    ha.stdout.log's `portForward` events say what was forwarded and stopped; ha.stderr.log says which
    attempt failed: its `Forwarding TCP from G to H` lines come in the same order as the events, each
    followed by `failed to listen tcp: H` when H was taken (or `Not forwarding TCP H` for a privileged
    port). Both files are recreated at every start. Read with a size cap, without following links.
    """
    outcomes: dict[str, list[str]] = {}  # host address -> per attempt: "" (listening) or the error
    last: dict[str, int] = {}
    for entry in _json_lines(os.path.join(instance_dir, "ha.stderr.log"), '"msg"'):
        message = str(entry.get("msg", ""))
        match = _FORWARDING.match(message)
        if match:
            outcomes.setdefault(match.group(2), []).append("")
            last[match.group(2)] = len(outcomes[match.group(2)]) - 1
            continue
        match = _LISTEN_FAILED.match(message) or _NOT_FORWARDING.match(message)
        if match and match.group(1) in last:
            host = match.group(1)
            reason = str(entry.get("error", "")) or "Lima did not forward it (a privileged port)"
            if outcomes[host][last[host]] == "":
                outcomes[host][last[host]] = reason
    active: dict[tuple[str, str], PortForward] = {}
    seen: dict[str, int] = {}
    for entry in _json_lines(os.path.join(instance_dir, "ha.stdout.log"), '"portForward"'):
        event = (entry.get("status") or {}).get("portForward") or {}
        kind, guest, host = event.get("type"), str(event.get("guestAddr", "")), str(event.get("hostAddr", ""))
        if event.get("protocol", "tcp") != "tcp" or not (_ADDRESS.match(guest) and _ADDRESS.match(host)):
            continue
        if kind == "forwarding":
            attempt = seen.get(host, 0)
            seen[host] = attempt + 1
            tries = outcomes.get(host, [])
            error = tries[attempt] if attempt < len(tries) else ""
            active[(guest, host)] = PortForward(guest, host, not error, error)
        elif kind == "stopping":
            active.pop((guest, host), None)
    return list(active.values())


def _json_lines(path: str, marker: str) -> Iterator[dict[str, Any]]:
    """JSON objects of the lines that contain marker, from the last LOG_READ_LIMIT bytes of a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        if size > LOG_READ_LIMIT:
            handle.seek(size - LOG_READ_LIMIT)
            handle.readline()  # a partial line
        data = handle.read(LOG_READ_LIMIT)
    needle = marker.encode()
    for raw in data.splitlines():
        if needle not in raw:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            yield entry


def meaningful_lines(stderr: str) -> list[str]:
    """Lima's messages without logrus noise: `time=... level=fatal msg="x"` becomes `x`.

    Debug and trace lines are left out. Messages can carry text from the guest (a probe's output),
    so control characters come back escaped (safetext.visible).
    """
    result = []
    for raw in stderr.splitlines():
        if not raw.strip():
            continue
        entry = parse_log_line(raw)
        if entry.level in ("debug", "trace"):
            continue
        result.append(visible(entry.message))
    return result


@contextmanager
def _sigint_held() -> Iterator[list[int]]:
    """SIGINT is only noted (in the yielded list) until the block has ended: a Ctrl-C while a child
    is being started would otherwise come before its handle is assigned, leaving a running limactl
    that nothing stops. The caller raises KeyboardInterrupt afterwards if one came."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield held
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop_child(process: Any) -> None:
    """Make sure no limactl child outlives agentbox after Ctrl-C."""
    if process is None:
        return
    try:
        process.process.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while process.process.is_alive()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.process.is_alive()[0]:
            process.process.kill()
        process.process.wait()
    except Exception:
        pass


def _restore_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)

