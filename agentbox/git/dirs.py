"""Where a workspace's git data lives, and whether agentbox may follow it out of the workspace.

A plain clone keeps everything in `<workspace>/.git`. A `git worktree add` checkout has a `.git`
file (`gitdir: <common>/worktrees/<id>`) whose `commondir` names the main repository's git folder,
which git in the VM needs mounted. It is mounted read-only, with only what git writes for this
checkout mounted writable on top (`vm_writable_parts`): the common dir's `config`, `hooks/`,
`info/`, `modules/` and the other worktrees' folders configure or point the user's other
checkouts, and the agent must not change them. The agent can write `.git` and anything it points to
inside the workspace, so these files are pointers an attacker controls: followed blindly, they
would have the next VM mount the user's home folder. `locate` is the one decision every caller
(the lima.yaml mounts, the tripwire, doctor) uses:

- pointer files (`.git`, `commondir`, the worktree's `gitdir`) are read only as regular files,
  never through a link, never blocking on a FIFO, at most 4 KiB;
- the common dir must look like a git folder (HEAD, objects/, refs/), hold this checkout's git
  folder as `worktrees/<id>`, and that folder's `gitdir` must point back to this workspace's
  `.git`: only `git worktree add` (run by the user on the host) leaves that behind outside the
  workspace;
- it must not be the home folder or contain it, nor be, contain or lie inside agentbox's state
  folder or LIMA_HOME (the VM could rewrite trust records or instance configs there).

A `.git` file naming a git folder inside the workspace without a `commondir` (`git init
--separate-git-dir`) needs no mount; it is followed for the tripwire only. Anything else is not
followed, with a reason the caller shows (escaped: it quotes agent-written paths).

`work_tree_top` finds the work tree a folder belongs to, without running git (a repository's own
config could make host git run a program): the nearest folder upward with a `.git` folder that
looks like one, or a `.git` file starting with `gitdir:` (a linked worktree or a submodule).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

from agentbox import paths, vmread
from agentbox.fsutil import file_kind
from agentbox.safetext import visible

MAX_POINTER = 4096


class GitDirs(NamedTuple):
    """git_dir: this checkout's own git folder; common_dir: the repository's shared one (the same
    folder for a plain clone). Both are resolved real paths, or None when there is no git data
    agentbox may follow; `problem` then says why a `.git` that exists was not followed."""

    git_dir: Path | None
    common_dir: Path | None
    problem: str | None = None

    def common_dir_outside(self, workspace: Path) -> Path | None:
        """The common dir when it lies outside the workspace, so the VM needs it mounted."""
        if self.common_dir is None or _inside(self.common_dir, Path(os.path.realpath(workspace))):
            return None
        return self.common_dir


# What git writes in the common dir for a linked worktree, each mounted writable in the VM when it is
# a real folder: the object store, refs and reflogs (loose refs and their lock files live there),
# the reftable store of a repository that uses it, rerere's records and git-lfs's objects. Not the
# top folder itself: `config` is replaced by a rename there, and a single file cannot be mounted.
# So what git writes at the top (packed-refs, deleting or renaming a ref that is packed, gc.pid,
# shallow) fails in the VM.
VM_WRITABLE = ("objects", "refs", "logs", "reftable", "rr-cache", "lfs")


class WritableParts(NamedTuple):
    """The folders of a linked worktree's common dir the VM may write, and why any other was left out."""

    folders: list[Path]
    skipped: list[str]


def vm_writable_parts(git: GitDirs) -> WritableParts:
    """For a validated linked worktree: VM_WRITABLE's real folders in the common dir, then this
    checkout's own `worktrees/<id>` (already resolved by locate). A link in place of one of them
    is not mounted (it could point anywhere), and said."""
    if git.common_dir is None or git.git_dir is None or git.git_dir == git.common_dir:
        return WritableParts([], [])
    folders: list[Path] = []
    skipped: list[str] = []
    for name in VM_WRITABLE:
        path = git.common_dir / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue  # git has not made it: nothing to write there yet
        if stat.S_ISDIR(mode):
            folders.append(path)
        else:
            skipped.append(f"{visible(str(path))} is {file_kind(mode)}, not a folder")
    if visible(str(git.git_dir)) == str(git.git_dir):
        folders.append(git.git_dir)
    else:
        skipped.append(f"the path {visible(str(git.git_dir))} contains control or invisible characters")
    return WritableParts(folders, skipped)


class _Refused(Exception):
    pass


def locate(workspace: Path) -> GitDirs:
    """Where the workspace's git data lives, as far as agentbox may follow it."""
    workspace = Path(os.path.realpath(workspace))
    dot_git = workspace / ".git"
    try:
        st = os.lstat(dot_git)
    except OSError:
        return GitDirs(None, None)
    if stat.S_ISDIR(st.st_mode):
        return GitDirs(dot_git, dot_git)
    try:
        return _follow(workspace, dot_git)
    except _Refused as refused:
        return GitDirs(None, None, str(refused))


def work_tree_top(start: Path, stop: Path) -> Path | None:
    """The top of the git work tree containing start (a resolved path), or None.

    The walk never looks at stop (the home folder) or at any folder containing it: a dotfiles
    repository in the home folder would otherwise make every folder below it part of one work tree
    whose top (the home folder) can never be a workspace.
    """
    for directory in (start, *start.parents):
        if directory == stop or directory in stop.parents:
            return None
        if _is_git_marker(directory / ".git"):
            return directory
    return None


def _is_git_marker(dot_git: Path) -> bool:
    """A `.git` folder holding HEAD, objects/ and refs/, or a small regular `gitdir:` file (never followed)."""
    try:
        mode = os.lstat(dot_git).st_mode
    except OSError:
        return False
    if stat.S_ISDIR(mode):
        try:
            _require_git_folder(dot_git)
        except _Refused:
            return False
        return True
    try:
        return stat.S_ISREG(mode) and _read_pointer(dot_git).startswith("gitdir:")
    except _Refused:
        return False


def _read_pointer(path: Path) -> str:
    """A small text file the agent may have written: regular, not a link, at most MAX_POINTER bytes, read
    through agentbox's one reader of what the VM writes (agentbox.vmread).

    Raises _Refused naming the file and what is wrong with it.
    """
    try:
        data = vmread.read_path(path, MAX_POINTER)
    except vmread.Refused as refused:
        raise _Refused(refused.message) from None
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise _Refused(f"{visible(str(path))} is not UTF-8 text") from None


def _follow(workspace: Path, dot_git: Path) -> GitDirs:
    text = _read_pointer(dot_git)
    if not text.startswith("gitdir:"):
        raise _Refused(f"{visible(str(dot_git))} is neither a folder nor a `gitdir:` file")
    git_dir = _resolve(dot_git.parent, text[len("gitdir:"):].strip())
    try:
        common_text = _read_pointer(git_dir / "commondir")
    except _Refused as refused:
        if os.path.lexists(git_dir / "commondir") or not _inside(git_dir, workspace):
            raise _Refused(f"{visible(str(dot_git))} points to {visible(str(git_dir))}, which is not a "
                           f"`git worktree` folder: {refused}") from None
        # `git init --separate-git-dir` inside the workspace: nothing to mount, the tripwire may look at it.
        _require_git_folder(git_dir)
        return GitDirs(git_dir, git_dir)
    common = _resolve(git_dir, common_text)
    shown = visible(str(common))
    _require_git_folder(common)
    if git_dir.parent != common / "worktrees":
        raise _Refused(f"{visible(str(dot_git))} points to {visible(str(git_dir))}, which is not in "
                       f"{shown}/worktrees")
    back = _resolve(git_dir, _read_pointer(git_dir / "gitdir"))
    if back != dot_git:
        raise _Refused(f"{visible(str(git_dir / 'gitdir'))} names {visible(str(back))}, not this workspace's "
                       f"{visible(str(dot_git))}")
    if not _inside(common, workspace):
        _require_mountable(common, shown)
    return GitDirs(git_dir, common)


def _require_git_folder(folder: Path) -> None:
    shown = visible(str(folder))
    for name, is_kind, kind in (("HEAD", stat.S_ISREG, "file"), ("objects", stat.S_ISDIR, "folder"),
                                ("refs", stat.S_ISDIR, "folder")):
        try:
            mode = os.lstat(folder / name).st_mode
        except OSError:
            raise _Refused(f"{shown} is not a git folder (it has no {name} {kind})") from None
        if not is_kind(mode):
            raise _Refused(f"{shown} is not a git folder (its {name} is {file_kind(mode)})")


def _require_mountable(common: Path, shown: str) -> None:
    if shown != str(common):
        raise _Refused(f"the path {shown} contains control or invisible characters")
    problem = paths.mount_target_problem(common)
    if problem:
        raise _Refused(f"{shown}: {problem}")


def _resolve(base: Path, value: str) -> Path:
    return Path(os.path.realpath(os.path.join(base, value)))


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents
