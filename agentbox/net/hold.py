"""The VM's network held on the host: with Lima's QEMU driver, the guest reaches nothing but agentbox's proxy.

In `allowlist` and `offline` mode a VM started by agentbox runs QEMU with its user-mode network restricted
(`restrict=on`: no packet of the guest's is routed out, TCP, UDP, ICMP or DNS; `ipv6=off`) except for `guestfwd`
forwards agentbox chose: GUEST_ADDRESS:PROXY_GUEST_PORT, whose connections are handed to the VM's proxy process
(agentbox.net.holdconnector, over the proxy's Unix socket), and GUEST_ADDRESS:PORT for each `network.allowHost` port
(to the host's loopback). Lima's SSH forward (its `hostfwd`) is not affected, so Lima works as before. What root in
the guest does (flush the firewall, add routes, raw sockets, IPv6, any DNS server) reaches nothing else: QEMU drops
it on the host.

How: Lima runs QEMU through `QEMU_SYSTEM_<ARCH>` when set (CONTRACT §17); agentbox.net.holdstart writes a launcher
for this VM (its network folder, 0700) that runs agentbox.net.qemuhold with a spec, and hands its path to `limactl
start` (the one module that runs it, agentbox.vm.lima). qemuhold adds the options to the first NIC and records
QEMU's pid and the value it gave (`hold.json`) before QEMU replaces it. `current()` trusts the record only while
that pid runs and (on Linux) its command line still holds the value: a VM started by `limactl start` outside
agentbox, or rebooted, is reported unheld. In the guest, agentbox's ruleset (agentbox.net.policy.ruleset) sends
`host.lima.internal`'s proxy and allowHost ports to GUEST_ADDRESS, so the guest's proxy URL and addresses are the
same held or not.

Not held, said with why (`unheld_reason`): `open` mode, `network.allowHost: true` (every port cannot be forwarded),
drivers other than QEMU (vz, krunkit, wsl2: docs/design/egress.md), a VM made from scratch on its first boot (its
provisioning installs from the internet), a VM running since before the mode needed a hold (until `agentbox
restart`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

from agentbox import paths
from agentbox.fsutil import atomic_write
from agentbox.net.policy import ADVISORY, HOLD_ADDRESS, HOLD_PROXY_PORT, HOLD_SOCKET, HOST, NetworkSettings
from agentbox.net.policy import enforcement as advisory_why

GUEST_ADDRESS = HOLD_ADDRESS  # QEMU's default guestfwd address in Lima's 192.168.5.0/24 (the host's .2 is refused)
PROXY_GUEST_PORT = HOLD_PROXY_PORT
RECORD = "hold.json"
NOTED = "hold-noted"  # the mode a launch last said "not held" for, since the VM's start (said once, not each launch)
SPEC = "hold-spec.json"
LAUNCHER = "qemu-hold"
GUEST_SOCKET = HOLD_SOCKET  # the VM's proxy process takes held connections here (agentbox.net.proxy)
RESTART_HINT = "`agentbox restart` starts it held"


class Held(NamedTuple):
    """A running VM's hold: the allowHost ports forwarded to the host (fixed when it started)."""

    ports: tuple[int, ...]


def folder(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / "network"


def driver(vm_type: str | None) -> str:
    """The Lima driver a VM of `vm.vmType` runs on (Lima's choice: QEMU on Linux, vz on macOS)."""
    return vm_type or ("qemu" if sys.platform.startswith("linux") else "vz")


def unheld_reason(settings: NetworkSettings, vm_type: str | None) -> str | None:
    """Why a VM with these settings is not started held (None: it is)."""
    if settings.mode == "open":
        return "network.mode is open"
    if settings.allow_host is True:
        return ("network.allowHost is true: every port of the host's localhost cannot be forwarded into a held VM "
                "(list the ports to hold it)")
    name = driver(vm_type)
    if name != "qemu":
        return (f"Lima's {name} driver gives no host-side hold of the guest's network (docs/design/egress.md); "
                "only its QEMU driver does")
    return None


def current(vm_name: str, thorough: bool = True) -> Held | None:
    """The running VM's hold, when the QEMU that recorded it still runs with it (None: not held). `thorough`: also
    its command line (a launch's ruleset only needs the pid: a reboot behind its back is caught by the guest's proof,
    agentbox.session.warm)."""
    try:
        record = json.loads((folder(vm_name) / RECORD).read_text(encoding="utf-8"))
        spec = json.loads((folder(vm_name) / SPEC).read_text(encoding="utf-8"))
        pid, value = int(record["pid"]), str(record["netdev"])
        ports = tuple(int(port) for port in spec["ports"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("spec") != spec.get("digest") or not _runs(pid, value if thorough else None):
        return None
    return Held(ports)


def _runs(pid: int, value: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process has this pid now
    if value is None:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return value.encode() in file.read().split(b"\0")
    except FileNotFoundError:
        return not sys.platform.startswith("linux")  # no /proc (macOS): the pid is what there is
    except OSError:
        return False


def launch_note(vm_name: str, settings: NetworkSettings,
                vm_type: str | None) -> tuple[tuple[int, ...] | None, str | None]:
    """For a launch: (the held VM's forwarded allowHost ports, None when it is not held; what to tell the user, if
    anything): a VM that could be held and is not, or one still held though its mode is now open."""
    found = current(vm_name, thorough=False)
    if settings.mode == "open":
        if found is None:
            return None, None
        return None, (f"{vm_name} still runs with its network held on the host (it started in allowlist or offline "
                      "mode): it reaches nothing but agentbox's proxy until `agentbox restart`")
    if found is not None:
        return found.ports, None
    if unheld_reason(settings, vm_type) is not None:
        return None, None
    # Said once until the next start (status, net status and doctor keep saying it): a launch that says anything
    # before its shell cannot run from its verified plan (agentbox.session.plan).
    noted = folder(vm_name) / NOTED
    try:
        if noted.read_text(encoding="utf-8") == settings.mode:
            return None, None
    except OSError:
        pass
    with contextlib.suppress(OSError):
        atomic_write(noted, settings.mode, mode=0o600, durable=False)
    return None, (f"network.mode {settings.mode} is kept by the VM's own firewall only (enforcement: advisory): "
                  f"{vm_name} started before its network was held; {RESTART_HINT} on the host")


def enforcement(vm_name: str | None, settings: NetworkSettings, vm_type: str | None,
                thorough: bool = True) -> tuple[str, str]:
    """(`host` | `advisory`, why) for the VM as it runs now (vm_name None: the config alone)."""
    why_not = unheld_reason(settings, vm_type)
    if why_not is None and vm_name is not None and current(vm_name, thorough) is not None:
        return HOST, ("the VM's QEMU lets its network reach nothing but agentbox's proxy on the host (restrict=on, "
                      "no IPv6, no DNS): guest root cannot go around it")
    _, why = advisory_why(settings)
    if why_not is None:
        why_not = ("the VM is not running held (it is stopped, started before its network was held, or started by "
                   f"`limactl start` outside agentbox); {RESTART_HINT}")
    return ADVISORY, f"{why}; not held on the host: {why_not}" if settings.mode != "open" else why
