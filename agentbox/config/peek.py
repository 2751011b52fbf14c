"""A cheap look at the raw config files and the folder's shape, without parsing them: what `agentbox --help`
and the config's search may decide before any YAML.

Imports only the ground floor (paths), so that listing the commands costs no YAML and no key table.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox import paths


def may_define_agents(cwd: Path) -> bool:
    """A cheap look at the raw files: could any of them define an agent?"""
    candidates = [paths.global_config_file()]
    start = worktree_project(cwd) or cwd
    for directory in (start, *start.parents):
        candidate = directory / paths.LOCAL_CONFIG_NAME
        if os.path.lexists(candidate):
            candidates.append(candidate)
            break
    for candidate in candidates:
        try:
            if not os.path.isfile(candidate):
                continue
            fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                if b"agents" in handle.read(1_000_001):
                    return True
        except OSError:
            continue
    return False


WORKTREES_PARENT = ".agentbox"  # agentbox.session.worktrees.FOLDER's first part


def worktree_project(cwd: Path) -> Path | None:
    """The project a worktree agentbox made belongs to, when cwd is in one: the folder P of
    `P/.agentbox/worktrees/NAME[/...]` (cwd resolved), P holding an agentbox.yml or being the top of a git
    work tree. Decided from the path alone: nothing inside the worktree (its `.git` file, the agentbox.yml
    checked out there) is read, since the VM writes that folder. A folder of that shape made by hand is the
    project's too, like any other folder below it: the project's VM mounts it already."""
    real = Path(os.path.realpath(cwd))
    parts = real.parts
    for index in range(1, len(parts) - 2):  # the outermost first: a worktree inside a worktree is the project's
        if parts[index] != WORKTREES_PARENT or parts[index + 1] != "worktrees":
            continue
        root = Path(*parts[:index])
        if os.path.lexists(root / paths.LOCAL_CONFIG_NAME) or _work_tree_top(root) == root:
            return root
    return None


def _work_tree_top(folder: Path) -> Path | None:
    # deferred: start-up (git.dirs: `agentbox --help` imports this module and never looks for a work tree)
    from agentbox.git import dirs

    return dirs.work_tree_top(folder, Path(os.path.realpath(paths.home())))
