"""Writes into the workspace that cannot be steered out of it: what `agentbox undo` uses to put files back.

The workspace is agent-writable. Any folder on the way to a file may have been replaced by a symlink
to the user's home, and a plain `open("a/b/file", "w")` would then write there. So every path is
walked one component at a time with folder descriptors (`O_DIRECTORY | O_NOFOLLOW`, `dir_fd=`), and
nothing here ever follows a symlink:

- writing a file: a component that is now a symlink, or a file where a folder belongs, is removed
  (the link itself, never its target) and replaced by a real folder, and that is reported; a missing
  folder is created. The file is written to a temp file in its own folder, synced and renamed over
  the old entry, so a symlink there is replaced, not written through.
- removing a file: a component that is not a real folder means the file is not in the workspace;
  nothing is removed. Folders that the removals leave empty are removed too, and only those.

Paths are relative to the workspace, as git writes them. An absolute path, a `..` or `.git`
component, an empty component or a NUL is refused: nothing in `.git` is ever written. With
`dry_run` the same walk only looks, and the result says what would change.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from agentbox.fsutil import file_kind

FILE = "file"
EXECUTABLE = "executable"
SYMLINK = "symlink"
REMOVE = "remove"
_MODES = {FILE: 0o644, EXECUTABLE: 0o755}

# What a Change says happened (or would happen, in a dry run).
RESTORED = "restored"
REMOVED = "removed"
REPLACED_LINK = "replaced link"  # a symlink where a folder belongs: the link was removed, a folder made
REPLACED_FILE = "replaced file"  # a file (or FIFO, socket...) where a folder belongs
REPLACED_FOLDER = "replaced folder"  # an empty folder where the file goes
CREATED_FOLDER = "created folder"
REMOVED_FOLDER = "removed folder"
LEFT_IN_PLACE = "left in place"  # something the caller asked not to overwrite is there

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Characters HFS+ ignores in names: `.g\u200cit` is `.git` on a Mac (git's own check, is_hfs_dotgit).
_HFS_IGNORED = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)


class Operation(NamedTuple):
    """One change to the workspace. kind: FILE (mode 0644), EXECUTABLE (0755), SYMLINK (data is the
    link's target) or REMOVE (a file or symlink). overwrite=False leaves whatever is already at path
    in place (reported as LEFT_IN_PLACE): for a file the caller did not see in the workspace, such as
    an ignored one."""

    kind: str
    path: str
    data: bytes = b""
    overwrite: bool = True


class Change(NamedTuple):
    action: str
    path: str
    detail: str = ""


class Failure(NamedTuple):
    path: str
    reason: str


@dataclass
class Result:
    changes: list[Change] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)


def path_problem(path: str) -> str | None:
    """Why path is not one restore writes (None when it is fine)."""
    if not path:
        return "the path is empty"
    if "\0" in path:
        return "the path contains a NUL character"
    if path.startswith("/"):
        return "the path is absolute"
    for part in path.split("/"):
        if part in ("", "."):
            return "the path has an empty or `.` component"
        if part == "..":
            return "the path has a `..` component"
        if _is_dot_git(part):
            return "the path is inside a `.git` folder"
    return None


def _is_dot_git(part: str) -> bool:
    return part.translate(_HFS_IGNORED).lower() == ".git"


def apply(workspace: Path, operations: Sequence[Operation], *, dry_run: bool = False) -> Result:
    """Carry out operations in workspace (a path the user gave, resolved); each failure is recorded
    and the rest go on. Removals run first, deepest paths first, then the writes."""
    result = Result()
    valid = []
    for operation in operations:
        problem = path_problem(operation.path) or (None if operation.kind in (*_MODES, SYMLINK, REMOVE)
                                                   else f"unknown operation {operation.kind!r}")
        if problem:
            result.failures.append(Failure(operation.path, f"refused: {problem}"))
        else:
            valid.append(operation)
    writes = sorted((op for op in valid if op.kind != REMOVE), key=lambda op: op.path)
    removals = sorted((op for op in valid if op.kind == REMOVE), key=lambda op: op.path, reverse=True)
    root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        run = _Run(root, dry_run, result, keep=folders_of(op.path for op in writes))
        for operation in removals:
            run.attempt(operation, run.remove)
        for operation in writes:
            run.attempt(operation, run.write)
    finally:
        os.close(root)
    return result


def folders_of(paths: Iterable[str]) -> set[str]:
    """Every folder on the way to paths (`a/b/c` -> `a`, `a/b`)."""
    folders: set[str] = set()
    for path in paths:
        parts = path.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return folders


class _Run:
    def __init__(self, root: int, dry_run: bool, result: Result, keep: set[str]) -> None:
        self.root = root
        self.dry_run = dry_run
        self.result = result
        self.keep = keep  # folders the writes need: never removed as "left empty"
        self.planned: set[str] = set()  # dry run: folders that would be created
        self.gone: dict[str, set[str]] = {}  # dry run: folder -> names that would be removed from it

    def attempt(self, operation: Operation, action: Callable[[Operation], None]) -> None:
        try:
            action(operation)
        except OSError as exc:
            self.result.failures.append(Failure(operation.path, _reason(exc)))

    def report(self, action: str, path: str, detail: str = "") -> None:
        self.result.changes.append(Change(action, path, detail))

    # -- walking ----------------------------------------------------------------------------------

    def folders(self, parts: list[str], create: bool) -> list[int] | None:
        """Descriptors of the folders from the workspace down to the one holding parts[-1] (the caller
        closes them). None when that folder does not exist as a real folder (create=False) or would
        only be created (a dry run)."""
        fds = [os.dup(self.root)]
        try:
            for index, name in enumerate(parts[:-1]):
                rel = "/".join(parts[: index + 1])
                if rel in self.planned:
                    self._plan_folders(parts, index + 1)
                    return None
                try:
                    fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
                    continue
                except OSError as exc:
                    if not _not_a_folder(exc):
                        raise
                if not create:
                    return None
                if not self._make_folder(fds[-1], name, rel):
                    self.planned.add(rel)
                    self._plan_folders(parts, index + 1)
                    return None
                fds.append(os.open(name, _DIR_FLAGS, dir_fd=fds[-1]))
            result, fds = fds, []
            return result
        finally:
            for fd in fds:
                os.close(fd)

    def _plan_folders(self, parts: list[str], start: int) -> None:
        """A dry run: the folders from parts[start] down would be created."""
        for index in range(start, len(parts) - 1):
            rel = "/".join(parts[: index + 1])
            if rel not in self.planned:
                self.planned.add(rel)
                self.report(CREATED_FOLDER, rel)

    def _make_folder(self, parent: int, name: str, rel: str) -> bool:
        """Make name (in parent) a real folder, replacing a link or file there. False in a dry run."""
        st = self._entry(parent, name, rel)
        if st is not None and stat.S_ISDIR(st.st_mode):
            return True  # it became a folder meanwhile: the caller opens it (never following a link)
        if st is not None and stat.S_ISLNK(st.st_mode):
            self.report(REPLACED_LINK, rel, _link_target(parent, name))
        elif st is not None:
            self.report(REPLACED_FILE, rel, file_kind(st.st_mode))
        else:
            self.report(CREATED_FOLDER, rel)
        if self.dry_run:
            return False
        if st is not None:
            os.unlink(name, dir_fd=parent)
        os.mkdir(name, 0o755, dir_fd=parent)
        return True

    def _entry(self, parent: int, name: str, rel: str) -> os.stat_result | None:
        """lstat of name in parent; None when absent, or removed earlier in this dry run."""
        if self.dry_run and name in self.gone.get(_parent_of(rel), ()):
            return None
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    # -- writing ----------------------------------------------------------------------------------

    def write(self, operation: Operation) -> None:
        parts = operation.path.split("/")
        fds = self.folders(parts, create=True)
        if fds is None:  # a dry run whose folders do not exist yet
            self.report(RESTORED, operation.path)
            return
        try:
            self._write_in(fds[-1], parts[-1], operation)
        finally:
            for fd in fds:
                os.close(fd)

    def _write_in(self, parent: int, name: str, operation: Operation) -> None:
        st = self._entry(parent, name, operation.path)
        if st is not None and not operation.overwrite:
            self.report(LEFT_IN_PLACE, operation.path, file_kind(st.st_mode))
            return
        if st is not None and stat.S_ISDIR(st.st_mode):
            if not self.dry_run:
                try:
                    os.rmdir(name, dir_fd=parent)
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        raise OSError(exc.errno, "a folder with files in it is there now") from None
                    raise
            elif _entries(parent, name):
                raise OSError(errno.ENOTEMPTY, "a folder with files in it is there now")
            self.report(REPLACED_FOLDER, operation.path)
        if not self.dry_run:
            _replace(parent, name, operation)
        self.report(RESTORED, operation.path)

    # -- removing ---------------------------------------------------------------------------------

    def remove(self, operation: Operation) -> None:
        parts = operation.path.split("/")
        fds = self.folders(parts, create=False)
        if fds is None:  # not in the workspace: a folder on the way is gone or not a folder
            return
        try:
            if self._remove_in(fds[-1], parts[-1], operation.path):
                self._remove_empty_folders(fds, parts)
        finally:
            for fd in fds:
                os.close(fd)

    def _remove_in(self, parent: int, name: str, path: str) -> bool:
        try:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, "it is a folder now; not removed")
        if self.dry_run:
            self.gone.setdefault(_parent_of(path), set()).add(name)
        else:
            os.unlink(name, dir_fd=parent)
        self.report(REMOVED, path)
        return True

    def _remove_empty_folders(self, fds: list[int], parts: list[str]) -> None:
        for depth in range(len(parts) - 1, 0, -1):
            rel = "/".join(parts[:depth])
            if rel in self.keep:
                return
            if self.dry_run:
                if set(os.listdir(fds[depth])) - self.gone.get(rel, set()):
                    return
                self.gone.setdefault(_parent_of(rel), set()).add(parts[depth - 1])
            else:
                try:
                    os.rmdir(parts[depth - 1], dir_fd=fds[depth - 1])
                except OSError:
                    return  # not empty (or no longer the folder we emptied): it stays
            self.report(REMOVED_FOLDER, rel)


def _replace(parent: int, name: str, operation: Operation) -> None:
    """Write operation's file or symlink next to name, then rename it over name (atomic)."""
    temp = f".agentbox-restore-{secrets.token_hex(6)}.tmp"
    try:
        if operation.kind == SYMLINK:
            os.symlink(operation.data, os.fsencode(temp), dir_fd=parent)
        else:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=parent)
            try:
                view = memoryview(operation.data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, _MODES[operation.kind])
                os.fsync(fd)
            finally:
                os.close(fd)
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=parent)
        except OSError:
            pass
        raise


def _entries(parent: int, name: str) -> list[str]:
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _not_a_folder(exc: OSError) -> bool:
    """open(O_DIRECTORY | O_NOFOLLOW) failed because the entry is missing, a symlink or not a folder."""
    return exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


def _parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def _link_target(parent: int, name: str) -> str:
    try:
        return "-> " + os.fsdecode(os.readlink(name, dir_fd=parent))
    except OSError:
        return ""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)
