"""Two ways a VM can differ from what agentbox intends, both checked without extra limactl calls.

- Effective config: Lima merges $LIMA_HOME/_config/default.yaml and override.yaml into every
  instance, so a host-wide setting can widen what the VM sees. After each create and start the
  `limactl list` row (which carries the fully merged config) is compared with what agentbox rendered.
- Creation-only settings: cpus, memory, disk, mounts and the template only take effect on a new VM;
  a launch notes when the config has changed since the VM was created.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from agentbox.config import Config
from agentbox.errors import StateError


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


def expected_from_rendered(rendered_yaml: str) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(rendered_yaml) or {}
    return {
        "mounts": _mount_keys(data),
        "forwardAgent": bool((data.get("ssh") or {}).get("forwardAgent", False)),
        "mountType": data.get("mountType"),
    }


def effective_differences(effective: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What the instance really has that agentbox did not render, in words."""
    problems = []
    mounts = _mount_keys(effective)
    wanted = expected["mounts"]
    for mount in mounts:
        if mount not in wanted:
            mode = "writable" if mount[2] else "read-only"
            problems.append(f"an extra {mode} mount of {mount[0]} at {mount[1]}")
    for mount in wanted:
        if mount not in mounts:
            problems.append(f"the mount of {mount[0]} at {mount[1]} is missing or has other flags")
    forward = bool((effective.get("ssh") or {}).get("forwardAgent", False))
    if forward != expected["forwardAgent"]:
        problems.append(f"ssh.forwardAgent is {str(forward).lower()}")
    mount_type = effective.get("mountType")
    if mount_type == "reverse-sshfs" or (expected["mountType"] and mount_type != expected["mountType"]):
        problems.append(f"mountType is {mount_type}")
    return problems


def _mount_keys(config: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(location, mountPoint, writable) of each mount, sorted, mountPoint defaulted as Lima does."""
    return sorted(
        (str(m.get("location")), str(m.get("mountPoint") or m.get("location")), bool(m.get("writable", False)))
        for m in config.get("mounts") or []
    )


def check_effective_config(instance_config: dict[str, Any], rendered_path: Path, name: str, lima_home: Path) -> None:
    try:
        expected = expected_from_rendered(rendered_path.read_text())
    except OSError:
        return  # created by an older agentbox run without a kept template: nothing to compare with
    problems = effective_differences(instance_config, expected)
    if problems:
        raise StateError(
            f"{name} runs with settings agentbox did not give it: " + "; ".join(problems),
            hint=(
                f"A host-wide Lima setting ({lima_home}/_config/default.yaml or override.yaml) widens what "
                "the VM can see. Remove that setting, then `agentbox start --recreate`."
            ),
        )
