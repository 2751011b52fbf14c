"""Where a workspace's git data lives: `.git` itself, or for a worktree the folders it points to."""

import os
import stat
from pathlib import Path


def git_dirs(workspace: Path) -> tuple[Path | None, Path | None]:
    """(git dir, common dir): the same `.git` folder for a plain clone, different for a worktree.

    Only reads `.git` (never follows it as a link or opens a FIFO), since the agent can write it.
    """
    dot_git = workspace / ".git"
    try:
        st = os.lstat(dot_git)
    except OSError:
        return None, None
    if stat.S_ISDIR(st.st_mode):
        return dot_git, dot_git
    if not stat.S_ISREG(st.st_mode):
        return None, None
    try:
        text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None, None
    if not text.startswith("gitdir:"):
        return None, None
    git_dir = Path(text[len("gitdir:"):].strip())
    git_dir = git_dir if git_dir.is_absolute() else workspace / git_dir
    try:
        common = (git_dir / "commondir").read_text().strip()
    except OSError:
        return git_dir, git_dir
    common_dir = Path(common) if Path(common).is_absolute() else git_dir / common
    return git_dir, common_dir.resolve()
