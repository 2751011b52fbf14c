"""What a launch last checked of a running VM, kept so the next launch needs no `limactl list`.

After a launch has listed the VM, checked that it is this workspace's and that it runs with what agentbox
rendered, its state keeps that `list` row, a token for the guest (agentbox.session.warm: the guest keeps the
token with its boot id, so a VM restarted since, or another VM of the same name, does not pass) and the
signature of what Lima reads the VM's config from (an edit, a new instance, another LIMA_HOME changes it).
The next launch of that workspace uses the row as it is when the signature still matches; anything agentbox
does that stops or deletes the VM forgets the record, so the launch after it lists again.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, NamedTuple

from agentbox import paths
from agentbox.vm import effective, statefile
from agentbox.vm.lima import RUNNING, Instance

KEY = "verified"


class Verified(NamedTuple):
    instance: Instance
    token: str


def _signature(vm_name: str) -> list[Any]:
    """What Lima loads the VM's config from at every command, `shell` included: LIMA_HOME (the instance `limactl
    shell NAME` reaches), its NAME/lima.yaml, and the host-wide _config/default.yaml and override.yaml merged
    into it (a forwardAgent there reaches the next shell). A file's signature is None while it is absent."""
    home = paths.lima_home()
    signature: list[Any] = [str(home)]
    for path in (home / vm_name / "lima.yaml", *(home / "_config" / file for file in effective.HOST_WIDE_FILES)):
        try:
            found = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            signature.append(None)
            continue
        except OSError:
            signature.append("unreadable")  # never equal to a recorded one: see record()
            continue
        signature.append([found.st_ino, found.st_size, found.st_mtime_ns])
    return signature


def cached(vm_name: str, recorded: dict[str, Any]) -> Verified | None:
    """The record, when it still describes the VM `vm_name` as agentbox left it; else None. (Whose VM it is, the
    caller checks on the row as on any `list` row.)"""
    record = recorded.get(KEY)
    if not isinstance(record, dict) or recorded.get("refused"):
        return None
    row, token = record.get("row"), record.get("token")
    if not isinstance(row, dict) or not isinstance(token, str) or not token:
        return None
    instance = Instance.from_json(row)
    if instance.name != vm_name or instance.status != RUNNING or not instance.dir:
        return None
    signature = _signature(vm_name)
    if "unreadable" in signature or signature != record.get("signature"):
        return None
    return Verified(instance, token)


def record(vm_name: str, instance: Instance) -> str | None:
    """Keep the row of a VM this launch has just checked; the token the guest is to keep (None: not kept)."""
    signature = _signature(vm_name)
    if "unreadable" in signature or instance.status != RUNNING:
        forget(vm_name)
        return None
    token = secrets.token_hex(16)
    statefile.update(vm_name, {KEY: {"token": token, "row": instance.raw, "signature": signature}})
    return token


def forget(vm_name: str) -> None:
    """The VM was stopped, restarted or deleted by agentbox: the next launch lists it."""
    recorded = statefile.read(vm_name)
    if KEY in recorded:
        del recorded[KEY]
        statefile.write(vm_name, recorded)
