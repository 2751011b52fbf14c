"""The one reader of what the VM writes: the outbox (task records and outputs, proposals, credential
write-back, markers) and the git pointer files of a workspace.

The agent is root in the VM, so every byte here is the attacker's. The rules, the same for every reader:
- folders are reached component by component from a trusted root with O_DIRECTORY|O_NOFOLLOW, so a
  symlink the VM put in place of a folder is never followed out of it;
- files are opened with O_NOFOLLOW|O_NONBLOCK and taken only when fstat says regular, so a FIFO never
  blocks and a device never fills the memory; at most cap+1 bytes are read (more is refused);
- walks are bounded in depth and entries, and list regular files only;
- what is printed goes through `shown` (agentbox.safetext.visible), never raw.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from agentbox.fsutil import file_kind, private_dir, read_capped
from agentbox.safetext import visible

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 32
MAX_ENTRIES = 10_000
STALE_SEC = 24 * 3600

# Refused.why: what was wrong, for callers that treat some cases as "absent".
MISSING, LINK, SPECIAL, TOO_LARGE, UNREADABLE = "missing", "link", "special", "too large", "unreadable"


class Refused(Exception):
    """A file or folder the VM wrote that agentbox does not read: `what` (shown, escaped) `reason`."""

    def __init__(self, what: str, reason: str, why: str) -> None:
        super().__init__(f"{what} {reason}")
        self.message = f"{what} {reason}"
        self.what = what
        self.reason = reason  # "is a symbolic link, which agentbox does not follow", ...
        self.why = why  # MISSING, LINK, ...


def shown(text: str) -> str:
    """The printing rule: a name or text the VM wrote, with its control characters escaped."""
    return visible(text)


# -- folders ----------------------------------------------------------------------------------------


@contextmanager
def folder(root: Path, *parts: str, create: bool = False) -> Iterator[int]:
    """A descriptor of root/PARTS..., root trusted (agentbox's own), each part opened without following a
    link; with create, what stands in a folder's way is replaced. Raises OSError when it cannot be reached."""
    top = os.open(private_dir(root) if create else root, DIR_FLAGS)
    try:
        fd = open_dirs(top, parts, create)
    finally:
        os.close(top)
    try:
        yield fd
    finally:
        os.close(fd)


def open_dirs(parent: int, parts: Iterable[str], create: bool = False, mode: int = 0o700) -> int:
    """A new descriptor of parent/PARTS..., each part opened as open_dir does (never through a link; with create,
    what stands in a folder's way is replaced by a new folder of that mode)."""
    fd = os.dup(parent)
    try:
        for part in parts:
            child = open_dir(fd, part, create, mode)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def single(name: str) -> bool:
    """Whether name is one entry of its folder: no "/" (its folders would be followed were they links), not ".."."""
    return "/" not in name and name not in (".", "..")


def open_dir(parent: int, name: str, create: bool = False, mode: int = 0o700) -> int:
    """A folder under parent, never through a symlink; with create, whatever else is there is replaced (the link
    or file itself, never what a link points to) by a new folder of that mode."""
    if not single(name):
        raise OSError(errno.EINVAL, f"{shown(name)} is not a single folder name")
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
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=parent)


def fresh_folder(root: Path, *parts: str, prefix: str) -> Path:
    """A new folder root/PARTS.../PREFIX-RANDOM (0700) for the VM to answer in. Such folders older than a day
    (an agentbox killed before it read the answer) go."""
    with folder(root, *parts, create=True) as parent:
        remove_stale(parent, f"{prefix}-")
        while True:
            name = f"{prefix}-{secrets.token_hex(8)}"
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
                return root.joinpath(*parts, name)
            except FileExistsError:
                continue


def remove_stale(parent: int, prefix: str = "") -> None:
    """Entries of parent starting with prefix and older than a day go (the VM's leftovers)."""
    cutoff = time.time() - STALE_SEC
    for entry in os.scandir(parent):
        try:
            if entry.name.startswith(prefix) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                remove(parent, entry.name)
        except OSError:
            continue


# -- files ------------------------------------------------------------------------------------------


def open_regular(parent: int, name: str) -> tuple[int, os.stat_result]:
    """A read descriptor on parent/name and its stat, when it is a regular file reached without a link. Looked
    at before opening (a FIFO or a device is never opened) and again on what was opened (not swapped meanwhile).
    Raises Refused naming the file and why."""
    if not single(name):
        raise Refused(shown(name), "is not a single file name", SPECIAL)
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise Refused(shown(name), "does not exist", MISSING) from None
    except OSError as exc:
        raise Refused(shown(name), f"cannot be read ({exc.strerror})", UNREADABLE) from None
    if stat.S_ISLNK(before.st_mode):
        raise Refused(shown(name), "is a symbolic link, which agentbox does not follow", LINK)
    if not stat.S_ISREG(before.st_mode):
        raise Refused(shown(name), f"is {file_kind(before.st_mode)}, not a regular file", SPECIAL)
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise Refused(shown(name), "does not exist", MISSING) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(shown(name), "is a symbolic link, which agentbox does not follow", LINK) from None
        raise Refused(shown(name), f"cannot be opened ({exc.strerror})", UNREADABLE) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
        os.close(fd)
        raise Refused(shown(name), "was replaced while agentbox opened it", SPECIAL)
    return fd, st


def read_checked(parent: int, name: str, cap: int) -> tuple[bytes, os.stat_result]:
    """The bytes (at most cap) and stat of parent/name, a regular file reached without a link; else Refused."""
    fd, st = open_regular(parent, name)
    with os.fdopen(fd, "rb") as handle:
        data = read_capped(handle.fileno(), cap)
    if len(data) > cap:
        raise Refused(shown(name), f"is larger than {cap:,} bytes, the most agentbox reads", TOO_LARGE)
    return data, st


def read_at(parent: int, name: str, cap: int) -> bytes | None:
    """parent/name's bytes, None when absent; Refused when it is a link, not regular or larger than cap."""
    try:
        return read_checked(parent, name, cap)[0]
    except Refused as refused:
        if refused.why == MISSING:
            return None
        raise


def read(parent: int, name: str, cap: int) -> bytes | None:
    """parent/name's bytes when it is a regular file of at most cap bytes, else None (for readers to which
    anything else is the same as no answer)."""
    try:
        return read_checked(parent, name, cap)[0]
    except Refused:
        return None


def read_tail(parent: int, name: str, cap: int) -> bytes | None:
    """The last cap bytes of parent/name when it is a regular file, else None."""
    try:
        fd, st = open_regular(parent, name)
    except Refused:
        return None
    with os.fdopen(fd, "rb") as handle:
        if st.st_size > cap:
            handle.seek(st.st_size - cap)
        return handle.read(cap)


def read_path(path: Path, cap: int, below: Path | None = None) -> bytes:
    """A single file by absolute path (a git pointer file, say): regular, at most cap bytes, never blocking.

    With `below` (a trusted folder containing path), every component after it is opened without following a
    link; without, only the last one is (its folders are the user's, reached as the user made them).
    Raises Refused naming the path and why: missing, a link, not regular, too large or unreadable.
    """
    full = visible(str(path))
    if below is None:
        start, parts = path.parent, [path.name]
    else:
        start, parts = below, list(path.relative_to(below).parts)
        if not parts:
            raise Refused(full, "is a folder, not a file", SPECIAL)
    try:
        root = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Refused(full, "does not exist", MISSING) from None
    except OSError as exc:
        raise Refused(full, f"cannot be read ({exc.strerror})", UNREADABLE) from None
    fds = [root]
    try:
        for part in parts[:-1]:
            try:
                fds.append(os.open(part, DIR_FLAGS, dir_fd=fds[-1]))
            except FileNotFoundError:
                raise Refused(full, "does not exist", MISSING) from None
            except OSError as exc:
                why = LINK if exc.errno in (errno.ELOOP, errno.ENOTDIR) else UNREADABLE
                detail = "a symbolic link or not a folder" if why == LINK else exc.strerror
                raise Refused(full, f"cannot be read ({visible(part)} on its way is {detail})", why) from None
        try:
            return read_checked(fds[-1], parts[-1], cap)[0]
        except Refused as refused:
            raise Refused(full, refused.reason, refused.why) from None
    finally:
        for fd in fds:
            os.close(fd)


def read_path_or_none(path: Path, cap: int) -> bytes | None:
    """read_path for a file that may as well be absent: None when it is missing, a link or not regular;
    Refused (too large, unreadable) is left to the caller. This is what hostgit's `_read_regular` does."""
    try:
        return read_path(path, cap)
    except Refused as refused:
        if refused.why in (MISSING, LINK, SPECIAL):
            return None
        raise


# -- walking ----------------------------------------------------------------------------------------


class Found(NamedTuple):
    relative: str  # below the walked folder, "/"-separated
    size: int


def walk(parent: int, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> tuple[list[Found], list[str]]:
    """The regular files below parent (no link followed), and what was passed over and why (links, special
    files, too deep, too many entries), both in name order."""
    found: list[Found] = []
    passed: list[str] = []
    seen = 0

    def visit(fd: int, prefix: str, depth: int) -> None:
        nonlocal seen
        for name in sorted(os.listdir(fd)):
            seen += 1
            relative = prefix + name
            if seen > max_entries:
                passed.append(f"{shown(relative)}: more than {max_entries:,} entries, the rest is not read")
                return
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                found.append(Found(relative, st.st_size))
            elif stat.S_ISDIR(st.st_mode):
                if depth >= max_depth:
                    passed.append(f"{shown(relative)}: nested more than {max_depth} folders deep")
                    continue
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    passed.append(f"{shown(relative)}: was replaced while agentbox read it")
                    continue
                try:
                    visit(child, relative + "/", depth + 1)
                finally:
                    os.close(child)
            else:
                passed.append(f"{shown(relative)}: {file_kind(st.st_mode)}, not a regular file")

    visit(parent, "", 0)
    return found, passed


# -- tidying ----------------------------------------------------------------------------------------


def remove(parent: int, name: str, depth: int = 0) -> bool:
    """Remove parent/name and whatever the VM put in it, never following a link out of it. False when
    something stays (nested more than MAX_DEPTH deep, or not removable)."""
    if not single(name):
        return False
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)
            return True
        if depth > MAX_DEPTH:
            return False  # a tree the VM nested this deep stays; it is in the VM's own folder
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        try:
            for child in os.listdir(fd):
                remove(fd, child, depth + 1)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def remove_folder(root: Path, path: Path) -> None:
    """Remove `path`, a folder inside root, reaching it without following links."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return
    if not parts:
        return
    try:
        with folder(root, *parts[:-1]) as parent:
            remove(parent, parts[-1])
    except OSError:
        pass
