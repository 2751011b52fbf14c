"""Creation-only settings (keys.py marks them) only take effect on a new VM.

A launch notes when the config has changed since the VM was created, without a limactl call.
The VM's record (the fingerprint) also holds the settings Lima changes on the stopped VM (cpus, memory,
disk: keys.py marks them `restart`); agentbox.vm.inplace applies those, so they never ask for a new VM.
(What Lima's host-wide files add to a VM is checked by agentbox.vm.effective.)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentbox.config import keys, pins
from agentbox.config.load import Config
from agentbox.errors import ConfigError


def creation_fingerprint(config: Config) -> dict[str, Any]:
    """The value of every setting the VM gets when it is created, by its short name (`cpus`, `mounts`,
    `caCert`, ...): the creation-only ones and those Lima can change later (`restart`).

    Files (the template, the CA file) count with their content, read through pins like every other use.
    """
    shown = config.to_json()
    fingerprint: dict[str, Any] = {}
    seen: set[tuple[str, ...]] = set()
    for path, key in keys.walk():
        if not (key.creation or key.restart) or any(path[:end] in seen for end in range(1, len(path))):
            continue  # a part of a setting already counted whole (a mount's location)
        seen.add(path)
        value = _value_at(shown, path)
        if key.kind == "path":
            value = [value, _digest(value)]
        elif key.kind == "freeform":
            value = json.dumps(value, sort_keys=True, default=str)
        fingerprint[path[-1]] = value
    return fingerprint


def changed_settings(recorded: dict[str, Any] | None, config: Config) -> list[str]:
    """Names of the creation-only settings that differ from what the VM was created with.

    A setting the VM's record does not know (created by an older agentbox) counts as unchanged; so do
    the ones Lima changes in place (agentbox.vm.inplace).
    """
    if not recorded:
        return []
    current = creation_fingerprint(config)
    in_place = restart_settings()
    return [key for key, value in current.items() if key not in in_place and recorded.get(key, value) != value]


def restart_settings() -> frozenset[str]:
    """The short names of the settings Lima changes on the stopped VM (`cpus`, `memory`, `disk`)."""
    return frozenset(path[-1] for path, key in keys.walk() if key.restart)


def _value_at(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _digest(path: str | None) -> str | None:
    if path is None:
        return None

    try:
        return hashlib.sha256(pins.read(path, "creation fingerprint")).hexdigest()
    except ConfigError:
        return "unreadable"
