"""Putting an instruction file's version into the workspace, never through a link the agent planted.

Each folder on the way is opened from the workspace with O_NOFOLLOW (agentbox.vmread's flags): a link, a file or
anything else standing where a folder must be is removed and a real folder made (`.claude` turned into a link to
~/.ssh loses the link; nothing is written where it pointed). The file itself is written to a temporary name in
its folder and renamed over the path (a rename replaces a link, never follows it): a failure leaves the path as it
was, never half written. Each function returns None, or what went wrong in words naming the file and its state.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable

from agentbox import vmread
from agentbox.review.instructionscan import FILE, LINK, Entry

FOLDER_MODE = 0o755


def put(workspace_fd: int, label: str, entry: Entry | None, blob: Callable[[str], bytes | None]) -> str | None:
    """Make workspace/label be `entry` (None: absent). `blob(sha256)` gives a file's bytes."""
    parts = label.split("/")
    shown = vmread.shown(label)
    if entry is None:
        return _remove(workspace_fd, parts, shown)
    if entry.kind not in (FILE, LINK):
        return f"{shown} cannot be written back: agentbox keeps no copy of {entry.describe()}"
    data = blob(entry.value) if entry.kind == FILE else None
    if entry.kind == FILE and data is None:
        return f"{shown} cannot be written back: agentbox's copy of it is missing"
    try:
        fd = _folder(workspace_fd, parts[:-1])
    except OSError as exc:
        return f"{shown} was not written back: its folder cannot be made ({exc.strerror}); it is as the session left it"
    try:
        _replace(fd, parts[-1], entry, data)
    except OSError as exc:
        return f"{shown} was not written back ({exc.strerror}); it is as the session left it"
    finally:
        os.close(fd)
    return None


def _remove(workspace_fd: int, parts: list[str], shown: str) -> str | None:
    try:
        fd = _folder(workspace_fd, parts[:-1], create=False)
    except OSError:
        return None  # a folder on its way is gone (or a link, removed on its own): the path is not there
    try:
        if not vmread.remove(fd, parts[-1]):
            return f"{shown} could not be removed; it is as the session left it"
    finally:
        os.close(fd)
    return None


def _folder(workspace_fd: int, parts: list[str], create: bool = True) -> int:
    return vmread.open_dirs(workspace_fd, parts, create, FOLDER_MODE)


def _replace(fd: int, name: str, entry: Entry, data: bytes | None) -> None:
    temp = f".{name}.agentbox-{secrets.token_hex(4)}"
    try:
        if entry.kind == LINK:
            os.symlink(entry.value, temp, dir_fd=fd)
        else:
            out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            with os.fdopen(out, "wb") as handle:
                handle.write(data or b"")
                handle.flush()
                os.fchmod(handle.fileno(), entry.mode & 0o777)
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                vmread.remove(fd, name)  # a folder where the file goes: a rename cannot replace it
        except FileNotFoundError:
            pass
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=fd)
        except OSError:
            pass
        raise
