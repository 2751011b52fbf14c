"""The workspace's private files (`network.private`): fingerprinted on the host for the proxy, which refuses an
upload carrying a chunk of one (agentbox.net.doors).

`refresh(config, vm, workspace)` expands the globs (relative to the workspace: `*` within one folder, `**` any
depth; links are not followed, only regular files count), and when the files' stat signature differs from the one
last fingerprinted, reads them (at most MAX_FILE bytes each, MAX_TOTAL in all) and writes network/private.json
(0600) with every 64-byte window's hashes, and network/private.stamp. Nothing changed: a few folder listings and
stats, nothing read. A glob from a config file that matches nothing is a warning naming it and its file; a file
that cannot be read, or is too large, is named as not fingerprinted.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import paths, vmread
from agentbox.fsutil import atomic_write, private_dir
from agentbox.net import fingerprints
from agentbox.progress import warn
from agentbox.safetext import visible
from agentbox.session import planrecorder

if TYPE_CHECKING:
    from agentbox.config.load import Config

MAX_FILE = 256 << 10
MAX_TOTAL = 1 << 20
MAX_FILES = 256
STAMP_FILE = "private.stamp"


def refresh(config: Config, vm_name: str, workspace: Path) -> None:
    """Fingerprints of the private files as they are now, for the proxy (written only when they changed)."""
    found: dict[str, os.stat_result] = {}
    folders: set[str] = set()
    for pattern in config.network.private:
        with planrecorder.unrecorded():  # a listing would make every file beside them an input
            matched = _expand(workspace, pattern, folders)
        if not matched and _source(config, pattern) is not None:
            warn(visible(f"network.private: `{pattern}` (in {_source(config, pattern)}) matches no file in "
                         f"{workspace}; nothing is fingerprinted for it"))
        found.update(matched)
    chosen = sorted(found.items())[:MAX_FILES]
    # What a verified plan keeps (agentbox.session.plan): the folders the globs looked in (a file made or removed
    # there changes them) and the files they found.
    for name in sorted(folders) + [str(workspace / name) for name, _ in chosen]:
        with contextlib.suppress(OSError):
            os.lstat(name)
    signature = [[name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] for name, st in chosen]
    network = paths.vm_state_dir(vm_name) / "network"
    stamp = json.dumps({"window": fingerprints.WINDOW, "files": signature})
    if _read(network / STAMP_FILE) == stamp and (network / fingerprints.PRIVATE_FILE).exists():
        return
    records: list[dict[str, Any]] = []
    total = 0
    for name, st in chosen:
        if st.st_size > MAX_FILE or total + st.st_size > MAX_TOTAL:
            limit = "256 KiB a file" if st.st_size > MAX_FILE else "1 MiB for all private files"
            warn(visible(f"network.private: {name} is not fingerprinted: over {limit} (its content may be "
                         "uploaded)"))
            continue
        data = _content(workspace, name)
        if data is None:
            why = "is a link (agentbox does not follow links in the workspace)" if stat.S_ISLNK(st.st_mode) \
                else "cannot be read"
            warn(visible(f"network.private: {name} {why}, so it is not fingerprinted (its content may be "
                         "uploaded)"))
            continue
        total += len(data)
        crcs, checks = fingerprints.window_hashes(data)
        records.append({"path": name, "crc": base64.b64encode(crcs.tobytes()).decode(),
                        "check": base64.b64encode(checks.tobytes()).decode()})
    private_dir(network)
    text = json.dumps({"window": fingerprints.WINDOW, "files": records}) + "\n"
    atomic_write(network / fingerprints.PRIVATE_FILE, text, mode=0o600)
    atomic_write(network / STAMP_FILE, stamp, mode=0o600)


def _source(config: Config, pattern: str) -> str | None:
    """The config file that names `pattern` (None: the default list)."""
    for data, where in ((config.local_data, config.local_file), (config.global_data, config.global_file)):
        network = data.get("network")
        if isinstance(network, dict) and pattern in (network.get("private") or ()):
            return str(where)
    return None


def _expand(workspace: Path, pattern: str, folders: set[str]) -> dict[str, os.stat_result]:
    """The regular files under `workspace` a glob names: workspace-relative path -> stat (links never followed)."""
    parts = [part for part in pattern.strip("/").split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return {}
    found: dict[str, os.stat_result] = {}
    _walk(workspace, "", parts, found, folders)
    return found


def _walk(folder: Path, relative: str, parts: list[str], found: dict[str, os.stat_result],
          folders: set[str]) -> None:
    """`parts` matched from `folder` on: `**` is any number of folders (none included); `**` last, every file."""
    if len(found) >= MAX_FILES:
        return
    head, rest = parts[0], parts[1:]
    if head == "**" and rest:
        _walk(folder, relative, rest, found, folders)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    folders.add(str(folder))
    for entry in entries:
        name = f"{relative}{entry.name}"
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if head == "**":
            if not rest and _candidate(st):
                found[name] = st
            if stat.S_ISDIR(st.st_mode) and entry.name != ".git":
                _walk(Path(entry.path), f"{name}/", parts, found, folders)
        elif fnmatch.fnmatchcase(entry.name, head):
            if not rest and _candidate(st):
                found[name] = st
            elif rest and stat.S_ISDIR(st.st_mode):
                _walk(Path(entry.path), f"{name}/", rest, found, folders)


def _candidate(st: os.stat_result) -> bool:
    """Anything but a folder: a regular file is fingerprinted, anything else (a link: links in the workspace are not
    followed; a pipe, a device) is named as not fingerprinted."""
    return not stat.S_ISDIR(st.st_mode)


def _content(workspace: Path, name: str) -> bytes | None:
    """A private file's bytes, through the one reader of what the VM may have written (agentbox.vmread): every
    component below the workspace opened without following a link, a regular file of at most MAX_FILE bytes."""
    try:
        with planrecorder.unrecorded():  # read below the workspace by descriptor: its stat signature is the input
            return vmread.read_path(workspace / name, MAX_FILE, below=workspace)
    except vmread.Refused:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
