"""Reading and tidying a folder of the VM's writable outbox (staging.outbox), which the agent may have written.

Everything is reached through folder descriptors opened with O_NOFOLLOW, so a symlink the VM put in place
of a folder or a file is never followed out of the outbox; files are read only when regular, and only up
to a limit (a FIFO never blocks, /dev/zero never fills the memory).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentbox.fsutil import private_dir

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 32
STALE_SEC = 24 * 3600


@contextmanager
def folder(outbox: Path, *parts: str, create: bool = False) -> Iterator[int]:
    """A descriptor of outbox/PARTS..., never through a symlink; with create, what stands in a folder's way is
    replaced. Raises OSError when it cannot be reached."""
    fd = os.open(private_dir(outbox) if create else outbox, DIR_FLAGS)
    try:
        for part in parts:
            child = open_dir(fd, part, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def fresh_folder(outbox: Path, *parts: str, prefix: str) -> Path:
    """A new folder outbox/PARTS.../PREFIX-RANDOM (0700) for the VM to answer in. Such folders older than a day
    (an agentbox killed before it read the answer) go."""
    with folder(outbox, *parts, create=True) as parent:
        cutoff = time.time() - STALE_SEC
        for entry in os.scandir(parent):
            try:
                if entry.name.startswith(f"{prefix}-") and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    remove(parent, entry.name)
            except OSError:
                continue
        while True:
            name = f"{prefix}-{secrets.token_hex(8)}"
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
                return outbox.joinpath(*parts, name)
            except FileExistsError:
                continue


def read(parent: int, name: str, limit: int) -> bytes | None:
    """The bytes of parent/name when it is a regular file of at most `limit` bytes, else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


def read_tail(parent: int, name: str, limit: int) -> bytes | None:
    """The last `limit` bytes of parent/name when it is a regular file, else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            handle.seek(st.st_size - limit)
        return handle.read(limit)


def remove(parent: int, name: str, depth: int = 0) -> None:
    """Remove parent/name and whatever the VM put in it, never following a link out of it."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return
        if depth > MAX_DEPTH:
            return  # a tree the VM nested this deep stays; it is in the VM's own folder
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            for child in os.listdir(fd):
                remove(fd, child, depth + 1)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    except OSError:
        pass


def remove_folder(outbox: Path, path: Path) -> None:
    """Remove `path`, a folder inside outbox, reaching it without following links."""
    try:
        parts = path.relative_to(outbox).parts
    except ValueError:
        return
    if not parts:
        return
    try:
        with folder(outbox, *parts[:-1]) as parent:
            remove(parent, parts[-1])
    except OSError:
        pass


def open_dir(parent: int, name: str, create: bool) -> int:
    """A folder under parent, never through a symlink; with create, whatever else is there is replaced."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        if not create or exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=parent)
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=parent)
