"""What the workspace's instruction files are now: one bounded walk, never following a link, never opening a FIFO.

Every path of the list (agentbox.review.instructionfiles) is reached component by component from the workspace
with O_NOFOLLOW (agentbox.vmread's rules): a symbolic link anywhere on the way is an entry itself (its target
text), a FIFO, socket or device is an entry "not a regular file", a file over MAX_HELD bytes is "too big"; a
listed folder is walked to MAX_DEPTH folders and MAX_ENTRIES entries, and what lies past that is named in
`passed`. The same walk gives the stat signature (path, inode, size, mtime, ctime, mode of every path and folder
it met): when it equals the one recorded, nothing changed and no file is read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from agentbox import vmread
from agentbox.fsutil import file_kind

MAX_HELD = 1024 * 1024  # bytes of one instruction file agentbox copies; a larger one is held as "too big"
MAX_DEPTH = 8  # folders below a listed folder that are walked
MAX_ENTRIES = 2000  # entries of all listed folders together that are looked at

FILE, LINK, OTHER, BIG = "file", "link", "other", "big"


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


def scan(workspace: Path, files: Iterable[str], contents: bool = True) -> Scan:
    """The listed paths as they are; without `contents`, only the signature (no file is opened)."""
    walk = _Walk(contents)
    try:
        root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return Scan({}, "", [], {})
    try:
        for listed in files:
            parts = [part for part in listed.strip("/").split("/") if part]
            if parts and all(vmread.single(part) for part in parts):
                walk.path(root, parts, listed.endswith("/"))
    finally:
        os.close(root)
    return Scan(walk.entries, hashlib.sha256(repr(walk.stats).encode()).hexdigest(), walk.passed, walk.data)


class _Walk:
    def __init__(self, contents: bool) -> None:
        self.contents = contents
        self.entries: dict[str, Entry] = {}
        self.stats: list[tuple[object, ...]] = []
        self.passed: list[str] = []
        self.data: dict[str, bytes] = {}
        self.seen = 0

    def path(self, root: int, parts: list[str], folder: bool) -> None:
        fd = os.dup(root)
        try:
            for index, part in enumerate(parts):
                label = "/".join(parts[:index + 1])
                st = self.look(fd, part, label)
                if st is None:
                    return
                last = index == len(parts) - 1
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
