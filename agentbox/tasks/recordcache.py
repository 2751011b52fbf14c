"""What a listing of the task records read last time, so the next one parses one file instead of a thousand.

`<state>/tasks/.records-cache.json` (0600, written atomically) holds, for each task id, the stat signature of its
task.json (device, inode, size, mtime_ns, ctime_ns) when it was read and the record's fields as they were then.
A record whose signature still matches is taken from here without opening or checking its file again; any other
is read and checked as before. Every record is written by replacing its file (fsutil.atomic_write: a new inode),
so a changed record never keeps its signature. The cache is only ever a shortcut: one that is missing, corrupt,
from another version or not a plain file of this user is ignored and written anew. It lives in agentbox's state
folder, which no VM can write.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from agentbox.fsutil import atomic_write, read_capped

NAME = ".records-cache.json"
VERSION = 1
MAX_BYTES = 256 << 20  # far more than 100,000 records; a bigger file is not ours

Signature = list[int]
Entries = dict[str, tuple[Signature, dict[str, Any]]]  # task id (its folder's name) -> (signature, fields)


def signature(st: os.stat_result) -> Signature:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def read(root: Path) -> Entries:
    """The cached records (empty when there is no usable cache)."""
    try:
        fd = os.open(root / NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return {}
        data = json.loads(read_capped(fd, MAX_BYTES))  # more than the cap is no JSON document: refused
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("records"), dict):
        return {}
    entries: Entries = {}
    for name, entry in data["records"].items():
        if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
                and isinstance(entry[1], dict)):
            entries[name] = (entry[0], entry[1])
    return entries


def write(root: Path, entries: Entries) -> None:
    """Keep what this listing read for the next one (best effort: a listing never fails for its cache)."""
    text = json.dumps({"version": VERSION, "records": {name: list(entry) for name, entry in entries.items()}},
                      separators=(",", ":"))
    try:
        atomic_write(root / NAME, text, mode=0o600, durable=False)
    except OSError:
        pass
