"""The VM's egress proxy on the host (network.mode allowlist | offline): there while a session needs it, no longer.

The first launch, task or shell of a VM whose mode needs the proxy starts it as a small background process
(`python -m agentbox.net.guard VM`, agentbox.net.proxy serving on 127.0.0.1). The launch itself binds the port and
takes the proxy's lock, and hands both to the process: the port is known, and the VM's connections wait in its
backlog, from the moment it is spawned, so nothing waits for the process to start. Each agentbox process whose session
needs it holds a lease (a flock'ed file) for as long as it runs, and a kept session or a background task keeps
its live marker in the outbox fresh (provision/session.sh, task-runner.sh; agentbox.session.attention reads the same
markers). When the last lease is released and no marker is fresh, the proxy stops (at once when a launch ends;
within a second otherwise): the VM reaching its port after that is refused. With the credential broker it stays
until its VM is no longer running (below). It also ends when the VM's state folder is gone. No daemon stays behind:
after a reboot proxy.json may remain, but nothing holds proxy.lock, so `running()` says none runs and the next
launch starts one.

Files in the VM's state folder, `network/`:
  broker.json   what the credential broker serves (agentbox.credentials.broker.process; 0600, real API keys in it);
                while it exists the proxy stays between sessions, in every network mode, for as long as its VM
                runs: it asks Lima (seldom, only while no session holds it) and ends once the VM stopped or is
                gone, however that happened; `agentbox stop` ends it at once
  policy.json   what the proxy allows (written by each launch: the mode, the patterns with their sources, the
                agents launched since the proxy started, allowLan, uploadLimit); the proxy reloads it when it
                changes
  window        when the current upload window began (agentbox.net.uploads): written when a session starts while
                no other holds the proxy, by a full launch and a launch from its plan alike; never a plan's input
  upstream.json the company proxy the proxy goes on through and the CA files it trusts besides the system's
                (agentbox.net.upstream; 0600: a proxy password may be in it); reloaded when it changes
  secret        the VM's proxy secret (0600): every request to the proxy carries it (`Proxy-Authorization: Basic`,
                user agentbox; the VM's proxy URL holds it, agentbox.net.policy.ProxyAccess); made once, the first
                time the VM needs its proxy, kept for the VM's life (sessions and tasks have it in their
                environment), gone with its state; the proxy reads it again when it changes
  proxy.json    the running proxy's pid and port (written by the launch that starts it, removed when it stops);
                proxy.lock is flock'ed by it (taken by that launch and handed to it)
  port          the port it last had, asked for first next time (another is picked when it is taken)
  leases/       one file per agentbox process whose session uses the proxy
  log.jsonl     every decision, one JSON line each (agentbox.net.proxy)
  caps.jsonl    each host that reached network.uploadLimit, once per upload window (what a session's end says)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from agentbox import fsutil, lazyre, livemarkers, paths, progress
from agentbox.errors import StateError
from agentbox.fsutil import atomic_write, locked, private_dir, write_if_changed
from agentbox.net import policy as netpolicy
from agentbox.net import uploads, upstream
from agentbox.net.broker import Brokering

POLL_SEC = 0.25
TEST_POLL = "AGENTBOX_TEST_PROXY_POLL_SEC"  # tests only: a slower serving loop, to show what waits for no poll
START_TIMEOUT_SEC = 10.0
STOP_TIMEOUT_SEC = 5.0
RELOAD_TIMEOUT_SEC = 5.0  # a running proxy takes changed settings within this, or a launch starts a new one
IDLE_GRACE_SEC = 1.0  # between a detached launch's end and its session's first marker
VM_CHECK_SEC = 3.0  # a brokered proxy no session holds asks whether its VM runs this long after the last one ...
VM_CHECK_MAX_SEC = 30.0  # ... then twice as long each time, up to this
SECRET_FILE = "secret"  # the VM's proxy secret (0600): the password of the proxy credentials in its proxy URL
SECRET_BYTES = 16
BROKER_FILE = "broker.json"  # the credential broker's request (0600: it may hold API keys)
WINDOW_FILE = uploads.WINDOW_FILE  # when the current upload window began
UPSTREAM_FILE = "upstream.json"  # the company proxy to go through (0600: its URL may hold a password)
LOADED_FILE = "loaded.json"  # what the running proxy serves by: its pid and each settings file's mtime it read
SETTINGS_FILES = ("policy.json", UPSTREAM_FILE, BROKER_FILE)  # a launch waits until the running proxy read these
_SECRET = lazyre.compile(f"[0-9a-f]{{{SECRET_BYTES * 2}}}")
LOG_KEEP_BYTES = 10 << 20  # a longer log becomes log.jsonl.1 (the one before goes) when a proxy starts


def folder(vm_name: str) -> Path:
    return paths.vm_network_dir(vm_name)


def log_path(vm_name: str) -> Path:
    return folder(vm_name) / uploads.LOG_FILE


def secret(vm_name: str) -> str:
    """The VM's proxy secret, made (random, 0600) the first time it is asked for and the same for the VM's life.
    StateError when the file is there but is not one."""
    path = folder(vm_name) / SECRET_FILE
    found = _read_secret(path)
    if found is None:

        private_dir(path.parent)
        with contextlib.suppress(FileExistsError):  # another launch made it first: its secret is the VM's
            atomic_write(path, secrets.token_hex(SECRET_BYTES) + "\n", mode=0o600, overwrite=False)
        found = _read_secret(path)
    if found is None or not _SECRET.fullmatch(found):

        raise StateError(f"{path} is not agentbox's proxy secret for {vm_name} ({SECRET_BYTES * 2} hex digits)",
                         hint="Remove it: the VM's next session makes a new one (sessions and tasks already "
                              "running in the VM keep the old one and are refused by the proxy: `agentbox restart`).")
    return found


def _read_secret(path: Path) -> str | None:
    """The secret file's text (stripped), None when there is none; the file is agentbox's own, never followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


class Running(NamedTuple):
    pid: int
    port: int
    started: float
    brokers: bool = False  # started as the broker's process (agentbox.credentials.broker.process)


def running(vm_name: str) -> Running | None:
    """The VM's proxy when one runs (its lock is held), else None."""
    base = folder(vm_name)
    try:
        info = json.loads((base / "proxy.json").read_text())
        found = Running(int(info["pid"]), int(info["port"]), float(info["started"]), bool(info.get("brokers")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if fsutil.held(base / "proxy.lock") else None


def policy(vm_name: str) -> dict[str, Any] | None:
    try:
        data = json.loads((folder(vm_name) / "policy.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe(settings: netpolicy.NetworkSettings, vm_name: str,
             agents: Mapping[str, tuple[str, ...]], vm_type: str | None = None) -> dict[str, Any]:
    """The VM's network policy as `agentbox net status --json` and `status --json` report it."""
    # deferred: start-up (net.hold: status reads it; a launch from its plan leases the proxy through this module)
    from agentbox.net import hold

    enforcement, why = hold.enforcement(vm_name, settings, vm_type)
    current = running(vm_name)
    launched = (policy(vm_name) or {}).get("agents", {}) if current is not None else {}
    shown_agents = {name: tuple(hosts) for name, hosts in launched.items()} or dict(agents)
    return {
        "mode": settings.mode,
        "enforcement": enforcement,
        "enforcementWhy": why,
        "allowHost": settings.allow_host if isinstance(settings.allow_host, bool) else list(settings.allow_host),
        "allowLan": settings.allow_lan,
        "agentApi": settings.agent_api,
        "allow": [{"host": host, "from": source} for host, source in netpolicy.allow_list(settings, shown_agents)],
        "proxy": ({"running": True, "port": current.port, "pid": current.pid,
                   "url": netpolicy.shown_url(current.port)} if current is not None
                  else {"running": False, "port": None, "pid": None, "url": None}),
        "log": str(log_path(vm_name)),
    }


def refresh_policy(settings: netpolicy.NetworkSettings, vm_name: str) -> bool:
    """Give a running proxy the settings now in the config (`agentbox net allow`); False when none runs."""
    with locked(_control_lock(vm_name)):
        current = running(vm_name)
        if current is None:
            return False
        agents = {name: tuple(hosts) for name, hosts in (policy(vm_name) or {}).get("agents", {}).items()}
        written_before = _settings_mtimes(folder(vm_name))
        _write_policy(vm_name, settings, agents)
        if not _running_takes_settings(vm_name, current.pid, written_before):
            progress.warn(f"the network proxy of {vm_name} has not taken the change yet; it reads its settings "
                          f"again every {POLL_SEC:g} s")
        return True


class Lease:
    """One agentbox process's claim on the VM's proxy; `release()` (or the process's end) gives it up.

    `port` is known at once: a proxy this lease started listens from begin() on (its process starts while Lima is
    asked, and the VM's first connections wait in the port's backlog until it serves)."""

    def __init__(self, vm_name: str, fd: int, path: Path, child: subprocess.Popen[bytes] | None,
                 port: int = 0, program: str = __name__, brokers: bool = False) -> None:
        self.vm_name = vm_name
        self._program = program
        self._brokers = brokers
        self._port = port
        self._child = child
        self._fd: int | None = fd
        self._path = path
        self._started = time.time()

    @property
    def port(self) -> int:
        if not self._port:
            self._port = _await(self.vm_name, self._child).port
        elif self._child is not None and self._child.poll() is not None and running(self.vm_name) is None:
            _not_started(self.vm_name)  # it ended before it served (its messages say why)
        return self._port

    @property
    def brokers(self) -> bool:
        return self._brokers

    @property
    def program(self) -> str:
        return self._program

    @property
    def access(self) -> netpolicy.ProxyAccess:
        """How the VM reaches this proxy: its port and the VM's proxy secret (for the VM's proxy variables)."""
        return netpolicy.ProxyAccess(self.port, secret(self.vm_name))

    def resume(self) -> None:
        """Start the VM's proxy again when it is gone: the VM was restarted under this lease (`agentbox stop`'s
        part of a restart ends the proxy with it)."""
        with locked(_control_lock(self.vm_name)):
            current = running(self.vm_name)
            if current is not None:
                self._port, self._child = current.port, None
                return
            self._child, self._port = _start(self.vm_name, self._program, self._brokers)

    def release(self) -> None:
        if self._fd is None:
            return
        with locked(_control_lock(self.vm_name)):
            with contextlib.suppress(OSError):
                self._path.unlink()
            os.close(self._fd)
            self._fd = None
            self._child = None  # its end is no longer this lease's failure: `port` stays what it was
            if not _in_use(self.vm_name):
                stop(self.vm_name, locked_already=True)
        for capped in uploads.capped_since(folder(self.vm_name), self._started):  # the session's one notice
            progress.warn(uploads.notice(capped))


def begin(settings: netpolicy.NetworkSettings, vm_name: str, agents: dict[str, tuple[str, ...]],
          broker: Mapping[str, Any] | None = None, program: str = __name__,
          upstream: Mapping[str, Any] | None = None) -> Lease | None:
    """Make sure the VM's proxy runs with the policy for `agents` (name: endpoints) and lease it; None in open mode
    without a broker.

    `broker`: what the credential broker must serve (agentbox.credentials.broker.brokered.Request's JSON, real API keys
    included), written 0600 for the proxy process, which `program` (`python -m program VM`) must be able to read;
    a brokered VM's proxy stays up until `stop()`, whatever the mode. `upstream`: the company proxy and CA files
    (agentbox.net.upstream.settings), written 0600 too; a running proxy reads it again when it changes."""
    if not settings.proxied and broker is None:
        return None
    base = folder(vm_name)
    private_dir(base)
    private_dir(base / "leases")
    secret(vm_name)  # before the proxy process starts: it serves no one without it
    with locked(_control_lock(vm_name)):
        current = running(vm_name)
        if current is not None and broker is not None and not current.brokers:
            # started before credentials.broker was turned on: the broker's process takes over (its tunnels end)
            stop(vm_name, locked_already=True)
            current = None
        launched = dict(agents)
        if current is not None:
            for name, hosts in (policy(vm_name) or {}).get("agents", {}).items():
                launched.setdefault(name, tuple(hosts))
        _begin_window(vm_name, current is not None)
        with _unrecorded():
            written_before = _settings_mtimes(base)
        _write_policy(vm_name, settings, launched)
        if broker is not None:
            write_if_changed(base / BROKER_FILE, (json.dumps(broker, sort_keys=True, indent=1) + "\n").encode())
        else:
            with contextlib.suppress(FileNotFoundError):
                (base / BROKER_FILE).unlink()
        _write_private(base / UPSTREAM_FILE, upstream)
        if current is not None and not _running_takes_settings(vm_name, current.pid, written_before):
            progress.warn(f"the network proxy of {vm_name} did not take the changed network settings within "
                          f"{RELOAD_TIMEOUT_SEC:g} s; starting a new one (connections through the old one end)")
            stop(vm_name, locked_already=True)
            current = None
        fd, lease_path = _held_lease(base)
        try:
            child, port = _start(vm_name, program, broker is not None) if current is None else (None, current.port)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                lease_path.unlink()
            raise
    return Lease(vm_name, fd, lease_path, child, port, program, broker is not None)


def lease_running(vm_name: str, port: int, brokers: bool, program: str) -> Lease | None:
    """A lease on the VM's proxy as a verified plan found it (agentbox.session.planned): running, on `port`, with
    the broker or without it as then; None otherwise (the full launch starts or reconfigures it)."""
    base = folder(vm_name)
    with locked(_control_lock(vm_name)):
        current = running(vm_name)
        if current is None or current.port != port or current.brokers != brokers:
            return None
        _begin_window(vm_name, True)
        fd, lease_path = _held_lease(base)
    return Lease(vm_name, fd, lease_path, None, port, program, brokers)


def _held_lease(base: Path) -> tuple[int, Path]:
    """A new lease file of this process, held (its lock is what says the holder still runs)."""
    lease_path = base / "leases" / f"{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(lease_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, lease_path


def stop(vm_name: str, locked_already: bool = False) -> bool:
    """Stop the VM's proxy if one runs (`agentbox stop`, the last session's end); True when one was stopped."""
    if not locked_already:
        with locked(_control_lock(vm_name)):
            return stop(vm_name, locked_already=True)
    current = running(vm_name)
    if current is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(current.pid, signal.SIGTERM)
    _await_unlock(folder(vm_name) / "proxy.lock", STOP_TIMEOUT_SEC)
    return True


def _await_unlock(lock: Path, timeout: float) -> None:
    """Return once no process holds `lock` (the proxy lets it go after its port is closed), or after `timeout`:
    a blocking flock, woken by the release itself (no polling)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return

    def wait() -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_SH)
        os.close(fd)

    waiter = threading.Thread(target=wait, name="agentbox-proxy-stop", daemon=True)
    waiter.start()
    waiter.join(timeout)  # a proxy that does not end in time is left to end on its own


def _write_private(path: Path, data: Mapping[str, Any] | None) -> None:
    """A 0600 JSON file in the network folder (changed only when its content does), or none."""
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    write_if_changed(path, (json.dumps(data, sort_keys=True, indent=1) + "\n").encode())


def _control_lock(vm_name: str) -> Path:
    private_dir(folder(vm_name))
    return folder(vm_name) / "control.lock"


def _write_policy(vm_name: str, settings: netpolicy.NetworkSettings, agents: dict[str, tuple[str, ...]]) -> None:
    entries = netpolicy.allow_list(settings, agents)
    data = {"mode": settings.mode, "allow": [[host, source] for host, source in entries],
            "allowLan": settings.allow_lan, "agents": {name: list(hosts) for name, hosts in agents.items()},
            "uploadLimit": settings.upload_limit}
    write_if_changed(folder(vm_name) / "policy.json", (json.dumps(data, indent=1) + "\n").encode())


def _begin_window(vm_name: str, proxy_runs: bool) -> None:
    """A session that starts while no other holds the proxy begins a new upload window (agentbox.net.uploads).
    Not an input of the launch's plan: a launch from its plan decides it again (lease_running)."""
    with _unrecorded():
        if not proxy_runs or not _claimed(vm_name):
            atomic_write(folder(vm_name) / WINDOW_FILE, _new_window() + "\n", mode=0o600, durable=False)


def _unrecorded() -> contextlib.AbstractContextManager[None]:
    """What a launch does about the running proxy is no input of its plan (the proxy's own files change under it)."""
    # A launch being recorded has its recorder loaded; a launch from its plan (or any other caller) has none.
    recorder = sys.modules.get("agentbox.session.planrecorder")
    return recorder.unrecorded() if recorder is not None else contextlib.nullcontext()


def _settings_mtimes(base: Path) -> dict[str, int]:
    return {name: _mtime(base / name) for name in SETTINGS_FILES}


def _running_takes_settings(vm_name: str, pid: int, written_before: dict[str, int]) -> bool:
    """After a launch changed the settings files, wait until the running proxy has read them (its LOADED_FILE names
    their mtimes), waking it rather than waiting for its next poll: the session must never start under the settings
    before (a policy it tightened, a company proxy it dropped). False when it did not within RELOAD_TIMEOUT_SEC."""
    base = folder(vm_name)
    with _unrecorded():
        wanted = _settings_mtimes(base)
        if wanted == written_before:
            return True
        deadline = time.monotonic() + RELOAD_TIMEOUT_SEC
        woken = False
        while True:
            loaded = _loaded(base)
            if loaded.get("pid") == pid:  # it serves: its signal handlers are in place
                if all(loaded.get(name) == mtime for name, mtime in wanted.items()):
                    return True
                if not woken:
                    woken = True
                    try:
                        os.kill(pid, signal.SIGUSR1)
                    except ProcessLookupError:
                        return False
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)


def _loaded(base: Path) -> dict[str, Any]:
    try:
        data = json.loads((base / LOADED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _note_loaded(base: Path, read: dict[str, int]) -> None:
    """The proxy process: the settings files' mtimes as they were when it read them (what a launch waits for)."""
    atomic_write(base / LOADED_FILE, json.dumps({"pid": os.getpid(), **read}) + "\n", mode=0o600, durable=False)


def upload_window(vm_name: str) -> str:
    """When the current upload window began ("" before the first session)."""
    return uploads.window(folder(vm_name))


def _new_window() -> str:
    """An upload window's name: when it began (UTC, as the proxy's log writes times), unique to the microsecond."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _start(vm_name: str, program: str, brokers: bool) -> tuple[subprocess.Popen[bytes], int]:
    """Start the VM's proxy process (under the control lock): bind its port and take its lock here, hand both to
    it, and record it in proxy.json at once. Returns the process and its port (0 when the lock was busy, a proxy
    still ending: the process then finds its own port, which `Lease.port` waits for)."""
    base = folder(vm_name)
    lock_fd = os.open(base / "proxy.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _spawn(vm_name, program), 0
        listener = _listen(_preferred_port(base))
        try:
            port = int(listener.getsockname()[1])
            started = time.time()
            child = _spawn(vm_name, program, (listener.fileno(), lock_fd))
        finally:
            listener.close()  # the process holds it now (and the lock: ours is released with the process's end)
        write_if_changed(base / "port", f"{port}\n".encode())  # mostly the same port again
        atomic_write(base / "proxy.json", json.dumps({"pid": child.pid, "port": port, "started": started,
                                                      "brokers": brokers}) + "\n", mode=0o600, durable=False)
        return child, port
    finally:
        os.close(lock_fd)


def _preferred_port(base: Path) -> int:
    try:
        return int((base / "port").read_text())
    except (OSError, ValueError):
        return 0


def _listen(preferred: int) -> Any:
    """A listening socket on 127.0.0.1: the port the proxy had last, or any free one when that is taken."""
    # The C module `socket` wraps: importing `socket` itself (its enums) costs a launch ~2 ms, for nothing here.
    # deferred: start-up (socket's Python layer, ~4 ms, on the launch that only starts the proxy)
    import _socket as socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", preferred))
        except OSError:
            if not preferred:
                raise
            listener.bind(("127.0.0.1", 0))
        listener.listen(100)
    except BaseException:
        listener.close()
        raise
    return listener


def _spawn(vm_name: str, program: str, handed: tuple[int, int] | None = None) -> subprocess.Popen[bytes]:
    """`python -m program VM [LISTENER_FD LOCK_FD]`."""
    with open(folder(vm_name) / "proxy.stderr.log", "ab") as errors:
        return subprocess.Popen(
            [sys.executable, "-m", program, vm_name, *(str(fd) for fd in handed or ())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True,
            close_fds=True, pass_fds=handed or (),
        )


def _await(vm_name: str, child: subprocess.Popen[bytes] | None) -> Running:
    """The VM's proxy once it serves (the one `child` is, or one another launch started meanwhile)."""
    deadline = time.monotonic() + START_TIMEOUT_SEC
    while time.monotonic() < deadline:
        found = running(vm_name)
        if found is not None:
            return found
        if child is not None and child.poll() is not None and running(vm_name) is None:
            break
        time.sleep(0.005)
    if child is not None:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
    _not_started(vm_name)


def _not_started(vm_name: str) -> NoReturn:
    raise StateError(
        f"agentbox's network proxy for {vm_name} did not start",
        hint=f"Its messages are in {folder(vm_name) / 'proxy.stderr.log'}. The session was not started.",
    )


def _leases(vm_name: str) -> Iterator[Path]:
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder(vm_name) / "leases"):
            yield Path(entry.path)


def _claimed(vm_name: str) -> bool:
    """A lease whose holder runs, or a kept session's or task's fresh marker; stale leases are removed."""
    claimed = False
    for lease in _leases(vm_name):
        if fsutil.held(lease):
            claimed = True
        else:
            with contextlib.suppress(OSError):
                lease.unlink()
    return claimed or livemarkers.any_fresh(vm_name)


def _in_use(vm_name: str) -> bool:
    """Claimed, or a brokered VM's: that proxy stays between sessions, while its VM runs (its process asks Lima,
    `serve`), so a release never ends it."""
    return _claimed(vm_name) or (folder(vm_name) / BROKER_FILE).exists()


# -- the proxy process ---------------------------------------------------------------------------------------

def _load_policy(vm_name: str) -> Any:
    # deferred: start-up (net.proxy: only the proxy process runs it, not the launch that starts it)
    from agentbox.net.proxy import TEST_RESOLVE, Policy, check_pattern

    data = policy(vm_name) or {}
    testing = _test_resolver(os.environ.get(TEST_RESOLVE, ""))
    hooks: dict[str, Any] = {"resolver": testing, "allow_loopback": True} if testing is not None else {}
    hooks["upstream"] = upstream_route(vm_name)
    limit = data.get("uploadLimit", uploads.DEFAULT_LIMIT)
    hooks["upload_limit"] = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
    hooks["upload_window"] = upload_window(vm_name)
    if data.get("mode") == "open":
        return Policy(open=True, **hooks)
    patterns = [entry[0] for entry in data.get("allow", []) if isinstance(entry, list) and entry]
    valid = [pattern for pattern in patterns if check_pattern(pattern) is None]
    return Policy(allow=valid, allow_lan=bool(data.get("allowLan", False)), **hooks)


def upstream_route(vm_name: str) -> Any:
    """The company proxy route the launch wrote (agentbox.net.upstream.Route), None without one."""
    try:
        data = json.loads((folder(vm_name) / UPSTREAM_FILE).read_text())
    except (OSError, ValueError):
        return None
    return upstream.route_of(data)


def _test_resolver(text: str) -> Callable[[str, int], list[str]] | None:
    """Tests only (proxy.TEST_RESOLVE): names the proxy process resolves to the test's own servers."""
    table = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    if not table:
        return None
    return lambda host, port: [table[host]] if host in table else []


def serve(vm_name: str, load_broker: Callable[[], Brokering | None] | None = None,
          handed: Sequence[str] = (), vm_running: Callable[[], bool] | None = None) -> int:
    """The proxy process: serve until no session needs it (or SIGTERM), or its state folder is gone.
    `load_broker` makes the credential broker from the VM's broker file, again whenever that file changes (None: no
    broker). `handed`: the listening socket's and the held proxy.lock's descriptors, when the launch made them
    (`_start`); else it makes its own. `vm_running` says whether the VM still runs (asked through the one module
    that runs limactl, by credentials.broker.process): a brokered VM's proxy, which stays between sessions, ends
    once none holds it and its VM is not running, whatever stopped the VM (`limactl stop` or `delete` outside
    agentbox, a crash); it asks only while no session holds it, VM_CHECK_SEC after the last one and less often
    after that."""
    wake_read, wake_write = os.pipe()
    # Before anything serves: a stop that comes once the proxy answered ends it in order (a broker's start may
    # refresh a login: a stop waits for it, never cuts it).
    _wake_on_signals(wake_write)
    # deferred: start-up (socket, ~4 ms, and net.proxy: only the proxy process serves, not the launch)
    import socket

    from agentbox.net.proxy import start

    base = folder(vm_name)
    listener = None
    if handed:
        listener = socket.socket(fileno=int(handed[0]))
        lock_fd = int(handed[1])
        listener.set_inheritable(False)  # nothing it might run gets them
        os.set_inheritable(lock_fd, False)
    else:
        lock_fd = os.open(base / "proxy.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # one runs
    preferred = _preferred_port(base)
    _rotate(log_path(vm_name))
    _rotate(base / uploads.CAPS_FILE)
    policy_file = base / "policy.json"
    window_file = base / WINDOW_FILE
    seen = (_mtime(policy_file), _mtime(window_file))
    broker_file = base / BROKER_FILE
    broker_seen = _mtime(broker_file)
    upstream_file = base / UPSTREAM_FILE
    upstream_seen = _mtime(upstream_file)
    secret_file = base / SECRET_FILE
    secret_seen = _mtime(secret_file)
    proxy = start(_load_policy(vm_name), log_path(vm_name), port=preferred,
                  broker=_broker(vm_name, load_broker, broker_seen), listener=listener,
                  secret=secret(vm_name),  # always: only the VM has it
                  guest_socket=base / netpolicy.HOLD_SOCKET)  # a held VM's connections (agentbox.net.hold)
    lock = [lock_fd]  # closed by the first _end (the proxy.lock goes before the control lock does)
    _note_loaded(base, {"policy.json": seen[0], UPSTREAM_FILE: upstream_seen, BROKER_FILE: broker_seen})
    try:
        if listener is None:
            atomic_write(base / "port", f"{proxy.port}\n", mode=0o600, durable=False)
            atomic_write(base / "proxy.json", json.dumps({"pid": os.getpid(), "port": proxy.port,
                                                          "started": time.time(),
                                                          "brokers": load_broker is not None}) + "\n",
                         mode=0o600, durable=False)
        idle_since: float | None = None
        vm_check = _VmCheck(vm_running)
        poll = float(os.environ.get(TEST_POLL) or POLL_SEC)
        while True:
            if select.select([wake_read], [], [], poll)[0]:
                signals = os.read(wake_read, 64)
                if signal.SIGTERM in signals or signal.SIGINT in signals:
                    return 0
            if not base.is_dir():  # the VM's state is gone (`agentbox rm`): nothing here is its to serve
                return 0
            if (_mtime(policy_file), _mtime(window_file)) != seen or _mtime(upstream_file) != upstream_seen:
                seen, upstream_seen = (_mtime(policy_file), _mtime(window_file)), _mtime(upstream_file)
                proxy.set_policy(_load_policy(vm_name))
                broker_seen = -1  # the broker's own requests (OAuth refreshes) go by the new route too
            if _mtime(secret_file) != secret_seen:
                secret_seen = _mtime(secret_file)
                _reload_secret(vm_name, proxy)
            if _mtime(broker_file) != broker_seen:
                broker_seen = _mtime(broker_file)
                proxy.set_broker(_broker(vm_name, load_broker, broker_seen))
                _note_loaded(base, {"policy.json": seen[0], UPSTREAM_FILE: upstream_seen, BROKER_FILE: broker_seen})
            if _claimed(vm_name):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
                vm_check.reset(idle_since)
            elif time.monotonic() - idle_since > IDLE_GRACE_SEC:
                if not (base / BROKER_FILE).exists():
                    if _end_if_idle(vm_name, proxy, lock):
                        return 0
                elif vm_check.due(time.monotonic()) and not vm_check.runs() and \
                        _end_if_idle(vm_name, proxy, lock, vm_gone=True):
                    return 0
    finally:
        _end(base, proxy, lock)


class _VmCheck:
    """When a brokered proxy with no session asks whether its VM runs: VM_CHECK_SEC after it was last held, then
    twice as long each time up to VM_CHECK_MAX_SEC (each is one limactl call)."""

    def __init__(self, vm_running: Callable[[], bool] | None) -> None:
        self.vm_running = vm_running
        self.next = 0.0
        self.every = VM_CHECK_SEC

    def reset(self, now: float) -> None:
        self.every = VM_CHECK_SEC
        self.next = now + VM_CHECK_SEC

    def due(self, now: float) -> bool:
        if self.vm_running is None or now < self.next:
            return False
        self.next = now + self.every
        self.every = min(self.every * 2, VM_CHECK_MAX_SEC)
        return True

    def runs(self) -> bool:
        """Whether the VM runs; True when Lima cannot say (the reason goes to proxy.stderr.log): never end on a
        guess."""
        assert self.vm_running is not None
        try:
            return self.vm_running()
        except Exception as error:
            reason = getattr(error, "message", None) or str(error) or type(error).__name__
            print(f"agentbox: cannot tell whether the VM runs: {reason}", file=sys.stderr, flush=True)
            return True


def _reload_secret(vm_name: str, proxy: Any) -> None:
    """The secret file changed: ask the next requests for the new secret. A file that is gone or not a secret
    leaves the one in use (said in proxy.stderr.log): the proxy never serves without one."""
    found = _read_secret(folder(vm_name) / SECRET_FILE)
    if found is not None and _SECRET.fullmatch(found):
        proxy.set_secret(found)
    elif found is not None:
        print(f"agentbox: {folder(vm_name) / SECRET_FILE} is not a proxy secret; the proxy keeps the one it had",
              file=sys.stderr, flush=True)


def _wake_on_signals(wake_write: int) -> None:
    """SIGTERM (`stop()`) and SIGINT write their number to the pipe, whichever thread they reach: the serving
    loop's select returns at once and the proxy ends in order."""
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    signal.signal(signal.SIGUSR1, lambda *_: None)  # a launch changed the settings: read them now


def _broker(vm_name: str, load: Callable[[], Brokering | None] | None, seen: int) -> Brokering | None:
    """The broker the file asks for. On an error the credential hosts get a 503 naming it (with the CA the VM
    already trusts; without one they are tunnelled, and the VM's placeholders reach them as they are: nothing
    real), and the reason goes to proxy.stderr.log."""
    if load is None or not seen:
        return None
    try:
        return load()
    except Exception as error:  # any failure leaves the proxy serving, never sending a real value
        reason = getattr(error, "message", None) or str(error) or type(error).__name__
        print(f"agentbox: the credential broker is not serving: {reason}", file=sys.stderr, flush=True)
        # deferred: start-up (net.certauthority: only the proxy process with a broker needs it)
        from agentbox.net import certauthority

        authority = certauthority.load(vm_name)
        if authority is None:
            return None
        return Brokering(leaves={host: certauthority.server_context(authority.leaf(host)) for host in authority.hosts},
                         down=reason)


def _end_if_idle(vm_name: str, proxy: Any, lock: list[int], vm_gone: bool = False) -> bool:
    """Stop when still unused (`vm_gone`: unclaimed, a brokered VM's proxy whose VM does not run), under the lock a
    launch takes to lease the proxy (so none leases it meanwhile); False when that lock is busy (a launch or a
    release is deciding) or a session came."""
    fd = os.open(_control_lock(vm_name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        if _claimed(vm_name) if vm_gone else _in_use(vm_name):
            return False
        _end(folder(vm_name), proxy, lock)
        return True
    finally:
        os.close(fd)


def _end(base: Path, proxy: Any, lock: list[int]) -> None:
    """Close the port, then remove proxy.json, then let the lock go (`stop()` returns then); idempotent."""
    proxy.stop()
    with contextlib.suppress(OSError):
        (base / "proxy.json").unlink()
    while lock:
        os.close(lock.pop())


def _rotate(log: Path) -> None:
    with contextlib.suppress(OSError):
        if log.stat().st_size > LOG_KEEP_BYTES:
            os.replace(log, log.with_name(log.name + ".1"))


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], handed=sys.argv[2:]))
