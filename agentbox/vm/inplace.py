"""The settings Lima changes on an existing VM: cpus, memory and a larger disk, with `limactl edit`.

keys.py marks them `restart`. The VM's record (its fingerprint, agentbox.vm.drift) holds what it was last
given; a config that differs is applied while the VM is stopped, right before it starts (agentbox.vm.lifecycle), so
these never need `agentbox start --recreate`. A running VM keeps what it booted with until then.
Lima cannot shrink a disk: a smaller `vm.disk` keeps the larger disk, and agentbox says so once.

Pure: no limactl call and nothing the warm launch does not already import.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agentbox.config.load import Config
from agentbox.sizes import to_bytes

GIB = 1 << 30


class Plan(NamedTuple):
    """What to do about the VM's cpus, memory and disk.

    `edits`: the `limactl edit` flags and values (`cpus`, and `memory`/`disk` in GiB) that need the VM
    stopped; `changes` says them in words (`cpus 4 -> 8`); `applied` is what the record holds once they are
    applied. `settled`: record values that need no edit (the same size spelled anew, a smaller disk that is
    kept); `kept` says why a smaller disk was not applied.
    """

    edits: dict[str, str]
    changes: list[str]
    applied: dict[str, Any]
    settled: dict[str, Any]
    kept: str | None

    @property
    def pending(self) -> bool:
        return bool(self.edits)


NOTHING = Plan({}, [], {}, {}, None)


def plan(recorded: dict[str, Any] | None, config: Config, disk_now: int = 0) -> Plan:
    """Compare the VM's record with the config. `disk_now`: the VM's disk in bytes from `limactl list`
    (0: unknown, the record's value counts). A setting the record does not know counts as unchanged."""
    if not recorded:
        return NOTHING
    edits: dict[str, str] = {}
    changes: list[str] = []
    applied: dict[str, Any] = {}
    settled: dict[str, Any] = {}
    kept = None
    if "cpus" in recorded and recorded["cpus"] != config.cpus:
        edits["cpus"] = str(config.cpus)
        changes.append(f"cpus {recorded['cpus']} -> {config.cpus}")
        applied["cpus"] = config.cpus
    if "memory" in recorded and recorded["memory"] != config.memory:
        before, after = _size(recorded["memory"]), _size(config.memory)
        if after is not None and before != after:
            edits["memory"] = _gib(after)
            changes.append(f"memory {recorded['memory']} -> {config.memory}")
            applied["memory"] = config.memory
        else:
            settled["memory"] = config.memory
    if "disk" in recorded and recorded["disk"] != config.disk:
        after = _size(config.disk)
        now = disk_now or _size(recorded["disk"]) or 0
        if after is not None and after > now:
            edits["disk"] = _gib(after)
            changes.append(f"disk {_shown(now, recorded['disk'])} -> {config.disk}")
            applied["disk"] = config.disk
        else:
            settled["disk"] = config.disk
            if after is not None and after < now:
                kept = (f"vm.disk {config.disk} is smaller than the VM's disk ({_shown(now, recorded['disk'])}); "
                        "Lima cannot shrink a disk, so the VM keeps the larger one")
    return Plan(edits, changes, applied, settled, kept)


def _size(value: Any) -> int | None:
    return to_bytes(str(value)) if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _gib(size: int) -> str:
    """Bytes as the GiB number Lima's --memory and --disk take (`16`, `0.5`)."""
    return format(size / GIB, ".10g")


def _shown(size: int, recorded: Any) -> str:
    """The disk's size as Lima reports it, or as the record spells it when that is the same size."""
    if _size(recorded) == size:
        return str(recorded)
    return f"{size / GIB:g}GiB"
