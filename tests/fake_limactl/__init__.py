"""Helpers for driving the fake ``limactl`` (see ``limactl.py`` for behaviour and env knobs).

Typical use in a test::

    shim = fake_limactl.install(tmp_path / "bin", tmp_path / "lima")
    env = fake_limactl.make_env(tmp_path / "lima", home=tmp_path / "home", bin_dir=tmp_path / "bin")
    subprocess.run(["limactl", "list", "--json"], env=env)
    fake_limactl.read_calls(tmp_path / "lima")
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

LIMACTL_PY = Path(__file__).resolve().with_name("limactl.py")
SSH_PY = Path(__file__).resolve().with_name("ssh.py")
FAKE_QEMU_PY = Path(__file__).resolve().with_name("fakeqemu.py")
STATE_FILE = "fake-state.json"
VERSION = "v2.2.0"
BOOT_CACHE_VAR = "FAKE_LIMACTL_BOOT_CACHE"  # bootcache.py: recorded provisioning results

__all__ = [
    "BOOT_CACHE_VAR",
    "LIMACTL_PY",
    "VERSION",
    "bwrap_available",
    "clear_calls",
    "guest_dir",
    "guest_home",
    "guest_user",
    "install",
    "instance_dir",
    "make_env",
    "read_calls",
    "read_ssh_calls",
    "read_ssh_passthrough",
    "read_state",
    "set_guest_listeners",
    "set_status",
    "write_state",
]


def install(bin_dir: Path, lima_home: Path | None = None) -> Path:
    """Write an executable ``limactl`` shim into ``bin_dir`` and return its path.

    ``lima_home`` (optional) is only created; the shim reads ``$LIMA_HOME`` like the real tool.
    """
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    if lima_home is not None:
        Path(lima_home).mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "limactl"
    shim.write_text(
        "#!/bin/bash\nexport FAKE_LIMACTL_T0=$EPOCHREALTIME\n"
        f"export FAKE_LIMACTL_SYSPATH={shlex.quote(os.pathsep.join(_site_folders()))}\n"
        f'exec {shlex.quote(sys.executable)} -S {shlex.quote(str(LIMACTL_PY))} "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # The ssh that reaches the double's guests through their ssh.config (port forwards only; ssh.py), and passes
    # any other call to the real ssh with $HOME/.ssh/config (tests/remotehost.py's hosts).
    ssh = bin_dir / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(str(SSH_PY))} "$@"\n')
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # Lima's QEMU, which `start` runs when $QEMU_SYSTEM_<ARCH> names one (a held start, agentbox.net.hold).
    for arch in ("x86_64", "aarch64"):
        qemu = bin_dir / f"qemu-system-{arch}"
        qemu.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(str(FAKE_QEMU_PY))} "$@"\n')
        qemu.chmod(qemu.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return shim


def _site_folders() -> list[str]:
    """Where this interpreter's packages are (PyYAML, jsonschema): the double runs without site.py
    (constants.SYSPATH_VAR says why) and is told these instead."""
    import site

    folders = [*site.getsitepackages(), site.getusersitepackages()]
    folders += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return list(dict.fromkeys(p for p in folders if os.path.isdir(p)))


_LEAKY_PREFIXES = ("FAKE_LIMACTL_", "LIMA_", "_LIMA_")


def make_env(lima_home: Path, *, home: Path | None = None, bin_dir: Path | None = None,
             base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """An environment for running the shim: LIMA_HOME/HOME set, bin_dir first on PATH,
    no leftover FAKE_LIMACTL_*/LIMA_* variables from the caller."""
    env = {k: v for k, v in (base if base is not None else os.environ).items()
           if not k.startswith(_LEAKY_PREFIXES)}
    env["LIMA_HOME"] = str(lima_home)
    if home is not None:
        env["HOME"] = str(home)
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
    env.update(extra)
    return env


def _calls_path(lima_home: Path) -> Path:
    return Path(lima_home) / "_fake" / "calls.jsonl"


def read_calls(lima_home: Path, proxy: bool = False) -> list[dict[str, Any]]:
    """The recorded invocations: ``{"argv", "cwd", "start", "duration", "exit", "cpu"}`` per call. Those agentbox's proxy
    process made (``"proxy": true``: a brokered proxy's check that its VM still runs, at moments no test chose) only
    with `proxy`."""
    path = _calls_path(lima_home)
    if not path.exists():
        return []
    calls = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [call for call in calls if proxy or not call.get("proxy")]


def clear_calls(lima_home: Path) -> None:
    _calls_path(lima_home).unlink(missing_ok=True)


def read_ssh_calls(lima_home: Path) -> list[dict[str, Any]]:
    """Every run of the double's ssh: ``{"argv", "pid"}``."""
    path = Path(lima_home) / "_fake" / "ssh-calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_ssh_passthrough(lima_home: Path) -> list[dict[str, Any]]:
    """Every call the double's ssh passed to the real ssh (not a guest's): ``{"argv", "pid"}``."""
    path = Path(lima_home) / "_fake" / "ssh-passthrough.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def set_guest_listeners(lima_home: Path, name: str, listeners: list[str]) -> None:
    """The guest now listens on these tcp addresses ("127.0.0.1:3000", "0.0.0.0:8080", "[::1]:5000"): the
    double's host agent forwards the new ones and stops the gone ones, as Lima's does (hostagent.py)."""
    import subprocess

    env = {**os.environ, "LIMA_HOME": str(lima_home)}
    result = subprocess.run([sys.executable, str(LIMACTL_PY), "__listeners", name, *(f"tcp:{a}" for a in listeners)],
                            env=env, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"__listeners failed: {result.stderr}")


def instance_dir(lima_home: Path, name: str) -> Path:
    return Path(lima_home) / name


def read_state(lima_home: Path, name: str) -> dict[str, Any]:
    """The double's private state of an instance (see ``new_state`` in context.py)."""
    return json.loads((instance_dir(lima_home, name) / STATE_FILE).read_text(encoding="utf-8"))


def write_state(lima_home: Path, name: str, state: Mapping[str, Any]) -> None:
    inst = instance_dir(lima_home, name)
    tmp = inst / ".fake-state.json.new"
    tmp.write_text(json.dumps(dict(state), indent=1), encoding="utf-8")
    os.replace(tmp, inst / STATE_FILE)


def set_status(lima_home: Path, name: str, status: str, *, errors: list[str] | None = None,
               ssh_port: int | None = None) -> None:
    """Force an instance's status: "Running", "Stopped" or "Broken".

    "Broken" simulates a half-dead VM (default error: the host agent runs but the driver does not):
    list shows it with ``errors``, ``start`` is fatal, ``stop`` is fatal, ``stop --force`` recovers.
    To get Lima's other Broken case, remove ``lima.yaml`` from the instance directory.
    """
    import fcntl

    lock = os.open(Path(lima_home) / ".fake.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_state(lima_home, name)
        state["status"] = status
        if status == "Broken":
            state["errors"] = list(errors or ["host agent is running but driver is not"])
            state["hostAgentPID"] = state.get("hostAgentPID") or 999999
        else:
            state["errors"] = []
        if status == "Running":
            state["sshLocalPort"] = ssh_port or state.get("sshLocalPort") or 60022
            state.setdefault("lastStartedAt", time.time())
            if state.get("machine") and not _guest_alive(state["machine"]):
                del state["machine"]  # forced by hand, not a crash: the next shell gives it a guest
        elif ssh_port is not None:
            state["sshLocalPort"] = ssh_port
        write_state(lima_home, name, state)
    finally:
        os.close(lock)


def crash(lima_home: Path, name: str, timeout: float = 10.0) -> None:
    """The VM crashes (as `kill -9` of its QEMU): the guest's agent is killed, its sandbox dies with it, and from
    then on Lima reports the instance Stopped (README, "A crashed guest"). Returns once the guest is gone."""
    machine = read_state(lima_home, name).get("machine") or {}
    if not machine:
        raise RuntimeError(f"fake limactl: {name} has no running guest to crash")
    os.kill(int(machine["agent"]), signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _guest_alive(machine):
            return
        time.sleep(0.02)
    raise RuntimeError(f"fake limactl: the guest of {name} outlived its agent for {timeout} s")


def _guest_alive(machine: Mapping[str, Any]) -> bool:
    try:
        return os.readlink(f"/proc/{int(machine['init'])}/ns/pid") == machine["pidns"]
    except (OSError, KeyError, ValueError):
        return False


def guest_dir(lima_home: Path, name: str, which: str) -> Path:
    """Host directory backing one of the guest's own dirs: "etc", "usr-local", "tmp", "run", "home"."""
    return instance_dir(lima_home, name) / "guestfs" / which


def guest_home(lima_home: Path, name: str, user: str | None = None) -> Path:
    """Host directory backing ``/home/USER.guest`` (USER defaults to the guest user of the double)."""
    if user is None:
        user = guest_user()
    return guest_dir(lima_home, name, "home") / f"{user}.guest"


def guest_user() -> str:
    """The double's default guest user: the host user as Lima does, or `lima` when run as root
    (real limactl refuses root; the double then gives the guest an unprivileged user, uid 1000)."""
    import getpass
    import re

    if os.geteuid() == 0:
        return "lima"
    user = getpass.getuser()
    return user if re.fullmatch(r"[a-z_][a-z0-9_-]*", user) and user != "admin" else "lima"


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None
