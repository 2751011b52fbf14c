"""Trust for a project's agentbox.yml: anyone who can write the repository (the agent included) can write it.

A local config that widens what the VM gets from the host is used only after `agentbox trust`, which
records that file's exact content in the user's state folder (outside every workspace). Any edit
revokes the trust. The global config is always trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from agentbox import paths
from agentbox.config import Config
from agentbox.errors import ConfigError
from agentbox.fsutil import atomic_write, private_dir


def risky_keys(config: Config) -> list[str]:
    """The keys of the local file that need trust, each with why."""
    data = config.local_data
    if not data or config.local_file is None:
        return []
    workspace = config.workspace
    risky: list[str] = []
    if "workspace" in data and Path(os.path.realpath(config.local_file.parent)) != workspace:
        risky.append(f"workspace: {workspace} (a folder other than the config's own)")
    vm = data.get("vm", {})
    for key in ("name", "template", "lima"):
        if key in vm:
            why = {"name": "could move the session into another project's VM",
                   "template": "replaces agentbox's Lima template",
                   "lima": "changes Lima settings directly"}[key]
            risky.append(f"vm.{key} ({why})")
    local_mounts = {str(m.location): m for m in config.mounts} if "mounts" in data else {}
    for location, mount in local_mounts.items():
        inside = _inside(Path(os.path.realpath(location)), workspace)
        if not inside:
            risky.append(f"mounts: {location} (outside the workspace)")
        elif mount.writable:
            risky.append(f"mounts: {location} (writable)")
    if data.get("sync", {}).get("remoteWrite") is True:
        risky.append("sync.remoteWrite: true (allows git push from the VM)")
    if "caCert" in data:
        risky.append("caCert (adds certificate authorities the VM trusts)")
    credentials = data.get("credentials")
    if isinstance(credentials, dict) and credentials.get("netrc"):
        risky.append("credentials.netrc: true (brings ~/.netrc into the VM)")
    for hook in ("onCreateScript", "onStartScript"):
        for script in (config.on_create if hook == "onCreateScript" else config.on_start):
            real = Path(os.path.realpath(script.path))
            if script.origin == "local" and not _inside(real, workspace):
                where = f"a symlink to {real}, " if real != script.path else "a host file "
                risky.append(f"bootstrap.{hook}: {script.path} ({where}outside the workspace)")
    for name, agent in data.get("agents", {}).items():
        for key in ("binary", "install", "vmName"):
            if key in agent:
                risky.append(f"agents.{name}.{key}")
        if isinstance(agent.get("credentials"), list):
            risky.append(f"agents.{name}.credentials (host files brought into the VM)")
    return risky


def record_path(config_file: Path) -> Path:
    digest = hashlib.sha256(str(Path(os.path.realpath(config_file))).encode()).hexdigest()[:24]
    return paths.state_dir() / "trust" / f"{digest}.json"


def _content(config_file: Path) -> bytes:
    return Path(os.path.realpath(config_file)).read_bytes()


def trusted_record(config_file: Path) -> dict | None:
    try:
        return json.loads(record_path(config_file).read_text())
    except (OSError, ValueError):
        return None


def is_trusted(config_file: Path) -> bool:
    record = trusted_record(config_file)
    if record is None:
        return False
    return record.get("sha256") == hashlib.sha256(_content(config_file)).hexdigest()


def trust(config_file: Path) -> Path:
    content = _content(config_file)
    private_dir(paths.state_dir() / "trust")
    record = {
        "path": str(Path(os.path.realpath(config_file))),
        "sha256": hashlib.sha256(content).hexdigest(),
        "content": content.decode("utf-8", "replace"),
    }
    target = record_path(config_file)
    atomic_write(target, json.dumps(record, indent=2), mode=0o600)
    return target


def show(config_file: Path) -> str:
    """What `agentbox trust` would record: a diff against the last trusted content, or the whole file."""
    current = _content(config_file).decode("utf-8", "replace")
    record = trusted_record(config_file)
    if record is None:
        return f"# {config_file} has never been trusted; its content:\n" + current
    if record.get("content") == current:
        return f"# {config_file} is trusted as it is.\n"
    import difflib

    diff = difflib.unified_diff(
        record.get("content", "").splitlines(keepends=True),
        current.splitlines(keepends=True),
        fromfile=f"{config_file} (last trusted)",
        tofile=f"{config_file} (now)",
    )
    return "".join(diff)


def require_trust(config: Config) -> None:
    """Refuse (exit 2) an untrusted local config that widens what the VM gets."""
    if config.local_file is None:
        return
    risky = risky_keys(config)
    if not risky or is_trusted(config.local_file):
        return
    record = trusted_record(config.local_file)
    why = "it changed since you trusted it" if record else "it is not trusted"
    listing = "\n".join(f"  - {item}" for item in risky)
    raise ConfigError(
        f"{config.local_file} widens what the VM gets from your host, and {why}:\n{listing}",
        hint=(
            f"Read it (`agentbox trust --show` shows {'the changes' if record else 'it'}), then run "
            f"`agentbox -C {config.local_file.parent} trust` to use it. Anyone who can write the repository, "
            "the agent included, can write this file."
        ),
    )


def _inside(path: Path, workspace: Path) -> bool:
    return path == workspace or workspace in path.parents
