"""Every host location agentbox reads or writes. No other module builds these paths."""

from __future__ import annotations

import os
from pathlib import Path

LOCAL_CONFIG_NAME = "agentbox.yml"


def home() -> Path:
    return Path(os.path.expanduser("~"))


def global_config_file() -> Path:
    """$XDG_CONFIG_HOME/agentbox/config.yml, ~/.config/agentbox/config.yml by default on every OS.

    Not platformdirs: on macOS it would point to ~/Library/Application Support, where users of
    the previous agentbox do not keep their config.
    """
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else home() / ".config"
    return base / "agentbox" / "config.yml"


def state_dir() -> Path:
    """Where agentbox keeps rendered templates, locks, logs, staging and trust records."""
    override = os.environ.get("AGENTBOX_STATE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_state_dir("agentbox", appauthor=False))


def vm_state_dir(vm_name: str) -> Path:
    return state_dir() / "vms" / vm_name


def lima_home() -> Path:
    """Lima's instance root, resolved the way limactl resolves it (symlinks followed if it exists)."""
    raw = os.environ.get("LIMA_HOME") or str(home() / ".lima")
    path = Path(raw)
    return path.resolve() if path.exists() else path
