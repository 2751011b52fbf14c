"""What a launch last checked of a running VM, kept so the next launch needs no `limactl list`.

After a launch has listed the VM, checked that it is this workspace's and that it runs with what agentbox
rendered, its state keeps that `list` row, a token for the guest (agentbox.session.warm: the guest keeps the
token with its boot id, so a VM restarted since, or another VM of the same name, does not pass) and the
signature of Lima's lima.yaml (an edit or a new instance changes it). The next launch of that workspace
uses the row as it is when the signature still matches; anything agentbox does that stops or deletes the VM
forgets the record, so the launch after it lists again.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, NamedTuple

from agentbox import paths
from agentbox.vm import effective
from agentbox.vm import state as vmstate
from agentbox.vm.lima import RUNNING, Instance

KEY = "verified"


class Verified(NamedTuple):
    instance: Instance
    token: str


def _signature(instance_dir: str) -> list[Any] | None:
    """What Lima loads the VM's config from at every command, `shell` included: its lima.yaml, and the host-wide
    _config/default.yaml and override.yaml merged into it (a forwardAgent there reaches the next shell). None
    when the instance is not in the LIMA_HOME limactl uses now."""
    home = paths.lima_home()
    if os.path.dirname(instance_dir) != str(home):
        return None
    files = [os.path.join(instance_dir, "lima.yaml"),
             *(os.path.join(home, "_config", name) for name in effective.HOST_WIDE_FILES)]
    signature: list[Any] = []
    for number, path in enumerate(files):
        try:
            found = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            if number == 0:
                return None
            signature.append(None)
            continue
        except OSError:
            return None
        signature.append([found.st_ino, found.st_size, found.st_mtime_ns])
    return signature


def cached(name: str, state: dict[str, Any]) -> Verified | None:
    """The record, when it still describes the VM `name` as agentbox left it; else None. (Whose VM it is, the
    caller checks on the row as on any `list` row.)"""
    record = state.get(KEY)
    if not isinstance(record, dict) or state.get("refused"):
        return None
    row, token = record.get("row"), record.get("token")
    if not isinstance(row, dict) or not isinstance(token, str) or not token:
        return None
    instance = Instance.from_json(row)
    if instance.name != name or instance.status != RUNNING or not instance.dir:
        return None
    signature = _signature(instance.dir)
    if signature is None or signature != record.get("limaYaml"):
        return None
    return Verified(instance, token)


def record(name: str, instance: Instance) -> str | None:
    """Keep the row of a VM this launch has just checked; the token the guest is to keep (None: not kept)."""
    signature = _signature(instance.dir)
    if signature is None or instance.status != RUNNING:
        forget(name)
        return None
    token = secrets.token_hex(16)
    vmstate.update(name, {KEY: {"token": token, "row": instance.raw, "limaYaml": signature}})
    return token


def forget(name: str) -> None:
    """The VM was stopped, restarted or deleted by agentbox: the next launch lists it."""
    state = vmstate.read(name)
    if KEY in state:
        del state[KEY]
        vmstate.write(name, state)
