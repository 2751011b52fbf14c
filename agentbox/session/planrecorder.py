"""What a full launch read before its shell, for its verified plan (agentbox.session.plan).

Recording starts before the config is looked for and ends at the shell. It sees, in the launch's own thread:
  - every file opened for reading (Python's `open` audit event: builtins.open, os.open, io.open_code), every folder
    listed (os.listdir, os.scandir: the folder and each entry), every path stat'ed (os.stat, os.lstat, os.access:
    os.path.exists, isfile, Path.is_dir and the like go through them) and every link read (os.readlink: the link
    itself is signed), present or absent;
  - what no stat can prove: a process started (subprocess, os.system, exec, spawn, fork), a socket connected, a file
    opened by a relative name (its folder is not known). Any of them, and the launch saves no plan.
Files the launch writes (opened to write or create) are its output, not its input. The start checkpoint's threads
and the tripwire's fingerprint are not recorded: a launch from a plan runs them again. A read in any other thread
is unprovable too.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentbox import progress
from agentbox.session.plan import FILE, LISTED, PLACE

# Threads whose reads a launch from a plan makes again itself (the start checkpoint's): not the plan's inputs.
# Any other thread's read makes the launch unprovable: the plan would not know it.
REPLAYED_THREADS = frozenset({"agentbox-checkpoint", "checkpoint lookup"})
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_UNPROVABLE = {
    "subprocess.Popen": "a process was started", "os.system": "a process was started",
    "os.exec": "a process was started", "os.posix_spawn": "a process was started",
    "os.spawn": "a process was started", "os.fork": "a process was started",
    "socket.connect": "a socket was connected",
}


class Recorder:
    """One launch's inputs, by path: (kind, whether the stat follows a link)."""

    def __init__(self, key: str) -> None:
        self.key = key  # the plan's (agentbox.session.plan.key_of)
        self.emitted_before = progress.emitted
        self.inputs: dict[tuple[str, bool], str] = {}
        self.listed: set[str] = set()
        self.unprovable: list[str] = []
        self.active = False
        self._thread = threading.get_ident()
        self._paused = 0

    def _mine(self) -> bool:
        if not self.active or self._paused:
            return False
        if threading.get_ident() == self._thread:
            return True
        if threading.current_thread().name not in REPLAYED_THREADS:
            self.unprovable.append(f"a file was read in the thread {threading.current_thread().name}")
        return False

    def add(self, path: Any, kind: str, follow: bool = True) -> None:
        if isinstance(path, int):
            return  # an open file: what it is was recorded when it was opened
        if path is None:
            path = "."
        path = os.fsdecode(os.fspath(path))
        if not os.path.isabs(path):
            self.unprovable.append(f"a relative path was read ({path})")
            return
        path = os.path.normpath(path)
        key = (path, follow)
        if kind == LISTED:
            self.listed.add(path)
        if self.inputs.get(key) in (FILE, LISTED) and kind == PLACE:
            return
        self.inputs[key] = kind

    def event(self, name: str, args: tuple[Any, ...]) -> None:
        if not self._mine():
            return
        if name == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                return
            if isinstance(flags, int) and flags & _WRITES:
                return
            self.add(path, FILE)
        elif name in ("os.listdir", "os.scandir"):
            self.add(args[0], LISTED)
        elif name in _UNPROVABLE or name.startswith("os.exec"):
            self.unprovable.append(_UNPROVABLE.get(name, "a process was started"))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """What a launch from a plan does again itself (the tripwire's fingerprint) is not its input."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def entries(self) -> Iterator[tuple[str, str, bool]]:
        """Every input to sign: each listed folder's entries too (a file in it changed, or one came or went)."""
        seen = set()
        for (path, follow), kind in self.inputs.items():
            seen.add((path, follow))
            yield path, kind, follow
        for folder in sorted(self.listed):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                entry = os.path.join(folder, name)
                if (entry, False) not in seen:
                    seen.add((entry, False))
                    yield entry, PLACE, False


_SUPPORTS = (os.supports_dir_fd, os.supports_fd, os.supports_follow_symlinks, os.supports_effective_ids)
_current: Recorder | None = None
_installed = False
_originals: dict[str, Any] = {}


def start(key: str) -> Recorder:
    """Record this thread's reads from now on (until stop()), for the plan `key`."""
    global _current, _installed
    recorder = Recorder(key)
    _current = recorder
    if not _installed:
        _installed = True
        sys.addaudithook(_hook)
    if not _originals:
        for name, kind, follow in (("stat", PLACE, True), ("lstat", PLACE, False), ("access", PLACE, True),
                                   ("readlink", PLACE, False)):
            _originals[name] = original = getattr(os, name)
            watched = _watched(original, kind, follow)
            for supports in _SUPPORTS:  # `os.stat in os.supports_dir_fd` (shutil.rmtree asks) answers as before
                if original in supports:
                    supports.add(watched)
            setattr(os, name, watched)
    recorder.active = True
    return recorder


def current() -> Recorder | None:
    return _current if _current is not None and _current.active else None


@contextmanager
def unrecorded() -> Iterator[None]:
    """What a launch from a plan does again itself is not an input of the plan."""
    recorder = current()
    if recorder is None:
        yield
        return
    with recorder.paused():
        yield


def stop() -> None:
    global _current
    if _current is not None:
        _current.active = False
    _current = None
    for name, original in _originals.items():
        watched = getattr(os, name)
        for supports in _SUPPORTS:
            supports.discard(watched)
        setattr(os, name, original)
    _originals.clear()


def _hook(name: str, args: tuple[Any, ...]) -> None:
    recorder = _current
    if recorder is not None and recorder.active:
        recorder.event(name, args)


def _watched(original: Any, kind: str, follow: bool) -> Any:
    def watched(path: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _current
        if recorder is not None and recorder._mine():
            if kwargs.get("dir_fd") is not None:
                recorder.unprovable.append("a path was read relative to an open folder")
            else:
                recorder.add(path, kind, follow and kwargs.get("follow_symlinks", True))
        return original(path, *args, **kwargs)

    return watched
