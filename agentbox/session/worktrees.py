"""Git worktrees of the workspace for sessions and tasks that run side by side.

`agentbox AGENT --worktree NAME` runs the session in `.agentbox/worktrees/NAME` inside the workspace, on
the branch `agentbox/NAME`; a `--worktree` background task uses `task-ID` (agentbox.tasks.submit). The folder
is made in the VM (launch.sh or the task runner run `git worktree add` there: nothing of the project's git
runs on the host), from the commit HEAD names when agentbox is asked, and git ignores it through the
repository's `.git/info/exclude` (`/.agentbox/`). An existing worktree or branch of that name is used again.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from agentbox import lazyre
from agentbox.config.load import Config
from agentbox.errors import StateError, UsageError
from agentbox.git import store
from agentbox.safetext import visible

FOLDER = ".agentbox/worktrees"
BRANCH_PREFIX = "agentbox/"
_NAME = lazyre.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Worktree(NamedTuple):
    path: str  # absolute, inside the workspace
    branch: str
    base: str  # the commit a new branch starts from


def refuse_in_linked_worktree(repo: Any) -> None:
    """A workspace that is itself a `git worktree add` checkout cannot get worktrees from the VM: the main
    repository's `worktrees/` folder, which points your other checkouts, is read-only there."""
    if repo.git_dir != repo.common_dir:
        raise StateError(f"--worktree cannot be used in {repo.work_tree}: it is a linked worktree of "
                         f"{repo.common_dir}, whose worktrees/ folder the VM may not change (it points your other "
                         "checkouts)",
                         hint="Run the agent from the main checkout with --worktree, or without --worktree here.")


def check_name(name: str) -> None:
    """Refuse what cannot be a worktree's name (a folder under FOLDER and a branch under BRANCH_PREFIX)."""
    if not _NAME.fullmatch(name) or name.endswith((".lock", ".")) or ".." in name or re.fullmatch(r"task-\d+", name):
        raise UsageError(f"--worktree {visible(name)!r} is not a worktree name",
                         hint="Letters, digits, dots, dashes and underscores (up to 64), not task-N (tasks' own).")


def session_worktree(config: Config, name: str) -> Worktree:
    """The worktree of `agentbox AGENT --worktree NAME`, checked."""
    check_name(name)
    workspace = config.require_workspace()
    repo = store.find(workspace)
    if repo is None:
        raise StateError(f"--worktree needs a git work tree, and {workspace} is not one",
                         hint="Run `git init` and commit, or drop --worktree.")
    refuse_in_linked_worktree(repo)
    base = store.head(repo)
    if base is None:
        raise StateError("--worktree starts its branch at HEAD, and this repository has no commit yet",
                         hint="Commit once, then try again.")
    return Worktree(str(workspace / FOLDER / name), BRANCH_PREFIX + name, base)
