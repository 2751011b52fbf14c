"""Small file-system and process helpers: atomic writes that never leave half-written files behind, locks."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agentbox.progress import note


def atomic_write(path: Path, content: str | bytes, mode: int = 0o644, overwrite: bool = True,
                 durable: bool = True) -> None:
    """Write content to path via a temp file in the same folder.

    With overwrite=False an existing file is never replaced (FileExistsError), even in a race. durable=False
    skips the fsync, for files that describe a running process and mean nothing after a crash.
    """
    data = content.encode() if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def write_if_changed(path: Path, data: bytes, mode: int = 0o600) -> None:
    """atomic_write, skipped when the file already holds exactly data with that mode (the launch path)."""
    try:
        if path.read_bytes() == data and (os.stat(path).st_mode & 0o777) == mode:
            return
    except OSError:
        pass
    atomic_write(path, data, mode=mode)


def file_kind(mode: int) -> str:
    """What a file is, in words for a message ("... is a FIFO (named pipe), not a regular file")."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def private_dir(path: Path) -> Path:
    """A folder only the user can enter (0700), created if needed."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if stat.S_IMODE(os.stat(path).st_mode) != 0o700:  # a chmod that changes nothing still changes its ctime
        os.chmod(path, 0o700)
    return path


def private_parents(root: Path, directory: Path) -> None:
    """directory and every folder from root down to it: 0700 (mkdir(parents=True) would give the umask's mode).
    A directory already 0700 is taken as made, so a folder of many files costs one stat per file."""
    if directory.is_dir() and (directory.stat().st_mode & 0o7777) == 0o700:
        return
    current = private_dir(root)
    for part in directory.relative_to(root).parts:
        current = private_dir(current / part)


def held(lock: Path) -> bool:
    """Whether a process holds a flock on `lock` (a probe: it takes nothing)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def remove_unlisted(root: Path, keep: set[str]) -> None:
    """Remove every file below root whose path relative to it is not in keep, every symlink (agentbox makes
    none there) and the folders that leaves empty."""
    if not root.exists():
        return
    for path in sorted(root.rglob("*"), reverse=True):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink() or (path.is_file() and relative not in keep):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


_GROWTH_READ = 64 * 1024  # below malloc's mmap threshold: the usual last read (at end of file) costs nothing


def read_capped(fd: int, limit: int) -> bytes:
    """An open regular file's bytes, at most limit + 1 of them (a caller refuses more than limit), read into a
    buffer sized to the file (its fstat size + 1), not to limit: a first sync reads thousands of small files,
    and a 64 MiB buffer for each costs more than reading it. A file that grew since the fstat is read on, up
    to the cap."""
    want = min(os.fstat(fd).st_size, limit) + 1
    chunks = []
    total = 0
    while total <= limit:
        chunk = os.read(fd, min(want, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        want = _GROWTH_READ
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_workspace_file(path: Path, limit: int = 1_000_000) -> bytes | None:
    """A file in the workspace, which the agent may have written: None when absent; refused (OSError)
    when it is a symlink, not a regular file or larger than limit. Never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symlink, which agentbox does not follow in the workspace") from exc
        raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        data = read_capped(handle.fileno(), limit)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"it is larger than {limit:,} bytes")
    return data


def refuse_symlink(path: Path) -> None:
    """Files agentbox writes into the workspace are never written through a symlink."""
    if os.path.islink(path):

        raise OSError(
            errno.ELOOP, f"{path} is a symlink (to {os.path.realpath(path)}); agentbox does not write through it"
        )


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive flock on lock_file (made private, 0600, when missing) for the block."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked_or_waiting(lock_file: Path, waiting: str) -> Iterator[bool]:
    """As locked(); when another process holds the lock, says `waiting` (a note) and waits. Yields whether it
    waited."""


    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            note(waiting)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield waited
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether a process of that id exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
