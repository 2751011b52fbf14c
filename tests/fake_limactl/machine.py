"""The running guest: one long-lived sandbox per boot that every guest process joins, as in a VM.

A VM keeps running what was started in it after the `limactl shell` that started it ends (tmux
servers, nohup'd jobs, daemons of provisioning scripts), and all of it dies when the VM stops.
So a boot gets one guest sandbox (bubblewrap with its own pid, mount and uts namespaces) whose
pid 1 is held by a host-side "machine agent", `limactl __machine NAME IID` (the double's own
sub-command, not logged as a call). Every guest process (a `shell` command, a boot script, a
probe, a sudo request) enters that sandbox's namespaces (setns, as nsenter does), so all of them see the
same processes (`ps`, `kill`), mounts, /tmp and /run; what a command leaves running (`nohup
CMD &`, `setsid`, a tmux server) is re-parented to the guest's pid 1 and outlives its shell.

Lifetime. `start` launches the agent after the instant part of the boot (before the boot
scripts); a `shell` of an instance that is Running without one (a state written by hand) launches it
too. An agent that died (the double's QEMU killed) is a crash: the instance then reads as Stopped (crashed()). `stop`, `stop -f`, `delete` and the next `start` kill the guest's
pid 1, and the kernel kills everything else in its pid namespace before they return. The agent
also ends the guest when the instance's state no longer names this boot as Running or its folder
is gone (a test's LIMA_HOME removed), and the sandbox dies with the agent (--die-with-parent).

The agent also serves the guest's sudo for the whole boot (a socket at
/run/fake-limactl/sudo.sock, guest.SudoBridge): sudo works from a process that outlived its shell.

Each process entering the guest is started by a proxy (spawn()) that joins the sandbox's user, mount,
uts and pid namespaces and its root (as nsenter would), then runs `setpriv --pdeathsig KILL
[--reuid/--regid of the user] -- env -C DIR -- ARGV` as its child and exits with its status (128+N
for a signal): the command dies with the limactl process that runs it (as ssh's session would
end), while what it detached survives. With the id mapping of a root-run double
(guest.Ids.separated) the proxy's child becomes guest root in the sandbox's user namespace and
setpriv drops to the guest user. Run as an ordinary user, the
sandbox's user namespace maps guest root alone (to that user; bwrap's `--uid` would put its pid 1
in a nested namespace that nsenter cannot use), so the guest user's processes run in a nested
user namespace (`unshare --map-user=UID`) inside the guest: same processes, mounts and files.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import guest
from constants import MACHINE_SUBCOMMAND, own_process
from context import Ctx, lima_lock, read_state, write_state
from instances import Instance, inspect

LOCK_FILE = ".fake-machine.lock"  # not *.lock-like names that `stop -f` removes (*.pid, *.sock, *.tmp)
SUDO_SOCKET = "sudo.sock"          # in /run/fake-limactl
POLL_SECONDS = 0.3
READY_TIMEOUT = 30.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Machine:
    agent: int    # host pid of `limactl __machine`
    init: int     # host pid of the sandbox's pid 1
    pidns: str    # readlink of /proc/INIT/ns/pid when it started (guards against pid reuse)
    iid: str

    @property
    def sudo_path(self) -> str:
        return f"/{guest.RUN_TOOLS}/{SUDO_SOCKET}"


def _ns_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _from_state(state: dict[str, Any]) -> Machine | None:
    m = state.get("machine") or {}
    try:
        return Machine(int(m["agent"]), int(m["init"]), str(m["pidns"]), str(m["iid"]))
    except (KeyError, TypeError, ValueError):
        return None


def crashed(state: dict[str, Any]) -> bool:
    """Whether this boot's guest was started and is gone without a stop (its agent, the double's QEMU, was killed):
    Lima's host agent then exits (pkg/hostagent/hostagent.go startRoutinesAndWait, "Driver stopped due to error")
    and both pid files read as dead, so the instance is Stopped (pkg/store/instance.go inspectStatusWithPIDFiles)."""
    m = _from_state(state)
    return state.get("status") == "Running" and m is not None and m.iid == state.get("iid") and not powered_on(m)


def running(inst: Any) -> Machine | None:
    """This boot's guest, when it is alive (the state file is read afresh)."""
    state = read_state(inst.dir)
    m = _from_state(state)
    if m is None or state.get("status") != "Running" or m.iid != state.get("iid"):
        return None
    return m if powered_on(m) else None


_PF_EXITING = 0x4


def powered_on(m: Machine) -> bool:
    """Whether this boot's guest still runs: its pid 1 is the same process (not a reused pid) and is not
    ending. The kernel kills the rest of the pid namespace while pid 1 exits, before it is reaped, so a
    guest process that died with the guest may be seen while pid 1 still reads as alive but exiting."""
    if _ns_of(m.init) != m.pidns:
        return False
    try:
        with open(f"/proc/{m.init}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
        return fields[0] not in ("Z", "X", "x") and not int(fields[6]) & _PF_EXITING
    except (OSError, IndexError, ValueError):
        return False


@contextlib.contextmanager
def _instance_lock(inst_dir: str) -> Any:
    fd = os.open(os.path.join(inst_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure(inst: Any) -> Machine | None:
    """This boot's guest, launched when the instance is Running without one; None without bwrap."""
    if guest.bwrap_path() is None or shutil.which("setpriv") is None:
        return None
    m = running(inst)
    if m is not None:
        return m
    with _instance_lock(inst.dir):
        m = running(inst)
        if m is not None:
            return m
        state = read_state(inst.dir)
        if state.get("status") != "Running" or not state.get("iid"):
            return None
        ready_r, ready_w = os.pipe()
        argv, env = own_process(MACHINE_SUBCOMMAND, inst.name, state["iid"], str(ready_w))
        agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True, pass_fds=(ready_w,), env=env)
        os.close(ready_w)
        try:
            answer = _read_all(ready_r, READY_TIMEOUT, lambda data: data.endswith(b"\n"))
        finally:
            os.close(ready_r)
        m = running(inst)
        if m is None:
            with contextlib.suppress(OSError):
                agent.kill()
            raise RuntimeError(f"fake limactl: the guest of `{inst.name}` did not start: "
                               f"{answer.decode(errors='replace').strip() or 'no answer'}")
        return m


def _read_all(fd: int, timeout: float, enough: Callable[[bytes], bool] = lambda _: False) -> bytes:
    """What fd gives until EOF, the timeout, or enough(data) (bwrap keeps the write ends open)."""
    data, deadline = b"", time.monotonic() + timeout
    while not enough(data):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return data
        chunk = os.read(fd, 4096)
        if not chunk:
            return data
        data += chunk
    return data


def _json_complete(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def stop(state: dict[str, Any]) -> None:
    """Power off: kill the guest's pid 1 (the kernel kills the rest of its pid namespace first) and its
    agent. Returns once the guest's processes are gone."""
    m = _from_state(state)
    state.pop("machine", None)
    if m is None:
        return
    if _ns_of(m.init) == m.pidns:
        with contextlib.suppress(OSError):
            os.kill(m.init, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _ns_of(m.init) == m.pidns and time.monotonic() < deadline:
            time.sleep(0.01)
    if _is_agent(m):
        with contextlib.suppress(OSError):
            os.kill(m.agent, signal.SIGKILL)


def _is_agent(m: Machine) -> bool:
    try:
        with open(f"/proc/{m.agent}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return MACHINE_SUBCOMMAND.encode() in argv and m.iid.encode() in argv


_libc = ctypes.CDLL(None, use_errno=True)
# setns order: the user namespace first (it gives the capabilities for the others), the pid one last.
_NAMESPACES = (("user", 0x10000000), ("mnt", 0x00020000), ("uts", 0x04000000), ("pid", 0x20000000))


def enter_argv(inst: Any, m: Machine, argv: list[str], *, as_root: bool, chdir: str | None) -> list[str]:
    """What runs once inside the guest: setpriv (the guest user's ids, death with its proxy), env -C (the
    folder, looked up inside the guest), argv."""
    ids = guest.ids_of(inst.config)
    wd = chdir or ("/root" if as_root else inst.config["user"]["home"])
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("fake limactl: setpriv (util-linux) is needed to enter the guest")
    cmd = [setpriv, "--pdeathsig", "KILL"]
    if ids.separated and not as_root:
        cmd += [f"--reuid={ids.uid}", f"--regid={ids.gid}", "--init-groups"]
    cmd.append("--")
    if not ids.separated and not as_root:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise RuntimeError("fake limactl: unshare (util-linux) is needed for the guest user")
        cmd += [unshare, f"--map-user={ids.uid}", f"--map-group={ids.gid}", "--"]
    return cmd + ["/usr/bin/env", "-C", wd, "--", *argv]


def spawn(inst: Any, m: Machine, argv: list[str], *, as_root: bool, env: dict[str, str],
          chdir: str | None = None, stdio: tuple[int, int, int] | None = None, new_session: bool = False,
          signal_status: int | None = None) -> int:
    """Start argv inside the running guest; return the host pid to wait() for.

    The pid is a proxy (what ssh and sshd are to a VM's command): it enters the guest's namespaces, starts
    the command there and exits with its status (when a signal N ended it: signal_status, else 128+N). It dies with this limactl
    process and the command with it; TERM and HUP it passes on; SIGINT and SIGQUIT it ignores, so that a
    Ctrl-C (or `kill -INT 0`) reaches the command, which shares its process group, and not the proxy."""
    cmd = enter_argv(inst, m, argv, as_root=as_root, chdir=chdir)
    separated = guest.ids_of(inst.config).separated
    fds = [os.open(f"/proc/{m.init}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name, _ in _NAMESPACES]
    root = os.open(f"/proc/{m.init}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            _proxy(fds, root, cmd, env, stdio, new_session, separated, signal_status)
        except BaseException as e:
            with contextlib.suppress(Exception):
                os.write(2, f"fake limactl: cannot enter the guest: {e}\n".encode())
        os._exit(127)
    for fd in (*fds, root):
        os.close(fd)
    return pid


def _proxy(fds: list[int], root: int, cmd: list[str], env: dict[str, str], stdio: tuple[int, int, int] | None,
           new_session: bool, separated: bool, signal_status: int | None) -> None:
    """The forked child: into the guest, then the command as its own child, waited for."""
    if stdio:
        for target, fd in enumerate(stdio):
            if fd != target:
                os.dup2(fd, target)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    if new_session:
        os.setsid()
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for fd, (name, flag) in zip(fds, _NAMESPACES, strict=True):
        if _libc.setns(fd, flag) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
    os.fchdir(root)
    os.chroot(".")
    os.chdir("/")
    child = os.fork()
    if child == 0:
        try:
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if separated:  # guest root first; setpriv then becomes the guest user when asked
                os.setgroups([])
                os.setresgid(0, 0, 0)
                os.setresuid(0, 0, 0)
            os.execve(cmd[0], cmd, env)
        except BaseException as e:
            with contextlib.suppress(Exception):
                os.write(2, f"fake limactl: cannot start {cmd[-1]!r} in the guest: {e}\n".encode())
        os._exit(127)

    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        os._exit(128 - code if signal_status is None else signal_status)
    os._exit(code)


# --------------------------------------------------------------------------------------------
# The agent: `limactl __machine NAME IID READY_FD`
# --------------------------------------------------------------------------------------------

def machine_process(ctx: Ctx, args: list[str]) -> int:
    name, iid, ready = args[0], args[1], int(args[2])
    try:
        inst = inspect(ctx, name)
        if inst.state.get("iid") != iid or inst.config is None:
            os.write(ready, b"the instance is no longer in this boot\n")
            return 1
        outer, init = _start_sandbox(inst)
    except Exception as e:  # reported to the waiting `ensure`
        with contextlib.suppress(OSError):
            os.write(ready, f"{e}\n".encode())
        return 1
    m = Machine(os.getpid(), init, _ns_of(init), iid)
    with lima_lock(ctx.lima_home):
        state = read_state(inst.dir)
        current = state.get("status") == "Running" and state.get("iid") == iid and bool(m.pidns)
        if current:
            state["machine"] = {"agent": m.agent, "init": m.init, "pidns": m.pidns, "iid": iid}
            write_state(inst.dir, state)
    if not current:
        _kill(m, outer)
        os.write(ready, b"the instance stopped while its guest started\n")
        return 1
    bridge = guest.SudoBridge(inst, name=SUDO_SOCKET).__enter__()
    os.write(ready, b"ok\n")
    os.close(ready)
    try:
        while _still_wanted(inst, m, outer):
            time.sleep(POLL_SECONDS)
    finally:
        bridge.__exit__(None, None, None)
        _kill(m, outer)
    return 0


def _start_sandbox(inst: Instance) -> tuple[int, int]:
    """The guest sandbox, its pid 1 a process that waits forever; returns (bwrap's pid, pid 1's)."""
    bwrap = guest.bwrap_path()
    assert bwrap is not None
    guest.ensure_guestfs(inst)
    info_r, info_w = os.pipe()
    up_r, up_w = os.pipe()
    # The command says it runs (so every mount is in place), then waits forever as guest root.
    init = ["/bin/sh", "-c", f'echo up >&{up_w}; exec {up_w}>&-; exec sleep infinity']
    cmd = guest.sandbox_argv(bwrap, inst, init, as_root=True, pid_namespace=True,
                             extra=["--info-fd", str(info_w)])
    null = os.open(os.devnull, os.O_RDWR)
    outer = guest.spawn_sandbox(inst, cmd, env={"PATH": guest.ROOT_PATH}, stdio=(null, null, null),
                                pass_fds=(info_w, up_w))
    os.close(null)
    os.close(info_w)
    os.close(up_w)
    info = _read_all(info_r, READY_TIMEOUT, _json_complete)
    up = _read_all(up_r, READY_TIMEOUT, lambda data: data.endswith(b"\n"))
    os.close(info_r)
    os.close(up_r)
    try:
        init_pid = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError):
        raise RuntimeError(f"fake limactl: bwrap gave no child pid ({info!r})")
    if up.strip() != b"up":
        raise RuntimeError("fake limactl: the guest sandbox did not come up")
    return outer, init_pid


def _still_wanted(inst: Instance, m: Machine, outer: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(outer, os.WNOHANG)[0] == outer:
            return False
    if not os.path.isdir(inst.dir):
        return False
    state = read_state(inst.dir)
    return state.get("status") == "Running" and state.get("iid") == m.iid and \
        (state.get("machine") or {}).get("init") == m.init


def _kill(m: Machine, outer: int) -> None:
    if m.pidns and _ns_of(m.init) == m.pidns:
        with contextlib.suppress(OSError):
            os.kill(m.init, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(outer, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(outer, 0)
