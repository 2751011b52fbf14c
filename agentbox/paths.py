"""Every host location agentbox reads or writes. No other module builds these paths."""

from __future__ import annotations

import functools
import os
from pathlib import Path

LOCAL_CONFIG_NAME = "agentbox.yml"


def home() -> Path:
    return _home(os.environ.get("HOME"))


# The paths below are computed once per process for each value of the environment they come from: a command
# asks for them hundreds of times (`agentbox tasks` once per record), and tests change that environment
# between the invocations they run in one process, so the environment is the key.
@functools.lru_cache(maxsize=8)
def _home(_home_variable: str | None) -> Path:
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
    environ = os.environ
    return _state_dir(environ.get("AGENTBOX_STATE_DIR"), environ.get("XDG_STATE_HOME"), environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _state_dir(override: str | None, _xdg_state_home: str | None, _home_variable: str | None) -> Path:
    if override:
        return Path(override)
    # deferred: start-up (platformdirs, ~4 ms: AGENTBOX_STATE_DIR skips it, and --help imports this module)
    import platformdirs

    return Path(platformdirs.user_state_dir("agentbox", appauthor=False))


def vm_state_dir(vm_name: str) -> Path:
    return state_dir() / "vms" / vm_name


def vm_network_dir(vm_name: str) -> Path:
    """The VM's proxy and broker files on the host (agentbox.net.guard lists them)."""
    return vm_state_dir(vm_name) / "network"


def bases_dir() -> Path:
    """The base VMs' records (agentbox.vm.golden): what each was built from, when, and its verification."""
    return state_dir() / "bases"


def workspace_key(workspace: Path) -> str:
    """A short stable name for a workspace folder, used to file host records about it."""
    # deferred: start-up (hashlib, ~3 ms: `agentbox --help` imports this module and never hashes)
    import hashlib

    return hashlib.sha256(str(workspace).encode("utf-8", "surrogateescape")).hexdigest()[:24]


def workspace_state_dir(workspace: Path) -> Path:
    """Host-only records about one workspace (checkpoints, proposals, their event log); never mounted in a VM."""
    return state_dir() / "workspaces" / workspace_key(workspace)


def staging_dir(vm_name: str) -> Path:
    """The host folder one launch hands to the VM, mounted read-only at the same path (agentbox.session.staging)."""
    return vm_state_dir(vm_name) / "staging"


def vm_outbox(vm_name: str) -> Path:
    """The one folder of agentbox's a VM may write (agentbox.session.staging describes it)."""
    return vm_state_dir(vm_name) / "outbox"


def hosts_dir() -> Path:
    """The hosts `agentbox hosts add` made: `<state>/hosts/NAME/host.json` (agentbox.remote.registry)."""
    return state_dir() / "hosts"


def tasks_dir() -> Path:
    """Background tasks' records and outputs (agentbox.tasks.records): never inside a VM's folder, so `agentbox rm`
    leaves them."""
    return state_dir() / "tasks"


def lima_home() -> Path:
    """Lima's instance root, resolved the way limactl resolves it (symlinks followed if it exists)."""
    raw = os.environ.get("LIMA_HOME") or str(home() / ".lima")
    resolved = _RESOLVED_LIMA_HOMES.get(raw)
    if resolved is None:
        if not os.path.exists(raw):  # asked again next time: limactl may make it meanwhile
            return Path(raw)
        resolved = _RESOLVED_LIMA_HOMES[raw] = Path(raw).resolve()
    return resolved


_RESOLVED_LIMA_HOMES: dict[str, Path] = {}  # resolved once it exists, per value of LIMA_HOME


def mount_target_problem(path: Path) -> str | None:
    """Why the VM must never get this host folder (resolved path), or None.

    Never the home folder or a folder containing it; never agentbox's state folder or LIMA_HOME, nor
    anything inside or containing them: with those the VM could rewrite trust records or its own
    instance config.
    """
    real = Path(os.path.realpath(path))
    own_home, protected = _protected_roots(str(home()), str(state_dir()), str(lima_home()))
    if real == own_home or real in own_home.parents:
        return "it is or contains your home folder"
    for name, special in protected:
        why = relation(real, special, name)
        if why:
            return why
    return None


def relation(real: Path, folder: Path, name: str) -> str | None:
    """How real stands to folder (called name), when it is, lies inside or contains it; else None."""
    if real == folder:
        return f"it is {name}"
    if folder in real.parents:
        return f"it is inside {name} ({folder})"
    if real in folder.parents:
        return f"it contains {name} ({folder})"
    return None


# Folders of the home folder that hold logins, keys and the settings of programs that run on the host.
PRIVATE_HOME_FOLDERS = (".ssh", ".aws", ".gnupg", ".config", ".kube", ".docker", "Library")


def private_folders() -> list[tuple[str, Path]]:
    """The folders a `mounts` entry may name only exactly, from the global config (agentbox.config.mountpaths), as
    (name to show, path as written): PRIVATE_HOME_FOLDERS, and XDG_CONFIG_HOME when it moves the global config
    out of ~/.config."""
    found = [(f"~/{name}", home() / name) for name in PRIVATE_HOME_FOLDERS]
    config_base = global_config_file().parent.parent
    if config_base != home() / ".config":
        found.append(("your config folder (XDG_CONFIG_HOME)", config_base))
    return found


@functools.lru_cache(maxsize=4)
def _protected_roots(home_dir: str, state: str, lima: str) -> tuple[Path, tuple[tuple[str, Path], ...]]:
    """Resolved once per run (keyed by the paths, which tests change between commands)."""
    home_real, state_real, lima_real = (Path(os.path.realpath(p)) for p in (home_dir, state, lima))
    return home_real, (("agentbox's state folder", state_real), ("LIMA_HOME", lima_real))


def control_character_problem(text: str) -> str | None:
    """Paths end up in YAML, argv and terminal output: a newline or escape byte in one is refused."""
    for char in text:
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"contains the control character {char!r}, which agentbox does not accept in a path"
    return None
