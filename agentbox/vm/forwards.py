"""Host ports and the VMs that hold them: Lima's automatic forwards, `agentbox port`'s own, and clashes.

Lima forwards every TCP port a program in a VM listens on to the same port on the host's 127.0.0.1.
Two VMs (or a VM and a host program) that want one host port do not fail: the second forward only
leaves a warning in Lima's log, and the host port keeps reaching the first holder. agentbox reads
what each running VM's host agent recorded (lima.port_forwards, no limactl call) and names the
holder: a launch warns about its VM's ports that are not reachable, before and after the session;
`agentbox status` and `agentbox ports` list them.

`agentbox port GUEST [HOST]` forwards one port on demand (lima.Lima.forward_port). Its forwards are
recorded per VM in <state>/vms/NAME/ports.json (pid and ports; agentbox's own file), and checked
against the live process whenever they are read, since they end with the VM.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import paths
from agentbox.fsutil import atomic_write, private_dir
from agentbox.progress import warn
from agentbox.safetext import visible
from agentbox.vm.lifecycle import workspace_of
from agentbox.vm.lima import RUNNING, Instance, PortForward, host_port_in_use, port_forward_alive, port_forwards

RECORD = "ports.json"
VIA_LIMA = "lima"
VIA_AGENTBOX = "agentbox port"


class OnDemand(NamedTuple):
    """A forward `agentbox port` made."""

    vm: str
    pid: int
    guest_port: int
    host_port: int


class Holder(NamedTuple):
    """Who has a host port a VM's forward could not get: kind "vm" (Lima's forward of another VM or Lima
    instance), "agentbox port" (an on-demand forward), "host" (a program on the host) or "free" (nobody
    now: it was taken when the guest program started listening, and Lima does not try again)."""

    kind: str
    vm: str | None = None
    workspace: str | None = None

    def text(self, port: int, asking: str) -> str:
        if self.kind == "vm":
            if self.workspace:
                return f"the VM {self.vm} (workspace {self.workspace}) forwards that host port"
            return f"the Lima instance {self.vm} forwards that host port"
        if self.kind == "agentbox port":
            which = "this VM" if self.vm == asking else f"the VM {self.vm}"
            return f"`agentbox port` forwards that host port to {which}"
        if self.kind == "host":
            return f"another program on this host listens there (`lsof -nP -iTCP:{port} -sTCP:LISTEN` shows which)"
        return ("that host port was taken when the program in the VM started listening and is free now "
                "(Lima does not try again: restart that program)")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "vm": self.vm, "workspace": self.workspace}


class PortRow(NamedTuple):
    """One forwarded (or not forwardable) guest port of a VM."""

    vm: str
    workspace: str | None
    guest_addr: str
    host_addr: str
    via: str
    forwarded: bool
    held_by: Holder | None = None  # who has the host port when forwarded is False
    error: str = ""

    @property
    def guest_port(self) -> int:
        return int(self.guest_addr.rpartition(":")[2])

    @property
    def host_port(self) -> int:
        return int(self.host_addr.rpartition(":")[2])

    def to_json(self) -> dict[str, Any]:
        return {
            "vm": self.vm,
            "workspace": self.workspace,
            "guestAddr": self.guest_addr,
            "hostAddr": self.host_addr,
            "via": self.via,
            "forwarded": self.forwarded,
            "url": f"http://{self.host_addr}/" if self.forwarded else None,
            "heldBy": self.held_by.to_json() if self.held_by else None,
            "error": self.error or None,
        }


# -- agentbox port's records ---------------------------------------------------------------------


def _record_path(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / RECORD


def on_demand(vm_name: str) -> list[OnDemand]:
    """This VM's `agentbox port` forwards whose ssh still runs."""
    try:
        entries = json.loads(_record_path(vm_name).read_text())
    except (OSError, ValueError):
        return []
    found = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            item = OnDemand(vm_name, int(entry["pid"]), int(entry["guestPort"]), int(entry["hostPort"]))
        except (KeyError, TypeError, ValueError):
            continue
        if port_forward_alive(item.pid, item.guest_port, item.host_port):
            found.append(item)
    return found


def save_on_demand(vm_name: str, items: Iterable[OnDemand]) -> None:
    data = [{"pid": i.pid, "guestPort": i.guest_port, "hostPort": i.host_port, "started": time.time()} for i in items]
    atomic_write(_record_path(vm_name), json.dumps(data, indent=1) + "\n", mode=0o600)


def log_path(vm_name: str, host_port: int) -> Path:
    """Where the ssh of an agentbox port forward writes (its folder is created)."""
    return private_dir(paths.vm_state_dir(vm_name)) / f"port-{host_port}.log"


# -- who holds what ------------------------------------------------------------------------------


def _workspace(instance: Instance) -> str | None:
    return workspace_of(instance)


def _same_host_port(a: str, b: str) -> bool:
    (ip_a, _, port_a), (ip_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    wildcard = ("0.0.0.0", "[::]")
    return port_a == port_b and (ip_a == ip_b or ip_a in wildcard or ip_b in wildcard)


class Holders:
    """Who forwards which host port now: the running instances (Lima's forwards) and agentbox port.

    `current` (a VM just checked or started) stands in for its entry of `instances`, which may be older.
    """

    def __init__(self, instances: Mapping[str, Instance], current: Instance | None = None) -> None:
        merged = dict(instances)
        if current is not None:
            merged[current.name] = current
        self.running = [i for i in merged.values() if i.status == RUNNING and i.dir]
        self.forwards: dict[str, list[PortForward]] = {i.name: port_forwards(i.dir) for i in self.running}
        self.on_demand: dict[str, list[OnDemand]] = {i.name: on_demand(i.name) for i in self.running}

    def vm_holder(self, host_port: int, asking: str) -> Holder | None:
        """Another VM's Lima forward, or any agentbox port forward, on 127.0.0.1:host_port."""
        addr = f"127.0.0.1:{host_port}"
        for instance in self.running:
            forwards = self.forwards[instance.name]
            if instance.name != asking and any(f.forwarded and _same_host_port(f.host_addr, addr) for f in forwards):
                return Holder("vm", instance.name, _workspace(instance))
        for instance in self.running:
            if any(item.host_port == host_port for item in self.on_demand[instance.name]):
                return Holder("agentbox port", instance.name, _workspace(instance))
        return None

    def holder(self, host_port: int, asking: str) -> Holder:
        found = self.vm_holder(host_port, asking)
        if found is not None:
            return found
        return Holder("host") if host_port_in_use(host_port) else Holder("free")

    def rows(self, instance: Instance) -> list[PortRow]:
        """A running VM's forwarded ports: Lima's (each that has no host port with its holder) and agentbox port's."""
        workspace = _workspace(instance)
        rows = []
        for forward in self.forwards.get(instance.name, []):
            held = None if forward.forwarded else self.holder(forward.host_port, instance.name)
            rows.append(PortRow(instance.name, workspace, forward.guest_addr, forward.host_addr, VIA_LIMA,
                                forward.forwarded, held, forward.error))
        for item in self.on_demand.get(instance.name, []):
            rows.append(PortRow(instance.name, workspace, f"127.0.0.1:{item.guest_port}",
                                f"127.0.0.1:{item.host_port}", VIA_AGENTBOX, True))
        return sorted(rows, key=lambda row: (row.host_port, row.guest_port, row.via))

    def free_port_near(self, port: int, asking: str) -> int | None:
        for candidate in range(port + 1, min(port + 200, 65536)):
            if self.vm_holder(candidate, asking) is None and not host_port_in_use(candidate):
                return candidate
        return None


# -- what a launch and status say ----------------------------------------------------------------


def clash_text(row: PortRow) -> str:
    holder = (row.held_by or Holder("free")).text(row.host_port, row.vm)
    return f"port {row.guest_port} in {row.vm} is not reachable at {row.host_addr}: {holder}"


def clash_hint(row: PortRow, holders: Holders) -> str:
    free = holders.free_port_near(row.host_port, row.vm)
    if free is None:
        return f"`agentbox port {row.guest_port} HOST_PORT` forwards it to another host port"
    return f"`agentbox port {row.guest_port} {free}` forwards it to 127.0.0.1:{free}"


def warn_clashes(instance: Instance, instances: Mapping[str, Instance], known: set[str] | None = None,
                 during: bool = False) -> set[str]:
    """Warn about each of the VM's guest ports Lima could not forward that is not in `known`; return
    the keys of all of them. No limactl call: Lima's logs in the instance folders only."""
    holders = Holders(instances, instance)
    keys = set()
    for row in holders.rows(instance):
        if row.forwarded:
            continue
        key = f"{row.guest_addr}>{row.host_addr}"
        keys.add(key)
        if known is not None and key in known:
            continue
        prefix = "during the session, " if during else ""
        warn(visible(f"{prefix}{clash_text(row)}; {clash_hint(row, holders)}"))
    return keys
