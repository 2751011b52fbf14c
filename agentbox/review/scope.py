"""Which tree checkpoints are of: the workspace, or the agentbox worktree a session or command runs in.

A worktree agentbox made for a session or task (`.agentbox/worktrees/NAME`, agentbox.session.worktrees) is a
checkout of its own: git ignores it in the workspace, so the workspace's checkpoints never see what changed
there. A session there takes checkpoints of that worktree, and `diff`, `undo`, `checkpoint` and `checkpoints`
run in it answer for it. Only a real linked worktree of the workspace's own repository counts (its `.git` file
validated by agentbox.git.dirs): anything else in that folder is the workspace's, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox.config.peek import WORKTREES_PARENT
from agentbox.git import store

WORKTREES = Path(WORKTREES_PARENT) / "worktrees"  # agentbox.session.worktrees.FOLDER


def checkpoint_root(cwd: Path, workspace: Path) -> Path:
    """The agentbox worktree of `workspace` that cwd lies in, else the workspace."""
    folder = Path(os.path.realpath(workspace)) / WORKTREES
    try:
        inside = Path(os.path.realpath(cwd)).relative_to(folder)
    except ValueError:
        return workspace
    if not inside.parts:
        return workspace
    tree = folder / inside.parts[0]
    return tree if is_worktree_of(tree, workspace) else workspace


def is_worktree_of(tree: Path, workspace: Path) -> bool:
    """Whether tree is a linked worktree of the workspace's repository, checked out at tree itself."""
    repo, main = store.find(tree), store.find(workspace)
    return (repo is not None and main is not None and repo.work_tree == Path(os.path.realpath(tree))
            and repo.git_dir != repo.common_dir and repo.common_dir == main.common_dir)


def ready(tree: Path, workspace: Path) -> bool:
    """Whether a worktree being made (`git worktree add` in the VM) is complete: git takes its `locked` note
    away once the checkout is done."""
    if not is_worktree_of(tree, workspace):
        return False
    repo = store.find(tree)
    return repo is not None and not os.path.lexists(repo.git_dir / "locked")
