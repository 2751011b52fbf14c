"""Creation-only settings: cpus, memory, disk, mounts and the template only take effect on a new VM.

A launch notes when the config has changed since the VM was created, without a limactl call.
(What Lima's host-wide files add to a VM is checked by agentbox.effective.)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentbox.config import Config


def creation_fingerprint(config: Config) -> dict[str, Any]:
    template_digest = None
    if config.template is not None:
        try:
            template_digest = hashlib.sha256(config.template.read_bytes()).hexdigest()
        except OSError:
            template_digest = "unreadable"
    return {
        "cpus": config.cpus,
        "memory": config.memory,
        "disk": config.disk,
        "vmType": config.vm_type,
        "arch": config.arch,
        "mountType": config.mount_type,
        "mounts": [m.to_json() for m in config.mounts],
        "template": [str(config.template) if config.template else None, template_digest],
        "lima": json.dumps(config.lima, sort_keys=True, default=str),
    }


def changed_settings(recorded: dict[str, Any] | None, config: Config) -> list[str]:
    if not recorded:
        return []
    current = creation_fingerprint(config)
    return [key for key, value in current.items() if recorded.get(key, value) != value]
