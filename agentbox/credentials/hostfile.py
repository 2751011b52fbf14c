"""A host login file the broker reads (cached by its stat signature) and rewrites after a refresh on the host
(under a lock shared by every VM's broker, atomically, keeping its mode)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentbox import paths
from agentbox.errors import StateError
from agentbox.fsutil import atomic_write, locked, private_dir

MAX_LOGIN_FILE = 1 << 20  # a login file; real ones are a few KB (~/.claude.json is read elsewhere)
BACKUP_SUFFIX = ".agentbox-backup"  # the previous login file, kept beside it when another replaces it


class HostFile:
    """One host file. `read()` returns its bytes (None when absent), re-read only when its size, times or inode
    changed; `json()` its JSON object, or a StateError naming the file and what is wrong."""

    def __init__(self, path: Path, limit: int = MAX_LOGIN_FILE) -> None:
        self.path = path
        self.limit = limit
        self._signature: tuple[int, ...] | None = None
        self._data: bytes | None = None
        self._guard = threading.Lock()

    def read(self) -> bytes | None:
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from exc
        signature = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        with self._guard:
            if signature == self._signature:
                return self._data
        data = _read_regular(self.path, self.limit)
        with self._guard:
            self._signature, self._data = signature, data
        return data

    def json(self) -> dict[str, Any] | None:
        data = self.read()
        return None if data is None else parse_json(self.path, data)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held while a refresh reads, asks upstream and writes: every VM's broker takes the same lock."""
        real = os.path.realpath(self.path)
        name = hashlib.sha256(real.encode()).hexdigest()[:24]
        folder = private_dir(paths.state_dir() / "broker-locks")
        with locked(folder / f"{name}.lock"):
            yield

    def write_json(self, doc: dict[str, Any]) -> None:
        """Replace the file (its target when it is a symlink) atomically, keeping its mode (0600 when new)."""
        target = Path(os.path.realpath(self.path))
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            mode = 0o600
            if not target.parent.exists():
                private_dir(target.parent)
        atomic_write(target, json.dumps(doc, indent=2) + "\n", mode=mode)


def parse_json(path: Path, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{path} is not valid JSON ({exc})",
                         "log in again on the host, or fix or remove the file") from exc
    if not isinstance(doc, dict):
        raise StateError(f"{path} is not a JSON object", "log in again on the host, or fix or remove the file")
    return doc


def _read_regular(path: Path, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateError(f"{path} is not a regular file", "replace it with the login file the agent writes")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise StateError(f"{path} is larger than {limit:,} bytes: not a login file",
                         "log in again on the host, or fix or remove the file")
    return data

