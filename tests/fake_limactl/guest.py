"""The guest machine behind the limactl double: its own folders, who owns what, the bubblewrap
sandbox its processes run in, sudo, and its boot (cloud-init's CA certificates, Lima's
provisioning scripts in order, /run/lima-boot-done last, then the readiness probes).

Folders. The guest has its own /etc (a copy of the host's), /usr/local, /var, /root, /tmp, /run
(emptied at every boot) and /home under ``$LIMA_HOME/NAME/guestfs/``; everything else is the
host's, read-only. The double's guest tools (``guest_tools/``) are mounted read-only at
/.fake-limactl: ``bin/`` holds stand-ins for apt-get, dpkg-query, curl and systemctl that are
put first on PATH for `system` provisioning scripts only (the guest has no network and no
package archive), /usr/local/bin/sudo is the guest's sudo and /usr/local/sbin/nft a stand-in that
records the ruleset instead of changing the host's firewall (the guest shares the host's network);
/usr/local/sbin/update-ca-certificates is Debian's, for the guest's own /etc/ssl/certs.

Identities. Run as root (as CI runs), the guest has a root and an unprivileged user, like a VM:
every guest process runs in a user namespace where guest uid/gid n is host id GUEST_ID_BASE+n,
except the guest user's, which is the host's 0. So the host user's files (the workspace, every
mount, the guest home) belong to the guest user, as over Lima's 9p/virtiofs mounts, while the
guest's own /etc, /usr/local and /var belong to guest root and the user cannot write them.
Run as an ordinary user, guest root and the guest user are both that host user (bwrap --uid),
so permission mistakes do not show there.

The running guest. Between start and stop every guest process runs inside one long-lived sandbox
per boot (machine.py), so processes outlive the shell that started them and die with the VM;
spawn() enters it when it runs and builds a sandbox of its own otherwise.

sudo. Passwordless, as in Lima. A guest process of the user reaches guest root through a socket
that the limactl process running it serves (FAKE_LIMACTL_SUDO names it): the command then runs
in a separate root sandbox over the same folders, with the caller's stdin/stdout/stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import posixpath
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import bootcache

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.join(HERE, "guest_tools")
GUEST_TOOLS = "/.fake-limactl"
STUB_DIR = GUEST_TOOLS + "/bin"
GUESTFS = "guestfs"
GUEST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SSH_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"
GUEST_ID_BASE = 200000
ID_RANGE = 65536
GUEST_DIRS = (("/etc", "etc"), ("/usr/local", "usr-local"), ("/var", "var"), ("/root", "root"),
              ("/tmp", "tmp"), ("/run", "run"), ("/home", "home"))
CLOUD_INIT_LOG = "var/log/cloud-init-output.log"
RUN_TOOLS = "run/fake-limactl"        # per-boot files of the double inside the guest's /run
BOOT_ID_FILE = "boot-id"              # in the instance dir; bound over /proc/sys/kernel/random/boot_id
CA_DIR = "/usr/local/share/ca-certificates"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_ALIAS = "host.lima.internal"


def guestfs(inst_dir: str, sub: str = "") -> str:
    return os.path.join(inst_dir, GUESTFS, sub) if sub else os.path.join(inst_dir, GUESTFS)


def bwrap_path() -> str | None:
    if os.environ.get("FAKE_LIMACTL_NO_BWRAP"):
        return None
    return shutil.which("bwrap")


def ts() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------------
# Identities
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ids:
    """Guest ids and the host ids that stand for them (see the module docstring)."""

    user: str
    uid: int
    gid: int
    separated: bool

    def host_uid(self, guest_uid: int) -> int:
        if not self.separated:
            return os.getuid()
        return 0 if guest_uid == self.uid else GUEST_ID_BASE + guest_uid

    def host_gid(self, guest_gid: int) -> int:
        if not self.separated:
            return os.getgid()
        return 0 if guest_gid == self.gid else GUEST_ID_BASE + guest_gid

    def id_map(self, own: int) -> str:
        """/proc/PID/uid_map text: guest ids -> host ids, with `own` (the guest user's) at host 0."""
        lines = [f"{own} 0 1"]
        if own > 0:
            lines.append(f"0 {GUEST_ID_BASE} {own}")
        if own + 1 < ID_RANGE:
            lines.append(f"{own + 1} {GUEST_ID_BASE + own + 1} {ID_RANGE - own - 1}")
        return "\n".join(lines) + "\n"


def ids_of(cfg: dict[str, Any]) -> Ids:
    user = cfg["user"]
    uid = int(user["uid"])
    separated = os.geteuid() == 0 and uid != 0 and bwrap_path() is not None
    return Ids(user["name"], uid, uid, separated)


def chown_guest(ids: Ids, path: str, guest_uid: int, guest_gid: int | None = None) -> None:
    if ids.separated:
        with contextlib.suppress(OSError):
            os.lchown(path, ids.host_uid(guest_uid), ids.host_gid(guest_uid if guest_gid is None else guest_gid))


def chown_tree(ids: Ids, top: str, guest_uid: int | None = None) -> None:
    """Give a tree to a guest owner (guest_uid), or map its host owners as guest ids (None: files
    copied from the host's /etc keep their system owners, now the guest's)."""
    if not ids.separated:
        return
    for root, dirs, files in os.walk(top):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            try:
                st = os.lstat(name)
            except OSError:
                continue
            uid = guest_uid if guest_uid is not None else st.st_uid
            gid = guest_uid if guest_uid is not None else st.st_gid
            if uid >= ID_RANGE or gid >= ID_RANGE:
                continue
            with contextlib.suppress(OSError):
                os.lchown(name, ids.host_uid(uid), ids.host_gid(gid))


# --------------------------------------------------------------------------------------------
# The guest's folders
# --------------------------------------------------------------------------------------------

def copy_tree_lenient(src: str, dst: str) -> None:
    """Copy a tree preserving symlinks and modes; unreadable entries and special files are skipped."""
    os.makedirs(dst, exist_ok=True)
    try:
        entries = list(os.scandir(src))
    except OSError:
        return
    for e in entries:
        target = os.path.join(dst, e.name)
        try:
            if e.is_symlink():
                os.symlink(os.readlink(e.path), target)
            elif e.is_dir():
                copy_tree_lenient(e.path, target)
                shutil.copystat(e.path, target)
            elif e.is_file():
                shutil.copy2(e.path, target)
        except OSError:
            continue


def guest_home_host_path(inst_dir: str, home: str) -> str:
    if home.startswith("/home/"):
        return os.path.join(guestfs(inst_dir, "home"), home[len("/home/"):])
    return guestfs(inst_dir, "userhome")


def copy_host_etc(dst: str) -> None:
    """`cp -a` is several times faster than a Python walk; unreadable files are just skipped."""
    cp = shutil.which("cp")
    if cp and sys.platform.startswith("linux"):
        subprocess.run([cp, "-a", "/etc", dst], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        if os.path.isdir(dst):
            return
    copy_tree_lenient("/etc", dst)


def init_guestfs(inst_dir: str, name: str, cfg: dict[str, Any]) -> None:
    """The guest's own folders (created once, at create), owned as in a fresh VM."""
    ids = ids_of(cfg)
    copy_host_etc(guestfs(inst_dir, "etc"))
    chown_tree(ids, guestfs(inst_dir, "etc"))
    # usr-local/share/ca-certificates: the image's ca-certificates package made it.
    for d in ("usr-local/bin", "usr-local/sbin", "usr-local/lib", "usr-local/share", "usr-local/include",
              "usr-local/share/ca-certificates", "usr-local/etc", "var/log", "var/lib", "var/cache", "var/spool", "run", "home"):
        os.makedirs(guestfs(inst_dir, d), exist_ok=True)
    for link, target in (("var/run", "/run"), ("var/lock", "/run/lock")):
        with contextlib.suppress(OSError):
            os.symlink(target, guestfs(inst_dir, link))
    for d, mode in (("tmp", 0o1777), ("var/tmp", 0o1777), ("root", 0o700)):
        os.makedirs(guestfs(inst_dir, d), exist_ok=True)
        os.chmod(guestfs(inst_dir, d), mode)
    for d in ("usr-local", "var", "root", "tmp", "run", "home"):
        chown_tree(ids, guestfs(inst_dir, d), 0)
    with contextlib.suppress(OSError):
        os.symlink(GUEST_TOOLS + "/sudo", guestfs(inst_dir, "usr-local/bin/sudo"))
        chown_guest(ids, guestfs(inst_dir, "usr-local/bin/sudo"), 0)
    # root's PATH finds these before the host's real ones (see guest_tools/tools.py): the real nft would change the
    # host's firewall, and the host's update-ca-certificates runs its hooks (dpkg triggers) on the guest.
    for tool in ("nft", "update-ca-certificates"):
        with contextlib.suppress(OSError):
            os.symlink(f"{GUEST_TOOLS}/{tool}", guestfs(inst_dir, f"usr-local/sbin/{tool}"))
            chown_guest(ids, guestfs(inst_dir, f"usr-local/sbin/{tool}"), 0)
    add_host_alias(inst_dir, ids)
    user = cfg["user"]
    home = guest_home_host_path(inst_dir, user["home"])
    if os.path.isdir("/etc/skel"):
        copy_tree_lenient("/etc/skel", home)
    os.makedirs(home, exist_ok=True)
    os.chmod(home, 0o750)
    if ids.separated:
        chown_tree(ids, home, ids.uid)
    else:
        with contextlib.suppress(OSError):
            os.chown(home, user["uid"], user["uid"])
    if user["home"].startswith("/home/") and user["home"].endswith(".guest"):
        # The boot script links the pre-2.1 name to the new one.
        link = os.path.join(guestfs(inst_dir, "home"), user["name"] + ".linux")
        with contextlib.suppress(OSError):
            os.symlink(os.path.basename(user["home"]), link)
            chown_guest(ids, link, 0)
    write_guest_accounts(inst_dir, user)
    with contextlib.suppress(OSError), open(guestfs(inst_dir, "etc/hostname"), "w", encoding="utf-8") as f:
        f.write(hostname_of(name) + "\n")


def add_host_alias(inst_dir: str, ids: Ids) -> None:
    """host.lima.internal in the guest's /etc/hosts: in Lima the name reaches the host's loopback (192.168.5.2);
    the double's guest shares the host's network, so there the host's loopback is 127.0.0.1."""
    path = guestfs(inst_dir, "etc/hosts")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = ""
    if re.search(r"^\S+\s+(.*\s)?host\.lima\.internal(\s|$)", text, re.M):
        return
    with contextlib.suppress(OSError):
        st = os.lstat(path) if os.path.lexists(path) else None
        if st is not None and stat.S_ISLNK(st.st_mode):
            os.unlink(path)
            st = None
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + ("" if not text or text.endswith("\n") else "\n") + f"127.0.0.1 {HOST_ALIAS}\n")
        if st is not None:
            os.chmod(path, stat.S_IMODE(st.st_mode))
        else:
            chown_guest(ids, path, 0)


def hostname_of(name: str) -> str:
    return "lima-" + name.replace(".", "-").replace("_", "-")


def ensure_guestfs(inst: Any) -> None:
    """Instances whose directory was written by hand (not by `create`) get their guest dirs lazily."""
    if not os.path.isdir(guestfs(inst.dir, "etc")) and inst.config is not None:
        init_guestfs(inst.dir, inst.name, inst.config)
    ids = ids_of(inst.config)
    for _, sub in GUEST_DIRS:
        path = guestfs(inst.dir, sub)
        if not os.path.isdir(path):
            os.makedirs(path)
            chown_guest(ids, path, 0)
    home = guest_home_host_path(inst.dir, inst.config["user"]["home"])
    if not os.path.isdir(home):
        os.makedirs(home)
        chown_guest(ids, home, ids.uid)


def _rewrite_accounts(path: str, entry: str, name: str, numeric: str) -> None:
    """Put entry into an /etc/passwd- or /etc/group-style file, dropping lines with its name or id."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    kept = [line for line in lines if line.split(":")[0] != name and line.split(":")[2:3] != [numeric]]
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if os.path.islink(path):
            os.unlink(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(kept + [entry]) + "\n")
        os.lchown(path, st.st_uid, st.st_gid)
        os.chmod(path, stat.S_IMODE(st.st_mode))


def write_guest_accounts(inst_dir: str, user: dict[str, Any]) -> None:
    uid = str(user["uid"])
    _rewrite_accounts(guestfs(inst_dir, "etc/passwd"),
                      f"{user['name']}:x:{uid}:{uid}:{user['comment']}:{user['home']}:{user['shell']}",
                      user["name"], uid)
    _rewrite_accounts(guestfs(inst_dir, "etc/group"), f"{user['name']}:x:{uid}:", user["name"], uid)


@dataclass
class Layer:
    guest: str              # guest path prefix
    host: str | None        # backing host path (None = an empty tmpfs)
    writable: bool
    kind: str = "dir"       # "dir" | "mount" | "tmpfs"


def _under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix.rstrip("/") + "/")


def host_home() -> str:
    return os.environ.get("HOME") or "/"


def guest_layers(inst: Any) -> list[Layer]:
    """What the sandbox binds over the read-only host root, in bind order (later wins)."""
    cfg = inst.config or {}
    layers = [Layer(g, guestfs(inst.dir, sub), True) for g, sub in GUEST_DIRS]
    layers.append(Layer(GUEST_TOOLS, TOOLS_DIR, False))
    hh = os.path.realpath(host_home())
    if hh != "/" and not any(_under(hh, g) for g, _ in GUEST_DIRS) and \
            hh not in ("/usr", "/bin", "/lib", "/sbin", "/var", "/opt", "/srv"):
        layers.append(Layer(hh, None, True, "tmpfs"))  # a VM never sees the host home unless mounted
    home = cfg.get("user", {}).get("home", "")
    if home and not home.startswith("/home/"):
        layers.append(Layer(home, guest_home_host_path(inst.dir, home), True))
    for m in cfg.get("mounts", []):
        layers.append(Layer(m["mountPoint"], m["location"], bool(m["writable"]), "mount"))
    return layers


def resolve_guest_path(inst: Any, gpath: str, layers: list[Layer] | None = None) -> tuple[str | None, bool]:
    """Map a guest path to (backing host path, writable); host path None = inside an empty tmpfs."""
    home = (inst.config or {}).get("user", {}).get("home", "/")
    gpath = posixpath.normpath(gpath if gpath.startswith("/") else posixpath.join(home, gpath))
    for layer in reversed(guest_layers(inst) if layers is None else layers):
        if _under(gpath, layer.guest):
            if layer.host is None:
                return None, layer.writable
            rest = gpath[len(layer.guest):].lstrip("/") if layer.guest != "/" else gpath.lstrip("/")
            return (os.path.join(layer.host, rest) if rest else layer.host), layer.writable
    return gpath, False


def user_may_write(inst: Any, host_dir: str) -> bool:
    """Whether the guest user could create files in host_dir (a guest folder), by its owner and mode."""
    ids = ids_of(inst.config)
    if not ids.separated:
        return True
    try:
        st = os.stat(host_dir)
    except OSError:
        return False
    if st.st_uid == ids.host_uid(ids.uid):
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid == ids.host_gid(ids.gid):
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def guest_user_env(inst: Any) -> dict[str, str]:
    cfg = inst.config or {}
    user = cfg["user"]
    env = {"HOME": user["home"], "USER": user["name"], "LOGNAME": user["name"], "SHELL": user["shell"],
           "PATH": GUEST_PATH}
    if cfg.get("propagateProxyEnv", True):
        env.update(inst.state.get("proxyEnv") or {})
    env.update({k: v for k, v in cfg.get("env", {}).items() if k and "=" not in k and "\0" not in k + v})
    for key in ("COLORTERM", "TERM"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def write_etc_environment(inst: Any, env: dict[str, str]) -> None:
    path = guestfs(inst.dir, "etc/environment")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = ""
    text = re.sub(r"#LIMA-START\n.*?#LIMA-END\n", "", text, flags=re.S)
    block = "#LIMA-START\n" + "".join(f"{k}={v}\n" for k, v in env.items()) + "#LIMA-END\n"
    with contextlib.suppress(OSError):
        if os.path.islink(path):
            os.unlink(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + block)


# --------------------------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------------------------

def sandbox_argv(bwrap: str, inst: Any, argv: list[str], *, as_root: bool, chdir: str | None = None,
                 pid_namespace: bool = False, extra: list[str] | None = None) -> list[str]:
    """bwrap arguments: read-only host root, the guest's own dirs, the mounts, then argv as the
    guest user (or guest root). pid_namespace: a pid namespace of its own also when not separated
    (the running guest's, machine.py); extra: more bwrap options."""
    ids = ids_of(inst.config)
    layers = guest_layers(inst)
    replaced_top = {layer.guest for layer in layers if layer.guest.count("/") == 1}
    # The kernel takes at most 64 bytes (HOST_NAME_MAX); cloud-init cuts a longer Lima hostname too.
    a = [bwrap, "--die-with-parent", "--unshare-uts", "--hostname", hostname_of(inst.name)[:64]]
    if ids.separated:
        a += ["--unshare-pid"]  # procfs can only be mounted by the owner of the pid namespace
    else:
        guest_id = 0 if as_root else ids.uid
        a += ["--unshare-user", "--uid", str(guest_id), "--gid", str(guest_id)]
        if pid_namespace:
            a += ["--unshare-pid"]
    # Bind the host root entry by entry onto bwrap's tmpfs root (remounted read-only at the end),
    # so that mount points that do not exist on the host (e.g. /workspace) can still be created.
    a += _reexpose("/", "/", skip={"/proc", "/dev"} | replaced_top)
    a += ["--proc", "/proc", "--dev", "/dev"]
    boot_id = os.path.join(inst.dir, BOOT_ID_FILE)
    if os.path.isfile(boot_id):
        a += ["--ro-bind", boot_id, "/proc/sys/kernel/random/boot_id"]
    read_only = ["/"]
    for i, layer in enumerate(layers):
        if layer.kind == "tmpfs":
            a += ["--tmpfs", layer.guest]
        elif layer.kind == "mount":
            if os.path.isdir(layer.host):
                a += _room_for_mount_point(inst, layers[:i], layer.guest, read_only)
                for missing in _missing_dirs(inst, layers[:i], layer.guest):
                    a += ["--perms", "0755", "--dir", missing]  # as a VM's mount points: root's, 0755
                a += ["--bind" if layer.writable else "--ro-bind", layer.host, layer.guest]
        elif layer.host is not None and os.path.isdir(layer.host):
            a += ["--bind" if layer.writable else "--ro-bind", layer.host, layer.guest]
    for path in read_only:
        a += ["--remount-ro", path]
    home = inst.config["user"]["home"]
    a += list(extra or [])
    a += ["--chdir", chdir or ("/root" if as_root else home), "--"]
    if ids.separated and not as_root:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("fake limactl: setpriv (util-linux) is needed to run guest commands as the guest user")
        a += [setpriv, f"--reuid={ids.uid}", f"--regid={ids.gid}", "--init-groups", "--"]
    return a + argv


def _reexpose(guest_dir: str, host_dir: str, skip: set[str] = frozenset()) -> list[str]:
    """Bind every entry of host_dir read-only into guest_dir (symlinks recreated)."""
    ops: list[str] = []
    for entry in sorted(os.listdir(host_dir)):
        src, dst = os.path.join(host_dir, entry), posixpath.join(guest_dir, entry)
        if dst in skip:
            continue
        if os.path.islink(src):
            ops += ["--symlink", os.readlink(src), dst]
        elif os.path.exists(src):
            ops += ["--ro-bind", src, dst]
    return ops


def _missing_dirs(inst: Any, below: list[Layer], point: str) -> list[str]:
    """The folders from point up to its nearest existing ancestor, top-down (bwrap would make them 0700)."""
    missing: list[str] = []
    path = point
    while path != "/":
        host, _ = resolve_guest_path(inst, path, below)
        if host is None:
            if any(layer.kind == "tmpfs" and layer.guest == path for layer in below):
                break
        elif os.path.isdir(host):
            break
        missing.append(path)
        path = posixpath.dirname(path)
    return list(reversed(missing))


def _room_for_mount_point(inst: Any, below: list[Layer], point: str, read_only: list[str]) -> list[str]:
    """bwrap creates a missing mount point only inside a writable directory. When the nearest
    existing ancestor is read-only (e.g. /mnt), shadow it with a tmpfs that re-exposes its entries."""
    host, _ = resolve_guest_path(inst, point, below)
    if host is None or os.path.exists(host):
        return []
    ancestor = posixpath.dirname(point)
    while True:
        host, writable = resolve_guest_path(inst, ancestor, below)
        if host is None or os.path.isdir(host):
            break
        ancestor = posixpath.dirname(ancestor)
    if host is None or writable or ancestor in read_only:
        return []
    read_only.append(ancestor)
    return ["--tmpfs", ancestor] + _reexpose(ancestor, host)


_CLONE_NEWUSER = 0x10000000


def spawn(inst: Any, argv: list[str], *, as_root: bool, env: dict[str, str], chdir: str | None = None,
          stdio: tuple[int, int, int] | None = None, new_session: bool = False) -> int:
    """Start argv in the guest (inside this boot's running guest when there is one, machine.py; else
    in a sandbox of its own); return the host pid to wait for with wait()."""
    import machine
    m = machine.running(inst)
    if m is not None:
        return machine.spawn(inst, m, argv, as_root=as_root, env=env, chdir=chdir, stdio=stdio,
                             new_session=new_session)
    bwrap = bwrap_path()
    if bwrap is None:
        raise RuntimeError("fake limactl: bwrap is needed to run guest processes")
    cmd = sandbox_argv(bwrap, inst, argv, as_root=as_root, chdir=chdir)
    return spawn_sandbox(inst, cmd, env=env, stdio=stdio, new_session=new_session)


def spawn_sandbox(inst: Any, cmd: list[str], *, env: dict[str, str], stdio: tuple[int, int, int] | None = None,
                  new_session: bool = False, pass_fds: tuple[int, ...] = ()) -> int:
    """Run a bwrap command line (sandbox_argv) with the instance's id mapping, passing pass_fds on."""
    ids = ids_of(inst.config)
    if not ids.separated:
        proc = subprocess.Popen(cmd, env=env, start_new_session=new_session,
                                stdin=stdio[0] if stdio else None, stdout=stdio[1] if stdio else None,
                                stderr=stdio[2] if stdio else None, pass_fds=pass_fds)
        return proc.pid
    return _spawn_in_userns(cmd, env, ids, stdio, new_session, pass_fds)


def _spawn_in_userns(cmd: list[str], env: dict[str, str], ids: Ids, stdio: tuple[int, int, int] | None,
                     new_session: bool, pass_fds: tuple[int, ...] = ()) -> int:
    """fork; the child enters a new user namespace whose id maps this (root) process writes, becomes
    root there and execs bwrap, which then has every capability over the guest's ids only."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only async-signal-safe-ish steps, then exec
        try:
            os.close(ready_r)
            os.close(go_w)
            if stdio:
                for target, fd in enumerate(stdio):
                    if fd != target:
                        os.dup2(fd, target)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            if new_session:
                os.setsid()
            for fd in pass_fds:
                os.set_inheritable(fd, True)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(_CLONE_NEWUSER) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
            os.write(ready_w, b"1")
            os.close(ready_w)
            if os.read(go_r, 1) != b"1":
                os._exit(125)
            os.setresgid(0, 0, 0)
            os.setgroups([])
            os.setresuid(0, 0, 0)
            os.execve(cmd[0], cmd, env)
        except BaseException as e:
            with contextlib.suppress(Exception):
                os.write(2, f"fake limactl: cannot start the guest sandbox: {e}\n".encode())
            os._exit(127)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) == b"1":
            with open(f"/proc/{pid}/uid_map", "w") as f:
                f.write(ids.id_map(ids.uid))
            with open(f"/proc/{pid}/gid_map", "w") as f:
                f.write(ids.id_map(ids.gid))
            os.write(go_w, b"1")
    finally:
        os.close(ready_r)
        os.close(go_w)
    return pid


def wait(pid: int, *, forward_signals: bool = True) -> int:
    """Wait for a spawned sandbox, forwarding termination signals; a signal death reads as 255."""
    def forward(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    previous: dict[int, Any] = {}
    if forward_signals and threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
        # SIGINT from a terminal reaches the child directly (same process group); just survive it.
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = os.waitstatus_to_exitcode(status)
    return 255 if code < 0 else code


def run(inst: Any, argv: list[str], *, as_root: bool, env: dict[str, str], chdir: str | None = None,
        stdio: tuple[int, int, int] | None = None, sudo: bool = True, signal_status: int | None = None) -> int:
    """Run argv in the guest and wait; the user's processes get sudo (see SudoBridge; the running
    guest's agent serves it for the whole boot). signal_status: the status of a command a signal ended, in the
    running guest (None: 128+N)."""
    import machine
    m = machine.running(inst)
    if m is not None and not as_root and sudo:
        env = dict(env, FAKE_LIMACTL_SUDO=m.sudo_path)
        return wait(machine.spawn(inst, m, argv, as_root=False, env=env, chdir=chdir, stdio=stdio,
                                  signal_status=signal_status))
    if as_root or not sudo:
        return wait(spawn(inst, argv, as_root=as_root, env=env, chdir=chdir, stdio=stdio))
    with SudoBridge(inst) as bridge:
        env = dict(env, FAKE_LIMACTL_SUDO=bridge.guest_path)
        return wait(spawn(inst, argv, as_root=False, env=env, chdir=chdir, stdio=stdio))


# --------------------------------------------------------------------------------------------
# sudo
# --------------------------------------------------------------------------------------------

class SudoBridge:
    """Serves sudo requests of one guest process tree (see guest_tools/tools.py `sudo`): each request
    carries argv, env and cwd as JSON plus the caller's stdin, stdout and stderr (SCM_RIGHTS); the
    command runs as guest root in its own sandbox and the exit code goes back."""

    def __init__(self, inst: Any, name: str = "") -> None:
        self.inst = inst
        self.name = name
        self.ids = ids_of(inst.config)
        self.sock: socket.socket | None = None
        self.host_path = ""
        self.guest_path = ""

    def __enter__(self) -> SudoBridge:
        run_dir = guestfs(self.inst.dir, RUN_TOOLS)
        if not os.path.isdir(run_dir):
            os.makedirs(run_dir, exist_ok=True)
            chown_guest(self.ids, run_dir, 0)
        name = self.name or f"sudo-{os.getpid()}-{threading.get_ident() % 100000}.sock"
        self.host_path = os.path.join(run_dir, name)
        self.guest_path = f"/{RUN_TOOLS}/{name}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.host_path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound through /proc/self/fd: a long LIMA_HOME/NAME (which Lima allows up to its own
        # ssh.sock limit) would make the full path too long for a Unix socket.
        folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.sock.bind(f"/proc/self/fd/{folder}/{name}")
        finally:
            os.close(folder)
        os.chmod(self.host_path, 0o600)
        chown_guest(self.ids, self.host_path, self.ids.uid)
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.host_path)

    def _serve(self) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(msg.decode("utf-8", "surrogateescape"))
            if len(fds) != 3:
                raise ValueError("sudo needs stdin, stdout and stderr")
            pid = spawn(self.inst, list(request["argv"]), as_root=True, env=dict(request["env"]),
                        chdir=request.get("cwd") or "/", stdio=(fds[0], fds[1], fds[2]))
            for fd in fds:
                os.close(fd)
            fds = []
            code = wait(pid, forward_signals=False)
        except Exception as e:
            code = 1
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": str(e)}).encode() + b"\n")
        else:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"code": code}).encode() + b"\n")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()


# --------------------------------------------------------------------------------------------
# Boot: cloud-init's CA certificates, then Lima's boot script (data, system, user), boot-done
# --------------------------------------------------------------------------------------------

class BootLog:
    """The guest's /var/log/cloud-init-output.log, where Lima's boot script reports each step."""

    def __init__(self, inst: Any) -> None:
        self.path = guestfs(inst.dir, CLOUD_INIT_LOG)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        chown_guest(ids_of(inst.config), self.path, 0, 4)  # root:adm, as on Ubuntu

    def lima(self, msg: str) -> None:
        os.write(self.fd, f"LIMA {ts()}| {msg}\n".encode())

    def close(self) -> None:
        os.close(self.fd)


def apply_ca_certs(inst: Any, log: BootLog) -> None:
    """cloud-init's ca_certs (once per instance): each cert to /usr/local/share/ca-certificates,
    then what update-ca-certificates leaves: the bundle with the certs appended (only them with
    removeDefaults) and a .pem link per cert in /etc/ssl/certs."""
    ca = inst.config.get("caCerts") or {}
    certs = list(ca.get("certs") or [])
    for path in ca.get("files") or []:
        with contextlib.suppress(OSError), open(os.path.expanduser(path), encoding="utf-8") as f:
            certs.append(f.read())
    if not certs:
        return
    ids = ids_of(inst.config)
    share, _ = resolve_guest_path(inst, CA_DIR)
    bundle, _ = resolve_guest_path(inst, CA_BUNDLE)
    assert share is not None and bundle is not None
    os.makedirs(share, exist_ok=True)
    chown_guest(ids, share, 0)
    os.makedirs(os.path.dirname(bundle), exist_ok=True)
    try:
        with open(bundle, encoding="utf-8") as f:
            existing = f.read()
    except OSError:
        existing = ""
    text = "" if ca.get("removeDefaults") else existing
    for i, cert in enumerate(certs, 1):
        cert = cert.strip() + "\n"
        name = f"cloud-init-ca-cert-{i}"
        crt = os.path.join(share, name + ".crt")
        with open(crt, "w", encoding="utf-8") as f:
            f.write(cert)
        os.chmod(crt, 0o644)
        chown_guest(ids, crt, 0)
        pem = os.path.join(os.path.dirname(bundle), name + ".pem")
        with contextlib.suppress(OSError):
            os.unlink(pem)
        with contextlib.suppress(OSError):
            os.symlink(f"{CA_DIR}/{name}.crt", pem)
            chown_guest(ids, pem, 0)
        if cert not in text:
            text += ("" if not text or text.endswith("\n") else "\n") + cert
    if os.path.islink(bundle):
        os.unlink(bundle)
    with open(bundle, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(bundle, 0o644)
    chown_guest(ids, bundle, 0)
    log.lima(f"cloud-init: added {len(certs)} CA certificate(s) to {CA_BUNDLE}")


class BootAborted(Exception):
    """The boot script stopped (set -e): /run/lima-boot-done is never written."""


def owner_ids(inst: Any, owner: str) -> tuple[int, int]:
    """Guest uid/gid of a `data` file's owner ("user", "user:group", numeric)."""
    user = inst.config["user"]
    accounts = _accounts(inst)

    def lookup(name: str, table: int) -> int:
        if name.isdigit():
            return int(name)
        if name == user["name"]:
            return int(user["uid"])
        return accounts[table].get(name, -1)

    u, _, g = owner.partition(":")
    uid = lookup(u, 0)
    return uid, lookup(g, 1) if g else uid


def _accounts(inst: Any) -> tuple[dict[str, int], dict[str, int]]:
    tables: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for table, name in ((0, "etc/passwd"), (1, "etc/group")):
        with contextlib.suppress(OSError), open(guestfs(inst.dir, name), encoding="utf-8") as f:
            for line in f:
                parts = line.split(":")
                if len(parts) > 2 and parts[2].isdigit():
                    tables[table][parts[0]] = int(parts[2])
    return tables


def write_data_file(inst: Any, p: dict[str, Any]) -> None:
    """`mode: data`: root writes the file (missing folders created for its owner), then chown/chmod."""
    host_path, writable = resolve_guest_path(inst, p["path"])
    if host_path is None or not writable:
        raise BootAborted(f"fake limactl: provision `mode: data` cannot write `{p['path']}`: it is not on a "
                          "writable part of the fake guest (/etc, /usr/local, /var, /root, /tmp, /run, /home, "
                          "writable mounts)")
    if os.path.exists(host_path) and not p.get("overwrite", True):
        return
    ids = ids_of(inst.config)
    uid, gid = owner_ids(inst, p.get("owner", "root:root"))
    missing = []
    parent = os.path.dirname(host_path)
    while not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for d in reversed(missing):
        os.mkdir(d, 0o755)
        if uid >= 0:
            chown_guest(ids, d, uid, gid)
    if os.path.islink(host_path):
        os.unlink(host_path)
    with open(host_path, "wb") as f:
        f.write(p.get("content", "").encode("utf-8", "surrogateescape"))
    os.chmod(host_path, int(p.get("permissions") or "644", 8))
    if uid >= 0:
        chown_guest(ids, host_path, uid, gid if gid >= 0 else uid)


def _script_env_base(inst: Any) -> dict[str, str]:
    cfg = inst.config
    env = {f"PARAM_{k}": v for k, v in cfg.get("param", {}).items()}
    return env


def run_boot(inst: Any, iid: str, knobs: dict[str, Any], results: dict[str, list[Any]],
             before_done: Any = None) -> None:
    """Everything the guest does at boot after sshd is up, in Lima's order. Runs in the detached
    provisioning process; /run/lima-boot-done is written last, unless the boot script aborted, after
    before_done() (the double records the boot first: `start` returns once it sees boot-done)."""
    cfg = inst.config
    log = BootLog(inst)
    os.dup2(log.fd, 1)
    os.dup2(log.fd, 2)
    ids = ids_of(cfg)
    run_tools = guestfs(inst.dir, RUN_TOOLS)
    os.makedirs(run_tools, exist_ok=True)
    chown_guest(ids, run_tools, 0)
    with open(os.path.join(run_tools, "world.json"), "w", encoding="utf-8") as f:
        json.dump(knobs, f)
    try:
        if not inst.state.get("caCertsApplied"):
            apply_ca_certs(inst, log)
        delay = float(knobs.get("provisionDelay") or 0)
        if delay > 0:
            time.sleep(delay)
        if knobs.get("provisionHang"):
            while os.path.isdir(inst.dir):  # until `stop` kills this process, or the instance is gone
                time.sleep(0.5)
            return
        failed = False
        order = {"data": 0, "yq": 1, "system": 2, "user": 3}  # Lima's boot script runs them by mode
        steps = sorted(enumerate(cfg.get("provision", [])), key=lambda item: (order.get(item[1]["mode"], 4), item[0]))
        scripts = [(i, p) for i, p in steps if p["mode"] in ("system", "user")]
        data: dict[str, str] = {}
        for i, p in steps:
            mode = p["mode"]
            if mode == "data":
                log.lima(f"Executing provision[{i}] (mode data, path {p['path']})")
                write_data_file(inst, p)
                results["data"].append(p["path"])
                host_path, _ = resolve_guest_path(inst, p["path"])
                data[p["path"]] = os.path.relpath(host_path, guestfs(inst.dir)) if host_path else ""
                continue
            if mode in ("system", "user"):
                if i == scripts[0][0]:
                    ran = _run_scripts(inst, scripts, log, _replayable(knobs), data)
                    results["scripts"].extend(ran)
                    failed = any(r["exit"] != 0 for r in ran)
                continue
            log.lima(f"WARNING: fake limactl: provision mode `{mode}` is not run by the test double")
        if failed:
            log.lima("WARNING: one or more provisioning scripts failed")
    except BootAborted as e:
        log.lima(str(e))
        raise
    finally:
        log.close()
    if before_done is not None:
        before_done()
    run = guestfs(inst.dir, "run")
    with open(os.path.join(run, "lima-boot-done"), "w", encoding="utf-8") as f:
        f.write(iid + "\n")


def _replayable(knobs: dict[str, Any]) -> bool:
    """Whether recorded results may stand in for the scripts: not when a knob changes how the boot goes."""
    return not (knobs.get("offline") or knobs.get("provisionDelay") or knobs.get("provisionHang")
                or os.environ.get("FAKE_LIMACTL_APT_LOCK_SECONDS"))


def _run_scripts(inst: Any, scripts: list[tuple[int, dict[str, Any]]], log: BootLog, replayable: bool,
                 data: dict[str, str]) -> list[dict[str, Any]]:
    """The `system` and `user` scripts in order (their results), or their recorded results (bootcache.py)."""
    cache = bootcache.folder() if replayable else None
    root = guestfs(inst.dir)
    name = before = None
    boot_id = b""
    if cache:
        before = bootcache.listing(root)
        env = dict(_script_env_base(inst), **inst.config.get("env", {}))
        mounts = inst.config.get("mounts", [])
        paths = [m[k] for m in mounts for k in ("location", "mountPoint") if m.get(k)]
        points = [sub + m["mountPoint"][len(g):] for m in mounts for g, sub in GUEST_DIRS
                  if m["mountPoint"] == g or m["mountPoint"].startswith(g + "/")]
        name = bootcache.key([p for _, p in scripts], env, inst.config["user"], before, data, paths, points)
        with contextlib.suppress(OSError), open(os.path.join(inst.dir, BOOT_ID_FILE), "rb") as f:
            boot_id = f.read().strip()
        if name is not None:
            replayed = bootcache.replay(cache, name, boot_id, root, log.fd)
            if replayed is not None:
                return replayed
    log_start = os.lseek(log.fd, 0, os.SEEK_END)
    ran = []
    counters = {"system": 0, "user": 0}
    for i, p in scripts:
        mode = p["mode"]
        counters[mode] += 1
        code = _run_script(inst, mode, counters[mode], p.get("script", ""), log)
        ran.append({"index": i, "mode": mode, "script": p.get("script", ""), "exit": code})
    if cache and name is not None and before is not None:
        with open(log.path, "rb") as f:
            f.seek(log_start)
            output = f.read()
        bootcache.record(cache, name, boot_id, root, before, ran, output)
    return ran


def _run_script(inst: Any, mode: str, n: int, script: str, log: BootLog) -> int:
    """One `system` (as root, stand-ins first on PATH) or `user` (as the user, via `sudo -iu`)
    provisioning script; a failure is logged like Lima's boot script logs it."""
    cfg = inst.config
    ids = ids_of(cfg)
    user = cfg["user"]
    if mode == "system":
        folder = guestfs(inst.dir, f"{RUN_TOOLS}/cidata/provision.system")
        guest_path = f"/{RUN_TOOLS}/cidata/provision.system/{n:08d}"
        os.makedirs(folder, exist_ok=True)
        chown_tree(ids, guestfs(inst.dir, f"{RUN_TOOLS}/cidata"), 0)
        host_file = os.path.join(folder, f"{n:08d}")
        owner = 0
        env = dict(_script_env_base(inst), PATH=f"{STUB_DIR}:{ROOT_PATH}", HOME="/root", USER="root",
                   LOGNAME="root", SHELL="/bin/bash", LANG="C.UTF-8")
        env.update({k: v for k, v in cfg.get("env", {}).items() if k and "=" not in k})
        argv = [guest_path]
    else:
        host_file = os.path.join(guest_home_host_path(inst.dir, user["home"]), ".lima-user-script")
        guest_path = posixpath.join(user["home"], ".lima-user-script")
        owner = ids.uid
        env = dict(_script_env_base(inst), HOME=user["home"], USER=user["name"], LOGNAME=user["name"],
                   SHELL=user["shell"], PATH=GUEST_PATH, XDG_RUNTIME_DIR=f"/run/user/{user['uid']}",
                   LANG="C.UTF-8")
        argv = [user["shell"], "-l", "-c", shlex.quote(guest_path)]
    with open(host_file, "w", encoding="utf-8") as f:
        f.write(script)
    os.chmod(host_file, 0o755)
    chown_guest(ids, host_file, owner)
    log.lima(f"Executing {guest_path}")
    try:
        code = run(inst, argv, as_root=(mode == "system"), env=env, stdio=(os.open(os.devnull, os.O_RDONLY), 1, 2))
    finally:
        if mode == "user":
            with contextlib.suppress(OSError):
                os.unlink(host_file)
    if code != 0:
        log.lima(f"WARNING: Failed to execute {guest_path}")
    return code


def run_probe(inst: Any, probe: dict[str, Any]) -> tuple[int, str, str]:
    """A readiness probe as Lima's host agent runs it: the interpreter of its #! line over ssh, as the
    user, with the script on stdin. Returns (exit code, stdout, stderr)."""
    script = probe.get("script") or ""
    first = script.splitlines()[0] if script else ""
    interpreter = shlex.split(first[2:]) if first.startswith("#!") else ["/bin/sh"]
    user = inst.config["user"]
    env = {"HOME": user["home"], "USER": user["name"], "LOGNAME": user["name"], "SHELL": user["shell"],
           "PATH": SSH_PATH, **_script_env_base(inst)}
    import tempfile
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin.write(script.encode())
        stdin.seek(0)
        code = run(inst, interpreter, as_root=False, env=env, stdio=(stdin.fileno(), out.fileno(), err.fileno()))
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")

