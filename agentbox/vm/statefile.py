"""agentbox's own record of one VM, outside Lima: `<state dir>/vms/VM/state.json`, and the lock that serializes
creating, starting and stopping the VM across agentbox processes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentbox import paths
from agentbox.fsutil import atomic_write, locked_or_waiting, private_dir


@contextmanager
def lock(vm_name: str) -> Iterator[bool]:
    """Serialize create/start/stop of one VM across agentbox processes. Yields whether it had to wait."""
    with locked_or_waiting(private_dir(paths.vm_state_dir(vm_name)) / "lock",
                           f"waiting for another agentbox that is creating or starting {vm_name}...") as waited:
        yield waited


def path(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / "state.json"


def read(vm_name: str) -> dict[str, Any]:
    try:
        data = json.loads(path(vm_name).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write(vm_name: str, data: dict[str, Any]) -> None:
    private_dir(paths.vm_state_dir(vm_name))
    atomic_write(path(vm_name), json.dumps(data, indent=2), mode=0o600)


def update(vm_name: str, changes: dict[str, Any]) -> None:
    data = read(vm_name)
    data.update(changes)
    write(vm_name, data)


def clear_refusal(vm_name: str) -> None:
    """The VM started and passed the check: a refusal recorded earlier no longer applies."""
    data = read(vm_name)
    if data.pop("refused", None) is not None:
        write(vm_name, data)


def clear(vm_name: str) -> None:
    """Forget the VM (it was removed): its state, staging and outbox folders go."""
    directory = paths.vm_state_dir(vm_name)
    if directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
