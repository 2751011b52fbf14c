"""Find the host's own tools (limactl, git, ssh, openssl, ...) on PATH, never a file the workspace put there.

A PATH entry that is empty or relative (`::`, `.`, `bin`) means a folder relative to wherever the process
runs, usually the workspace, which the agent writes as root: a planted `git` or `limactl` there would run on
the host. An absolute entry inside the workspace (direnv's `PATH_add bin`, a project's `node_modules/.bin`)
is the same door, so once agentbox knows the workspace (`distrust`) entries at or under it are dropped too.
Every host tool is resolved with `which`, and a process agentbox starts gets `environ()`, whose PATH is the
same cleaned list, so what it runs by name (Lima's ssh, `/usr/bin/env python3`) is found the same way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

_distrusted: set[str] = set()


def distrust(folder: os.PathLike[str] | str) -> None:
    """PATH entries at or under folder (an agent-writable one: the workspace) are never searched."""
    _distrusted.add(os.path.realpath(folder))


def distrust_all(folders: Iterable[os.PathLike[str] | str]) -> None:
    """Distrust every folder the VM can write (Config.agent_writable: the workspace and the writable mounts)."""
    for folder in folders:
        distrust(folder)


def search_path(path: str | None = None) -> str:
    """PATH (or `path`) without empty or relative entries, nor entries in a distrusted folder."""
    entries = (os.environ.get("PATH", os.defpath) if path is None else path).split(os.pathsep)
    return os.pathsep.join(entry for entry in entries if _trusted(entry))


def which(name: str) -> str | None:
    """The absolute path of the host tool `name` on the cleaned PATH; None when it has none there.

    An absolute name is taken as it is (when executable); any other name with a slash is never resolved.
    """
    if os.sep in name or (os.altsep and os.altsep in name):
        return name if os.path.isabs(name) and shutil.which(name) else None
    return shutil.which(name, path=search_path())


def ignored(name: str) -> str | None:
    """Where PATH has `name` only in an entry `which` skips (to explain why it was not found); None otherwise."""
    for entry in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not _trusted(entry):
            found = shutil.which(name, path=entry or ".")
            if found:
                return found
    return None


def environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a host process agentbox starts (os.environ or `base`), with the cleaned PATH."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = search_path(env.get("PATH", os.defpath))
    return env


def _trusted(entry: str) -> bool:
    if not entry or not os.path.isabs(entry):
        return False
    if not _distrusted:
        return True
    resolved = os.path.realpath(entry)
    return not any(resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep) for root in _distrusted)
