"""Small file-system helpers: atomic writes that never leave half-written files behind."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, content: str | bytes, mode: int = 0o644, overwrite: bool = True) -> None:
    """Write content to path via a temp file in the same folder.

    With overwrite=False an existing file is never replaced (FileExistsError), even in a race.
    """
    import tempfile

    data = content.encode() if isinstance(content, str) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
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


def private_dir(path: Path) -> Path:
    """A folder only the user can enter (0700), created if needed."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
