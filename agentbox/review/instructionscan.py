"""What the workspace's instruction files are now: one bounded walk, never following a link, never opening a FIFO.

Every path of the list (agentbox.review.instructionfiles) is reached component by component from the workspace
with O_NOFOLLOW (agentbox.vmread's rules): a symbolic link anywhere on the way is an entry itself (its target
text), a FIFO, socket or device is an entry "not a regular file", a file over MAX_HELD bytes is "too big"; a
listed folder is walked to MAX_DEPTH folders and MAX_ENTRIES entries, and what lies past that is named in
`passed`. The same walk gives the stat signature (path, inode, size, mtime, ctime, mode of every path and folder
it met): when it equals the one recorded, nothing changed and no file is read.

A `**/NAME` entry (ANYWHERE) is a file of that name in any folder: one walk of the workspace's folders, never
through a link, never into SKIPPED, to MAX_TREE_DEPTH folders deep and MAX_TREE_FOLDERS folders (what lies past is
in `passed`). Adding, removing or renaming an entry changes its folder's mtime and ctime, so a folder whose
(inode, mtime, ctime) is the one recorded holds what it held: the walk keeps each folder's subfolders and matching
names (`tree`) and lists again only a folder whose stat changed, or that changed within RACY_NS of its listing
(a change in the same clock tick as the listing would leave its stat as it was). A warm check is then one lstat
per folder.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from agentbox import vmread
from agentbox.fsutil import file_kind

MAX_HELD = 1024 * 1024  # bytes of one instruction file agentbox copies; a larger one is held as "too big"
MAX_DEPTH = 8  # folders below a listed folder that are walked
MAX_ENTRIES = 2000  # entries of all listed folders together that are looked at

FILE, LINK, OTHER, BIG = "file", "link", "other", "big"

ANYWHERE = "**/"  # a list entry "**/NAME": a file of that name in any folder of the workspace
# Folders the walk for ANYWHERE names does not enter: git's own, and those that hold dependencies, virtual
# environments, caches and build output rather than the project's sources. They are made and refilled by tools
# (a node_modules holds tens of thousands of entries), an agent seldom works in them, and walking them would
# cost every launch; docs/instructions.md says they are not watched.
SKIPPED = frozenset({
    ".git", ".hg", ".svn", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".nox", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".cache", "target", "dist", "build", ".next", ".gradle", ".terraform",
})
MAX_TREE_DEPTH = 16  # folders below the workspace searched for ANYWHERE names
MAX_TREE_FOLDERS = 20_000  # folders of the workspace searched for them
RACY_NS = 2_000_000_000  # a folder changed this close to its listing is listed again next time (2 s: FAT's tick)


class Folder(NamedTuple):
    """A folder the ANYWHERE walk went through: its stat, and what it held when listed (settled False: it changed
    too close to the listing to trust it, list it again next time)."""

    ino: int
    mtime: int
    ctime: int
    folders: tuple[str, ...]
    found: tuple[str, ...]
    settled: bool = True


class Entry(NamedTuple):
    """One path's state: a regular file (its sha256 and permission bits), a link (its target), something else
    (what it is), or a file too big to copy (its size)."""

    kind: str
    value: str
    mode: int = 0

    def describe(self) -> str:
        """What it is, in words (the value of a link is the VM's text: escaped when shown)."""
        if self.kind == FILE:
            return "text"
        if self.kind == LINK:
            return f"a symbolic link to {vmread.shown(self.value)}"
        if self.kind == BIG:
            return f"too big ({int(self.value):,} bytes, over the {MAX_HELD:,} agentbox copies)"
        return f"not a regular file ({self.value})"


class Scan(NamedTuple):
    entries: dict[str, Entry]  # label (workspace-relative) -> entry; absent paths are not in it
    signature: str
    passed: list[str]  # what the walk did not look at, and why (escaped)
    data: dict[str, bytes]  # a regular file's sha256 -> its bytes (contents read only)
    tree: Mapping[str, Folder] = MappingProxyType({})  # the ANYWHERE walk's folders ("": the workspace)


def scan(workspace: Path, files: Iterable[str], contents: bool = True,
         tree: Mapping[str, Folder] | None = None, known: Iterable[str] = ()) -> Scan:
    """The listed paths as they are; without `contents`, only the signature (no file is opened). `tree`: the
    folders a previous scan went through, whose listings are kept while their stat holds. `known`: files an
    ANYWHERE walk found before, looked at alone (a launch's check: no walk; a folder on the way that is not a
    real folder any more makes the file absent, it is no entry itself)."""
    walk = _Walk(contents)
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Scan({}, "", [], {})
    anywhere: set[str] = set()
    try:
        for listed in files:
            if listed.startswith(ANYWHERE):
                anywhere.add(listed[len(ANYWHERE):].casefold())
                continue
            parts = [part for part in listed.strip("/").split("/") if part]
            if parts and all(vmread.single(part) for part in parts):
                walk.path(root, parts, listed.endswith("/"))
        for label in known:
            parts = label.split("/")
            if all(vmread.single(part) for part in parts):
                walk.path(root, parts, False, nested=True)
        if anywhere:
            _Tree(walk, root, frozenset(anywhere), tree or {}).run()
    finally:
        os.close(root)
    return Scan(walk.entries, hashlib.sha256(repr(walk.stats).encode()).hexdigest(), walk.passed, walk.data,
                walk.tree)


class _Walk:
    def __init__(self, contents: bool) -> None:
        self.contents = contents
        self.entries: dict[str, Entry] = {}
        self.stats: list[tuple[object, ...]] = []
        self.passed: list[str] = []
        self.data: dict[str, bytes] = {}
        self.tree: dict[str, Folder] = {}
        self.seen = 0

    def path(self, root: int, parts: list[str], folder: bool, nested: bool = False) -> None:
        fd = os.dup(root)
        try:
            for index, part in enumerate(parts):
                label = "/".join(parts[:index + 1])
                st = self.look(fd, part, label)
                if st is None:
                    return
                last = index == len(parts) - 1
                if nested and not last and not stat.S_ISDIR(st.st_mode):
                    return  # the folders on a found file's way are no instruction files themselves
                if not stat.S_ISDIR(st.st_mode) or (last and not folder):
                    self.entries[label] = self.entry(fd, part, st)
                    return
                child = self.enter(fd, part, label)
                if child is None:
                    return
                os.close(fd)
                fd = child
            self.folder(fd, "/".join(parts), 0)
        finally:
            os.close(fd)

    def look(self, fd: int, name: str, label: str) -> os.stat_result | None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            self.stats.append((label,))
            return None
        except OSError as exc:
            self.entries[label] = Entry(OTHER, f"unreadable: {exc.strerror}")
            return None
        self.stats.append((label, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode))
        return st

    def enter(self, fd: int, name: str, label: str) -> int | None:
        try:
            return os.open(name, vmread.DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            replaced = "replaced while agentbox read it" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
            self.entries[label] = Entry(OTHER, f"unreadable: {replaced}")
            return None

    def folder(self, fd: int, label: str, depth: int) -> None:
        try:
            names = sorted(os.listdir(fd))
        except OSError as exc:
            self.passed.append(f"{vmread.shown(label)}/: cannot be listed ({exc.strerror})")
            return
        for name in names:
            self.seen += 1
            child_label = f"{label}/{name}"
            if self.seen > MAX_ENTRIES:
                self.passed.append(f"{vmread.shown(label)}/: more than {MAX_ENTRIES:,} entries in the instruction "
                                   "folders, the rest is not looked at")
                return
            st = self.look(fd, name, child_label)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode):
                self.entries[child_label] = self.entry(fd, name, st)
                continue
            if depth + 1 >= MAX_DEPTH:
                self.passed.append(f"{vmread.shown(child_label)}/: nested more than {MAX_DEPTH} folders deep, "
                                   "not looked at")
                continue
            child = self.enter(fd, name, child_label)
            if child is not None:
                try:
                    self.folder(child, child_label, depth + 1)
                finally:
                    os.close(child)

    def entry(self, fd: int, name: str, st: os.stat_result) -> Entry:
        if stat.S_ISLNK(st.st_mode):
            try:
                return Entry(LINK, os.readlink(name, dir_fd=fd))
            except OSError:
                return Entry(LINK, "?")
        if not stat.S_ISREG(st.st_mode):
            return Entry(OTHER, file_kind(st.st_mode))
        mode = stat.S_IMODE(st.st_mode)
        if st.st_size > MAX_HELD:
            return Entry(BIG, str(st.st_size), mode)
        if not self.contents:
            return Entry(FILE, "", mode)
        try:
            data, opened = vmread.read_checked(fd, name, MAX_HELD)
        except vmread.Refused as refused:
            if refused.why == vmread.TOO_LARGE:
                return Entry(BIG, str(st.st_size), mode)
            return Entry(OTHER, refused.reason)
        digest = hashlib.sha256(data).hexdigest()
        self.data[digest] = data
        return Entry(FILE, digest, stat.S_IMODE(opened.st_mode))


class _Tree:
    """The walk for ANYWHERE names through the workspace's folders (depth first, in name order)."""

    def __init__(self, walk: _Walk, root: int, names: frozenset[str], cache: Mapping[str, Folder]) -> None:
        self.walk, self.root, self.names, self.cache = walk, root, names, cache
        self.deep: list[str] = []

    def run(self) -> None:
        stack = [("", 0)]
        while stack:
            label, depth = stack.pop()
            if len(self.walk.tree) >= MAX_TREE_FOLDERS:
                self.walk.passed.append(f"more than {MAX_TREE_FOLDERS:,} folders in the workspace: the rest is not "
                                        "searched for instruction files")
                break
            held = self.visit(label)
            for name in reversed(held.folders):
                if name in SKIPPED:
                    continue
                if depth + 1 > MAX_TREE_DEPTH:
                    self.deep.append(f"{label}/{name}")
                else:
                    stack.append((f"{label}/{name}" if label else name, depth + 1))
        if self.deep:
            shown = ", ".join(f"{vmread.shown(label)}/" for label in self.deep[:3])
            more = f" and {len(self.deep) - 3:,} more" if len(self.deep) > 3 else ""
            self.walk.passed.append(f"{shown}{more}: nested more than {MAX_TREE_DEPTH} folders deep, not searched "
                                    "for instruction files")

    def visit(self, label: str) -> Folder:
        """A folder's stat into the signature; its listing kept or made; its matching names as entries."""
        empty = Folder(0, 0, 0, (), (), False)
        try:
            st = os.stat(label or ".", dir_fd=self.root, follow_symlinks=False)
        except OSError:
            self.walk.stats.append((label,))
            return empty
        self.walk.stats.append((label, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
        if not stat.S_ISDIR(st.st_mode):
            return empty
        old = self.cache.get(label)
        if old is not None and old.settled and old[:3] == (st.st_ino, st.st_mtime_ns, st.st_ctime_ns):
            found = old
            if found.found:
                self.files(label, found.found, None)
        else:
            found = self.listed(label, st)
        self.walk.tree[label] = found
        return found

    def listed(self, label: str, st: os.stat_result) -> Folder:
        fd = self.open(label)
        if fd is None:
            self.walk.passed.append(f"{vmread.shown(label or '.')}/: cannot be listed, not searched for instruction "
                                    "files")
            return Folder(st.st_ino, st.st_mtime_ns, st.st_ctime_ns, (), (), False)
        try:
            listed_at = time.time_ns()
            folders, found = [], []
            try:
                with os.scandir(fd) as entries:
                    for item in entries:
                        if item.name.casefold() in self.names:
                            found.append(item.name)
                        if item.is_dir(follow_symlinks=False):
                            folders.append(item.name)
            except OSError:
                folders = []
            now = os.fstat(fd)
            self.files(label, sorted(found), fd)
        finally:
            os.close(fd)
        settled = now.st_ino == st.st_ino and max(now.st_mtime_ns, now.st_ctime_ns) < listed_at - RACY_NS
        return Folder(st.st_ino, st.st_mtime_ns, st.st_ctime_ns, tuple(sorted(folders)), tuple(sorted(found)),
                      settled)

    def open(self, label: str) -> int | None:
        """The folder, each part opened without following a link (None: it is gone or became something else)."""
        fd = os.dup(self.root)
        try:
            for part in label.split("/") if label else ():
                child = os.open(part, vmread.DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except OSError:
            os.close(fd)
            return None
        return fd

    def files(self, label: str, names: Iterable[str], fd: int | None) -> None:
        """The matching names of a folder: their stats into the signature, their entries (contents: read)."""
        opened = None
        try:
            for name in names:
                path = f"{label}/{name}" if label else name
                if not self.walk.contents:
                    self.walk.look(self.root, path, path)  # the stat alone: a warm check opens nothing
                    continue
                if fd is None:
                    fd = opened = self.open(label)
                    if fd is None:
                        return
                st = self.walk.look(fd, name, path)
                if st is not None:
                    self.walk.entries[path] = self.walk.entry(fd, name, st)
        finally:
            if opened is not None:
                os.close(opened)
