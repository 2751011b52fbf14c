"""Host paths a config makes agentbox read, stage, render or mount: resolved once, read once, pinned.

Trust covers what a project's agentbox.yml reaches, not only its bytes: each path it names is
recorded with its resolved real path and, for files agentbox reads (bootstrap scripts, `vm.template`,
`caCert`), the digest of their content. Turning such a path into a symlink to `~/.ssh`, or editing a
script, changes the pin and so revokes the trust.

Within one run every file is read once: `read()` returns the bytes whose digest was checked, and a
file that changes between the check and its use is refused instead of used. Files are opened without
following a final symlink (the real path is resolved first), without blocking on a FIFO, and only
when they are regular files of bounded size, because the agent may have written them.

A file whose size, mtime, ctime, inode and device are those recorded at its last hashing is not
hashed again: the VM can set a file's mtime, but not the host's ctime.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

from agentbox import paths
from agentbox.errors import ConfigError
from agentbox.fsutil import atomic_write, private_dir

MAX_FILE_BYTES = 4 * 1024 * 1024  # a CA bundle is a few hundred KB; a bootstrap script far less
RACY_NS = 1_000_000_000

FILE = "file"
DIR = "dir"
MISSING = "missing"
OTHER = "other"


class Pin(NamedTuple):
    key: str  # the config key that names the path: "bootstrap.onStartScript[0]", "mounts[1]", "caCert", ...
    path: str  # as configured (absolute, ~ expanded)
    real: str  # what it resolves to
    kind: str  # file, dir, missing or other
    sha256: str | None = None  # content digest, for files whose content agentbox uses

    def to_json(self) -> dict[str, Any]:
        return dict(self._asdict())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Pin:
        return cls(data["key"], data["path"], data["real"], data["kind"], data.get("sha256"))


# What this process has read: real path -> (digest, bytes or None when known from the stat cache only).
_read_in_this_run: dict[str, tuple[str, bytes | None]] = {}
_stat_cache: dict[str, list[Any]] | None = None
_stat_cache_dirty = False


def pin_path(key: str, path: Path | str, resolved: Path | None = None) -> Pin:
    """Pin where a path (a mount, a credential file) resolves to, without reading it.

    `resolved`: where the caller already resolved it (a mount), so the pin is the path that is used."""
    real = str(resolved) if resolved is not None else os.path.realpath(path)
    return Pin(key, str(path), real, _kind(real))


def pin_file(key: str, path: Path | str) -> Pin:
    """Pin a file agentbox reads: where it resolves to and what it holds."""
    real = os.path.realpath(path)
    kind = _kind(real)
    if kind != FILE:
        return Pin(key, str(path), real, kind)
    digest, _ = _digest(real)
    return Pin(key, str(path), real, FILE, digest)


def read(path: Path | str, what: str) -> bytes:
    """The content of a file agentbox stages or renders, exactly as pinned in this run.

    The first read of a path pins it; a later read that finds other content (the file changed while
    agentbox was using it) is refused. `what` names the setting in error messages.
    """
    real = os.path.realpath(path)
    known = _read_in_this_run.get(real)
    if known is not None and known[1] is not None:
        return known[1]
    data = _read_regular(real, path, what)
    digest = hashlib.sha256(data).hexdigest()
    if known is not None and known[0] != digest:
        raise ConfigError(
            f"{what}: {path} changed while agentbox was using it",
            hint="Nothing was started with it. Run the command again (and check why the file changed).",
        )
    _read_in_this_run[real] = (digest, data)
    return data


def save_stat_cache() -> None:
    """Keep what this run hashed, so an unchanged large file is not hashed again next time."""
    global _stat_cache_dirty
    if not _stat_cache_dirty or _stat_cache is None:
        return

    try:
        private_dir(paths.state_dir())
        atomic_write(_stat_cache_file(), json.dumps(_stat_cache), mode=0o600)
        _stat_cache_dirty = False
    except OSError:
        pass  # only a speed-up


def forget() -> None:
    """Drop what this process read (tests run many commands in one process)."""
    global _stat_cache, _stat_cache_dirty
    _read_in_this_run.clear()
    _stat_cache = None
    _stat_cache_dirty = False


def _kind(real: str) -> str:
    try:
        st = os.stat(real)
    except OSError:
        return MISSING
    if stat.S_ISREG(st.st_mode):
        return FILE
    if stat.S_ISDIR(st.st_mode):
        return DIR
    return OTHER


def _digest(real: str) -> tuple[str, bytes | None]:
    known = _read_in_this_run.get(real)
    if known is not None:
        return known
    try:
        st = os.lstat(real)
    except OSError:
        st = None
    cache = _load_stat_cache()
    if st is not None and stat.S_ISREG(st.st_mode):
        cached = cache.get(real)
        # Like git's racy-clean rule: an entry hashed within a second of the file's last change may
        # predate a second change in the same timestamp tick, so it is not trusted.
        if _fresh(cached, st):
            _read_in_this_run[real] = (cached[5], None)
            return cached[5], None
    data = _read_regular(real, real, "pinned file")
    digest = hashlib.sha256(data).hexdigest()
    _read_in_this_run[real] = (digest, data)
    return digest, data


def _read_regular(real: str, shown: Path | str, what: str) -> bytes:
    """Read a regular file: no final symlink followed, no FIFO opened blocking, at most MAX_FILE_BYTES."""
    global _stat_cache_dirty
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {shown}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what}: {shown} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{what}: {shown} is {st.st_size:,} bytes; agentbox reads at most {MAX_FILE_BYTES:,}")
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{what}: {shown} is larger than {MAX_FILE_BYTES:,} bytes")
    cache = _load_stat_cache()
    entry = [*_signature(st), hashlib.sha256(data).hexdigest(), time.time_ns()]
    old = cache.get(real)
    if not (_fresh(old, st) and old[5] == entry[5]):
        cache[real] = entry
        _stat_cache_dirty = True
    return data


def _fresh(cached: Any, st: os.stat_result) -> TypeGuard[list[Any]]:
    return (
        isinstance(cached, list)
        and len(cached) == 7
        and cached[:5] == _signature(st)
        and isinstance(cached[6], int)
        and cached[6] - st.st_ctime_ns > RACY_NS
    )


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _stat_cache_file() -> Path:
    return paths.state_dir() / "pins-cache.json"


def _load_stat_cache() -> dict[str, list[Any]]:
    global _stat_cache
    if _stat_cache is None:
        try:
            loaded = json.loads(_stat_cache_file().read_text())
            _stat_cache = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            _stat_cache = {}
    return _stat_cache
