"""The invocation's context (LIMA_HOME, logger, --tty), instance names, the double's private
state file, the LIMA_HOME lock, and the knobs that inject failures and latency."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from constants import ID_RE, STATE_FILE
from logrus import Fatal, Logger, bq, go_quote


def host_home() -> str:
    home = os.environ.get("HOME")
    if not home:
        raise Fatal("$HOME is not defined")
    return home


def resolve_lima_home() -> str:
    d = os.environ.get("LIMA_HOME") or os.path.join(host_home(), ".lima")
    return os.path.realpath(d) if os.path.exists(d) else d


def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@dataclass
class Ctx:
    lima_home: str
    log: Logger
    tty: bool = False
    tty_changed: bool = False
    cmd: str = ""

    def inst_dir(self, name: str) -> str:
        err = validate_inst_name(name)
        if err:
            raise Fatal(err)
        return os.path.join(self.lima_home, name)

    @property
    def fake_dir(self) -> str:
        return os.path.join(self.lima_home, "_fake")

    @property
    def identity_file(self) -> str:
        return os.path.join(self.lima_home, "_config", "user")


def identifier_error(s: str) -> str | None:
    if s == "":
        return "identifier must not be empty"
    if len(s.encode("utf-8", "surrogateescape")) > 76:
        return f"identifier {bq(s)} greater than maximum length (76 characters)"
    if not ID_RE.fullmatch(s):
        return f"identifier {bq(s)} must match {ID_RE.pattern}"
    return None


def validate_inst_name(name: str) -> str | None:
    err = identifier_error(name)
    if err:
        return f"instance name {bq(name)} is not a valid identifier: {err}"
    if name.lower().endswith((".yml", ".yaml")):
        return f"instance name {bq(name)} must not end with .yml or .yaml suffix"
    return None


def go_errno_text(e: OSError) -> str:
    text = os.strerror(e.errno) if e.errno else str(e)
    return text[:1].lower() + text[1:]


def new_state() -> dict[str, Any]:
    return {
        "status": "Stopped",      # Stopped | Running | Broken
        "sshLocalPort": 0,        # port of the current/last boot
        "bootCount": 0,           # incremented by every successful-or-not start
        "iid": "",                # per-boot instance id (written to /run/lima-boot-done)
        "errors": [],             # error texts shown while Broken
        "hostAgentPID": 0, "driverPID": 0,   # fake pids (only used in log lines)
        "proxyEnv": {},           # host proxy variables captured at start (propagateProxyEnv)
        "provisionLog": [],       # scripts run at each boot: {"boot", "index", "mode", "script", "exit"}
                                  # (exit None: not run, without bwrap)
        "dataWritten": [],        # guest paths written by `mode: data` at the last start
        "bootPID": 0,             # the background boot process of the current boot (0 once done)
        "caCertsApplied": False,  # cloud-init's ca_certs ran (once per instance)
        "guestListeners": [],     # the guest's tcp listeners [ip, port] as last reported (hostagent.py)
        "forwards": [],           # {"guestAddr", "hostAddr", "held"}: the host agent's tcp forwards
        "createdAt": time.time(),
    }


def read_state(inst_dir: str) -> dict[str, Any]:
    state = new_state()
    try:
        with open(os.path.join(inst_dir, STATE_FILE), encoding="utf-8") as f:
            state.update(json.load(f))
    except (OSError, ValueError):
        pass
    return state


def write_state(inst_dir: str, state: dict[str, Any]) -> None:
    tmp = os.path.join(inst_dir, ".fake-state.json.new")  # not *.tmp: `stop -f` deletes those
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(inst_dir, STATE_FILE))


@contextlib.contextmanager
def lima_lock(lima_home: str) -> Iterator[None]:
    os.makedirs(lima_home, exist_ok=True)
    fd = os.open(os.path.join(lima_home, ".fake.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def injected_failure(ctx: Ctx, sub: str) -> str | None:
    key = "FAKE_LIMACTL_FAIL_" + sub.upper().replace("-", "_")
    msg = os.environ.get(key)
    if not msg:
        return None
    times = os.environ.get(key + "_TIMES")
    if times:
        path = os.path.join(ctx.fake_dir, "fail-counts.json")
        with lima_lock(ctx.lima_home):
            try:
                with open(path, encoding="utf-8") as f:
                    counts = json.load(f)
            except (OSError, ValueError):
                counts = {}
            if counts.get(key, 0) >= int(times):
                return None
            counts[key] = counts.get(key, 0) + 1
            os.makedirs(ctx.fake_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(counts, f)
    return msg


def simulate_latency(sub: str) -> None:
    spec = os.environ.get("FAKE_LIMACTL_LATENCY", "")
    table: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, secs = item.partition("=")
        try:
            table[name.strip()] = float(secs)
        except ValueError:
            raise Fatal(f"fake limactl: invalid FAKE_LIMACTL_LATENCY entry {go_quote(item)}")
    delay = table.get(sub, table.get("*", 0.0))
    if delay > 0:
        marker = os.environ.get("FAKE_LIMACTL_LATENCY_MARKER")
        if marker:  # a test waits for it: this sub-command is under way
            with open(marker, "a", encoding="utf-8") as f:
                f.write(f"{sub}\n")
        time.sleep(delay)
