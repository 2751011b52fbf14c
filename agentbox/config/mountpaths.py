"""Which host folders a `mounts` entry may give the VM: its path walked once, component by component.

A mount's location is decided here, once: the walk follows the user's own symlinks outside the
workspace (a `/home` that is a link, macOS's `/tmp`) and refuses any symlink inside it, because the
agent can plant or retarget a link there between two launches. The real path it ends on is what
trust pins and what Lima gets, so no later lookup can land somewhere else.

The folder is then held against the folders no mount may be, contain or lie in: the home folder,
agentbox's state folder and LIMA_HOME always (paths.mount_target_problem), and the folders holding
logins, keys and the config of tools that run on the host (paths.private_folders) unless the
global config names that exact folder by absolute path: then it is the user's own choice.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from agentbox import paths

MAX_LINKS = 40  # as the kernel's ELOOP limit


class Refusal(NamedTuple):
    """Why a mount location is refused, and what to do instead."""

    reason: str
    hint: str


class Walk(NamedTuple):
    real: Path  # where the location resolves (missing components kept as written)
    link: Path | None  # the first component inside the workspace that is a symlink
    loop: bool = False


def walk(location: Path, workspace: Path) -> Walk:
    """Resolve an absolute, normalised path component by component without following links inside workspace."""
    pending = list(location.parts[1:])
    current = Path("/")
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        try:
            mode = os.lstat(candidate).st_mode
            target = os.readlink(candidate) if stat.S_ISLNK(mode) else None
        except OSError:
            # Missing (or unreadable): nothing further down exists to be a link now.
            return Walk(Path(os.path.normpath(candidate.joinpath(*pending))), None)
        if target is None:
            current = candidate
            continue
        if candidate == workspace or workspace in candidate.parents:
            return Walk(candidate, candidate)
        links += 1
        if links > MAX_LINKS:
            return Walk(candidate, None, loop=True)
        if os.path.isabs(target):
            current = Path("/")
        pending[:0] = list(Path(target).parts[1:] if os.path.isabs(target) else Path(target).parts)
    return Walk(current, None)


def refusal(location: Path, written: str, workspace: Path, named_by_global: bool) -> tuple[Path, Refusal | None]:
    """The real path of a configured mount location, and why it must not be mounted (or None).

    `written` is the location as the config wrote it; `named_by_global` says the global config wrote it.
    """
    walked = walk(location, workspace)
    if walked.loop:
        return walked.real, Refusal(f"{walked.real} leads through more than {MAX_LINKS} symlinks",
                                    "Name the folder by its real path.")
    if walked.link is not None:
        try:
            points_to = os.readlink(walked.link)
        except OSError:
            points_to = "?"
        return walked.real, Refusal(
            f"{walked.link} is a symlink inside the workspace ({workspace}, pointing to {points_to}); agentbox never "
            "follows a link in the workspace for a mount, because the agent can plant or retarget one",
            "Name the folder it should be by its real path, or make the link a real folder.",
        )
    real = walked.real
    problem = paths.mount_target_problem(real)
    if problem:
        return real, Refusal(f"{problem}; agentbox never mounts it into a VM",
                             "Mount only the folder the agent needs, for example ~/datasets.")
    explicit = named_by_global and os.path.isabs(os.path.expanduser(written))
    for name, folder in paths.private_folders():
        as_named = Path(os.path.normpath(os.path.expanduser(written)))
        exact = real == Path(os.path.realpath(folder)) and as_named in (folder, Path(os.path.realpath(folder)))
        if explicit and exact:
            continue
        why = paths.relation(real, Path(os.path.realpath(folder)), name)
        if why is None:
            continue
        if exact:
            hint = (f"Only the global config ({paths.global_config_file()}) can mount {name}: put it there "
                    f"as `location: {folder}`, if the VM really needs it.")
        else:
            hint = (f"Mount only the folder the agent needs, for example ~/datasets. To give the VM {name} "
                    f"itself, name exactly {folder} in the global config ({paths.global_config_file()}).")
        return real, Refusal(f"{why}, which holds logins, keys or the settings of programs on your host", hint)
    return real, None
