"""A warm launch's verified plan: what a full launch decided, kept with the stat signature of every input it read.

A full launch of a built-in agent (agentbox.session.launch) that reached its VM warm, in live mode, with nothing
to say and nothing it could not prove, saves what it decided: the `limactl shell` argv (with this launch's own
values as slots), the proxy's port, the checkpoint settings, the logins' way back and who counts as busy for the
tripwire. Beside it goes the signature (device, inode, size, mtime_ns, ctime_ns, mode) of every file and folder
the launch read, stat'ed or listed before the shell (agentbox.session.planrecorder records them), a digest of the
environment, the terminal's shape, agentbox's version and the interpreter; and it is used for an hour at most,
since what a launch decides by the clock (the broker's CA renewed ahead of its end, say) no stat can prove. The
next identical launch (same folder, agent and global options) re-stats every input; when all match it runs from
the plan
(agentbox.session.planned) without loading the config, trust, staging or broker layers. The VM still proves in
the guest that it is the VM agentbox checked, on the same boot (agentbox.session.warm's stub); any mismatch there,
or here, takes the full path, which writes the plan anew.

The plan lives in the state folder (0700, each plan 0600), never in anything the VM can write. A plan that is not
a regular file owned by this user and private to them, that does not parse, or that was written by another
agentbox version or interpreter is ignored (and rewritten by the full path): never trusted, never a crash.

This module is on the launch's first path: it imports nothing of agentbox but paths.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentbox import __version__, paths

FORMAT = 1
DECLINED = -1  # what a launch from a plan answers when it did not run (no exit code is negative)
FOLDER = "plans"
MAX_BYTES = 4 << 20
KEPT = 64  # plans kept (one per folder, agent and options): the least recently saved go first
# What a launch decides by the clock cannot be proved by a stat: the broker's CA renewed 30 days before its end, a
# company CA certificate found expired, the age of a note said once. A plan is used this long after it was saved.
MAX_AGE_NS = 3600 * 1_000_000_000
SETTLED_NS = 2_000_000_000  # an input changed this recently may change again within its timestamp's granularity
# Set by the shell itself around every command, or by the terminal: never something agentbox decides by.
VOLATILE_ENV = frozenset({"_", "OLDPWD", "PWD", "SHLVL", "COLUMNS", "LINES"})
# What an input is: its content and stat (a file), only that it is this folder (stat'ed, not listed), a listed
# folder (its entries' names), or absent.
FILE, PLACE, LISTED = "f", "p", "l"
# Slots in the saved argv: this launch's own values.
NONCE, STARTED, GO, RETURNS = "{nonce}", "{started}", "{go}", "{returns}"

Signature = list[int] | None


def key_of(cwd: str, agent: str, options: Mapping[str, Any]) -> str:
    """Which plan a launch may use: its folder, agent, global options and whether it runs on a terminal."""
    terminal = [os.isatty(fd) for fd in (0, 1, 2)]
    text = json.dumps([os.path.realpath(cwd), agent, sorted(options.items()), terminal, sys.executable])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:40]


def plan_path(key: str) -> Path:
    return paths.state_dir() / FOLDER / f"{key}.json"


def environment_digest(environ: Mapping[str, str] | None = None) -> str:
    """Every variable but the shell's own bookkeeping: agentbox reads many, and a plan may not guess which."""
    items = sorted((k, v) for k, v in (environ if environ is not None else os.environ).items()
                   if k not in VOLATILE_ENV)
    return hashlib.sha256(json.dumps(items).encode("utf-8", "surrogateescape")).hexdigest()


def signature(path: str, kind: str, follow: bool = True) -> Signature:
    """What must be the same for an input to be the one the plan read; None when it is absent."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return _stat_signature(st, kind)


def _stat_signature(st: os.stat_result, kind: str) -> list[int]:
    if kind == PLACE and stat.S_ISDIR(st.st_mode):  # a folder agentbox only looked at: entries may come and go
        return [st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)]
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid]


def load(key: str) -> dict[str, Any] | None:
    """The plan for `key` when it can be used as it is now: private, this version's, every input unchanged."""
    data = _read(plan_path(key))
    if data is None or data.get("format") != FORMAT or data.get("version") != __version__:
        return None
    if data.get("python") != sys.version or data.get("env") != environment_digest():
        return None
    saved = data.get("saved")
    if not isinstance(saved, int) or not 0 <= time.time_ns() - saved <= MAX_AGE_NS:
        return None
    try:
        for path, kind, follow, expected in data["inputs"]:
            if signature(path, kind, follow) != expected:
                return None
    except (TypeError, ValueError, OSError):
        return None
    return data


def _read(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077
                or st.st_size > MAX_BYTES):
            return None
        data = json.loads(os.read(fd, MAX_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def save(key: str, decided: Mapping[str, Any], inputs: Iterable[tuple[str, str, bool]]) -> bool:
    """Write the plan (0600, atomically); False when an input cannot be signed: it could not be stat'ed, or it
    changed so recently that a change within the same timestamp could go unseen (the next launch saves it)."""
    signed = []
    settled = time.time_ns() - SETTLED_NS
    for path, kind, follow in inputs:
        try:
            found = signature(path, kind, follow)
        except OSError:
            return False
        if found is not None and len(found) > 3 and max(found[3], found[4]) > settled:
            return False
        signed.append([path, kind, follow, found])
    data = {"format": FORMAT, "version": __version__, "python": sys.version, "env": environment_digest(),
            "saved": time.time_ns(), **decided, "inputs": signed}
    target = plan_path(key)
    folder = target.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = folder / f".{target.name}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(data).encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)
    os.replace(temporary, target)
    _prune(folder)
    return True


def _prune(folder: Path) -> None:
    try:
        entries = [(entry.stat(follow_symlinks=False).st_mtime_ns, entry.path) for entry in os.scandir(folder)]
    except OSError:
        return
    for _, path in sorted(entries)[:-KEPT]:
        try:
            os.unlink(path)
        except OSError:
            pass


def forget(key: str) -> None:
    try:
        os.unlink(plan_path(key))
    except OSError:
        pass
