"""Remote hosts for tests: a real OpenSSH sshd on 127.0.0.1, one per host, with a second local user standing for
the remote machine (the `remote_hosts` fixture in tests/conftest.py builds them).

- The users (`abremote1`, `abremote2`, ...) are made once (useradd, kept afterwards) and leased to one test at
  a time: a lease is a lock (flock) on a machine-wide file, since pytest-xdist workers and other runs of the
  suite on this machine share /etc/passwd. A leased user's home is emptied and its processes ended when the
  lease starts and when it ends.
- Each host's sshd runs as root (`-D -e -f CONFIG`) on a free port with host keys made for the test,
  pubkey authentication only, `AllowUsers` its user only. The test's key (ssh-keygen -t ed25519) is the
  user's only authorized key; the test's ~/.ssh/config (in the test's HOME) has a `Host` alias per host, and
  ~/.ssh/known_hosts the host keys, so ssh never asks.
- The remote user's PATH has the limactl double first: sshd's `SetEnv PATH=...` (applied after sshd's default
  PATH, and a non-interactive command's shell reads no profile that would reset it; ~/.ssh/environment would
  need PermitUserEnvironment, which a real server rarely allows). The double runs under /usr/bin/python3 (the
  test's own interpreter may live in a 0700 folder the user cannot enter), from a copy in a folder the user
  can read. Its LIMA_HOME is Lima's default, ~/.lima of the remote user.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from agentbox.remote.ssh import Target
from tests.fake_limactl import BOOT_CACHE_VAR

SSHD = "/usr/sbin/sshd"
SYSTEM_PYTHON = "/usr/bin/python3"
USER_PREFIX = "abremote"
MAX_USERS = 64
# Machine-wide: the leases must hold across xdist workers and across runs of the suite from other checkouts.
LEASES = Path("/run/lock/agentbox-test-remote-users")
TESTS = Path(__file__).resolve().parent


def available() -> str | None:
    """Why remote hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "root (sshd and useradd)"
    for tool in (SSHD, "/usr/bin/ssh", "/usr/bin/ssh-keygen", "/usr/sbin/useradd", "/usr/sbin/runuser"):
        if not os.access(tool, os.X_OK):
            return f"{tool} (apt-get install openssh-server openssh-client passwd util-linux)"
    result = subprocess.run([SYSTEM_PYTHON, "-c", "import yaml, jsonschema"], capture_output=True)
    if result.returncode != 0:
        return f"{SYSTEM_PYTHON} with PyYAML and jsonschema (apt-get install python3-yaml python3-jsonschema)"
    return None


# -- the users -----------------------------------------------------------------------------------------------

def _lock(path: Path, blocking: bool) -> IO[bytes] | None:
    handle = open(path, "ab")  # noqa: SIM115 - held for the lease
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _ensure_user(name: str) -> pwd.struct_passwd:
    lock = _lock(LEASES / "useradd.lock", blocking=True)
    assert lock is not None
    with lock:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        # Password `*`: no password login, yet not a locked account (sshd refuses a `!` one without PAM).
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--password", "*", name], check=True,
                       capture_output=True)
        return pwd.getpwnam(name)


def processes(uid: int) -> list[int]:
    """The live processes of a user (not zombies: those only wait for their parent to read their end)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                zombie = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
                if os.stat(f"/proc/{entry}").st_uid == uid and not zombie:
                    found.append(int(entry))
            except (OSError, IndexError):
                pass
    return found


def _end_processes(uid: int) -> None:
    """End every process of the leased user (what its test started there: the double's host agents, commands)."""
    for _ in range(50):
        found = processes(uid)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _empty(home: Path) -> None:
    for entry in home.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


@dataclass
class Lease:
    user: str
    uid: int
    gid: int
    home: Path
    _handle: IO[bytes]

    def clean(self) -> None:
        _end_processes(self.uid)
        _empty(self.home)

    def release(self) -> None:
        self.clean()
        self._handle.close()


def lease_user() -> Lease:
    """A remote user for this test alone, its home empty and nothing of it running."""
    LEASES.mkdir(mode=0o700, parents=True, exist_ok=True)
    for number in range(1, MAX_USERS + 1):
        name = f"{USER_PREFIX}{number}"
        handle = _lock(LEASES / f"{name}.lock", blocking=False)
        if handle is None:
            continue
        entry = _ensure_user(name)
        home = Path(entry.pw_dir)
        if entry.pw_uid < 1000 or home != Path("/home") / name:
            handle.close()  # a user of that name this file did not make: leave it alone
            continue
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        home.chmod(0o700)
        lease = Lease(name, entry.pw_uid, entry.pw_gid, home, handle)
        lease.clean()
        return lease
    raise RuntimeError(f"all {MAX_USERS} remote test users are leased (stale locks in {LEASES}?)")


# -- the limactl double, readable by the remote users ---------------------------------------------------------

def install_double(folder: Path) -> Path:
    """Copy the limactl double where any user can read it, for /usr/bin/python3; return the bin folder."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    shutil.copytree(TESTS / "fake_limactl", folder / "fake_limactl", ignore=shutil.ignore_patterns("__pycache__"),
                    symlinks=True)  # the guest's stand-ins are links to tools.py, as in the repository
    shutil.copy(TESTS / "lima_schema.json", folder / "lima_schema.json")  # constants.SCHEMA_PATH: next to it
    subprocess.run([SYSTEM_PYTHON, "-m", "compileall", "-q", str(folder / "fake_limactl")], check=True)
    where = subprocess.run([SYSTEM_PYTHON, "-c", "import os, yaml, jsonschema\nfor m in (yaml, jsonschema): "
                            "print(os.path.dirname(os.path.dirname(m.__file__)))"],
                           capture_output=True, text=True, check=True).stdout.split()
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "limactl"
    shim.write_text("#!/bin/bash\nexport FAKE_LIMACTL_T0=$EPOCHREALTIME\n"
                    f"export FAKE_LIMACTL_SYSPATH={shlex.quote(os.pathsep.join(dict.fromkeys(where)))}\n"
                    f'exec {SYSTEM_PYTHON} -S {shlex.quote(str(folder / "fake_limactl" / "limactl.py"))} "$@"\n')
    shim.chmod(0o755)
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        executable = path.is_dir() or path == shim or os.access(TESTS / path.relative_to(folder), os.X_OK)
        path.chmod(0o755 if executable else 0o644)  # readable by all; programs (the guest's tools.py) stay so
    return bin_dir


# -- a host ----------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class RemoteHost:
    """One remote machine: an sshd on 127.0.0.1:port letting in `user` only, reached as ssh alias `name`."""

    name: str
    lease: Lease
    folder: Path  # root's: sshd's configuration, host key, pid file, log
    port: int
    variables: dict[str, str]  # what sshd sets for the user's commands (SetEnv): PATH, the double's boot cache
    host_public_key: str
    _sshd: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _connections: set[int] = field(default_factory=set, repr=False)

    hostname = "127.0.0.1"

    @property
    def user(self) -> str:
        return self.lease.user

    @property
    def home(self) -> Path:
        return self.lease.home

    @property
    def lima_home(self) -> Path:
        return self.home / ".lima"

    @property
    def log(self) -> Path:
        return self.folder / "sshd.log"

    @property
    def url(self) -> str:
        """`ssh://NAME`: through the alias of the test's ~/.ssh/config."""
        return f"ssh://{self.name}"

    @property
    def direct_url(self) -> str:
        return f"ssh://{self.user}@{self.hostname}:{self.port}"

    def target(self) -> Target:
        """The transport's Target for this host, by user, address and port (the test's ssh config adds the key)."""
        return Target(self.name, self.user, self.hostname, self.port)

    # -- sshd ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start sshd (again) on this host's port; return once it listens."""
        assert self._sshd is None or self._sshd.poll() is not None, "sshd already runs"
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        with open(self.log, "ab") as log:
            log.write(b"-- start\n")
        offset = self.log.stat().st_size
        with open(self.log, "ab") as log:
            self._sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.folder / "sshd_config")],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with open(self.log, "rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            if f"Server listening on 127.0.0.1 port {self.port}." in text:
                return
            if self._sshd.poll() is not None:
                raise RuntimeError(f"sshd of {self.name} ended ({self._sshd.returncode}): {text.strip()}")
            time.sleep(0.02)
        raise RuntimeError(f"sshd of {self.name} did not listen on port {self.port} within 15 s: {self.log}")

    def set_variables(self, **extra: str) -> None:
        """Give the user's commands these variables too (the double's FAKE_LIMACTL_* knobs): sshd's SetEnv, with
        sshd restarted and every connection cut, so that the next command sees them."""
        self.variables.update(extra)
        config = self.folder / "sshd_config"
        lines = [line for line in config.read_text().splitlines() if not line.startswith("SetEnv ")]
        lines.append("SetEnv " + " ".join(f'"{k}={v}"' for k, v in self.variables.items()))
        config.write_text("\n".join(lines) + "\n")
        self.close()
        self.start()

    def stop(self) -> None:
        """Stop sshd's listener: new connections are refused. Established ones go on (see `cut`)."""
        if self._sshd is None or self._sshd.poll() is not None:
            return
        self._connections.update(_descendants(self._sshd.pid))
        self._sshd.terminate()
        self._sshd.wait(10)

    def cut(self) -> None:
        """End every established connection to this host (their per-connection sshd processes), as a network
        that goes away does: the client's master connection sees its connection closed."""
        if self._sshd is not None and self._sshd.poll() is None:
            self._connections.update(_descendants(self._sshd.pid))
        for pid in self._connections:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":  # not the commands the sessions ran
                    os.kill(pid, signal.SIGKILL)
        self._connections.clear()

    def accepted(self) -> int:
        """How many connections sshd let in so far (its log's `Accepted publickey` lines, restarts included)."""
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count(f"Accepted publickey for {self.user} ")

    def close(self) -> None:
        self.stop()
        self.cut()

    # -- the remote user -----------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The remote user's PATH for commands over ssh (the double's bin first)."""
        return self.variables["PATH"]

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash",
                "LANG": "C.UTF-8", **self.variables}

    def run(self, command: str | list[str], input: bytes | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        """Run a command as the remote user, locally (not through ssh), with the environment ssh would give it;
        a string is a shell command."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else command
        env_words = [f"{k}={v}" for k, v in self.env().items()]
        return subprocess.run(["runuser", "-u", self.user, "--", "env", "-i", *env_words, *argv],
                              input=input or b"", capture_output=True, timeout=timeout, cwd=self.home)

    def files(self) -> list[Path]:
        """Every file and folder under the remote user's home, links not followed, sorted."""
        found = []
        for folder, dirs, names in os.walk(self.home):
            found += [Path(folder) / name for name in dirs + names]
        return sorted(found)

    def containing(self, needles: Iterable[bytes]) -> list[tuple[Path, bytes]]:
        """(file, needle) for each regular file under the remote user's home holding one of the needles (the
        laptop's secrets: key bytes, tokens): a remote host must never have received them."""
        wanted = [n for n in needles if n]
        hits = []
        for path in self.files():
            if path.is_file() and not path.is_symlink():
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                hits += [(path, needle) for needle in wanted if needle in data]
        return hits


def make_host(name: str, double_bin: Path, client_public_key: str, scratch: str, boot_cache: bool) -> RemoteHost:
    """A started remote host called `name` (the ssh alias the caller writes), for a freshly leased user. With
    boot_cache, the double replays recorded provisioning (tests/fake_limactl/bootcache.py) from a folder of the
    user's own, kept for the run (by this xdist worker) like the local tests' records."""
    lease = lease_user()
    try:
        folder = Path(tempfile.mkdtemp(prefix="sshd", dir=scratch))
        folder.chmod(0o755)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}-host", "-f",
                        str(folder / "host_key")], check=True, capture_output=True)
        ssh_dir = lease.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text(client_public_key)
        for owned, mode in ((ssh_dir, 0o700), (ssh_dir / "authorized_keys", 0o600)):
            os.chown(owned, lease.uid, lease.gid)
            owned.chmod(mode)
        path = f"{double_bin}:/usr/local/bin:/usr/bin:/bin"
        variables = {"PATH": path}
        if boot_cache:
            records = double_bin.parent / "boot" / lease.user
            records.mkdir(parents=True, exist_ok=True)
            records.parent.chmod(0o755)
            os.chown(records, lease.uid, lease.gid)
            records.chmod(0o700)
            variables[BOOT_CACHE_VAR] = str(records)
        for attempt in range(5):
            port = free_port()
            (folder / "sshd_config").write_text("\n".join([
                f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_key'}",
                f"PidFile {folder / 'sshd.pid'}", f"AllowUsers {lease.user}", "AuthenticationMethods publickey",
                "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PermitRootLogin no", "UsePAM no", "StrictModes yes", "AuthorizedKeysFile .ssh/authorized_keys",
                "SetEnv " + " ".join(f"{k}={v}" for k, v in variables.items()), "PermitUserEnvironment no", "AllowTcpForwarding yes", "X11Forwarding no",
                "AllowAgentForwarding no", "PrintMotd no", "PrintLastLog no", "LogLevel VERBOSE", "",
            ]))
            key_type, key_data = (folder / "host_key.pub").read_text().split()[:2]
            host = RemoteHost(name, lease, folder, port, variables, f"{key_type} {key_data}")
            try:
                host.start()
                return host
            except RuntimeError:
                if attempt == 4 or "Address already in use" not in host.log.read_text(errors="replace"):
                    raise
        raise AssertionError("unreachable")
    except BaseException:
        lease.release()
        raise


def client_config(home: Path, hosts: list[RemoteHost]) -> None:
    """The test's ~/.ssh: config with a Host alias per host, known_hosts with their keys."""
    ssh_dir = home / ".ssh"
    lines = []
    for host in hosts:
        lines += [f"Host {host.name}", f"  HostName {host.hostname}", f"  Port {host.port}", f"  User {host.user}", ""]
    lines += ["Host *", f"  IdentityFile {ssh_dir / 'id_ed25519'}", "  IdentitiesOnly yes",
              f"  UserKnownHostsFile {ssh_dir / 'known_hosts'}", "  GlobalKnownHostsFile /dev/null",
              "  StrictHostKeyChecking yes", "  PasswordAuthentication no", "  KbdInteractiveAuthentication no", ""]
    (ssh_dir / "config").write_text("\n".join(lines))
    (ssh_dir / "known_hosts").write_text(
        "".join(f"[{host.hostname}]:{host.port} {host.host_public_key}\n" for host in hosts))


def client_key(home: Path) -> str:
    """The test's ssh key (~/.ssh/id_ed25519, made once per test); returns the public key's line."""
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    key = ssh_dir / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "agentbox-test", "-f", str(key)],
                       check=True, capture_output=True)
    return (ssh_dir / "id_ed25519.pub").read_text()


@contextlib.contextmanager
def hosts_factory(home: Path, double_bin: Path, scratch: str) -> Iterator[RemoteHostFactory]:
    factory = RemoteHostFactory(home, double_bin, scratch)
    try:
        yield factory
    finally:
        for host in factory.hosts:
            with contextlib.suppress(Exception):
                host.close()
            host.lease.release()
            shutil.rmtree(host.folder, ignore_errors=True)


class RemoteHostFactory:
    """`remote_hosts(count, boot_cache=True)`: that many new hosts, named remote1, remote2, ... in the order
    made; boot_cache=False makes their VMs run their provisioning scripts at every boot (`real_boot`)."""

    def __init__(self, home: Path, double_bin: Path, scratch: str) -> None:
        self.home = home
        self.double_bin = double_bin
        self.scratch = scratch
        self.hosts: list[RemoteHost] = []

    def __call__(self, count: int = 1, *, boot_cache: bool = True) -> list[RemoteHost]:
        public = client_key(self.home)
        made = []
        for _ in range(count):
            host = make_host(f"remote{len(self.hosts) + 1}", self.double_bin, public, self.scratch, boot_cache)
            self.hosts.append(host)
            made.append(host)
        client_config(self.home, self.hosts)
        return made
