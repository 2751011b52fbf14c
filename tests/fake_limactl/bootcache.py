"""Recorded provisioning results: the double's way to make a VM start cheap in tests that are not about
provisioning (the double's own, not Lima's).

With FAKE_LIMACTL_BOOT_CACHE=DIR, a boot's `system` and `user` scripts run for real the first time a
given guest meets them, and what they did is recorded in DIR: every file, folder and link of the guest's
own folders they created, changed or removed (contents, modes, owners), their exit codes and what they
wrote to /var/log/cloud-init-output.log. A later boot whose guest is in the same state before its
scripts, with the same scripts, user, environment and double, gets that record applied instead of running
them: the same files, the same log, the same provisioning results, in a fraction of the time.

"The same state" is a digest of every entry of the guest's own folders (kind, mode, owners, content or
link target; not times), so a test that changed the guest before its boot runs the scripts for real.
Values that differ between boots by design are handled, not compared: the instance id in /run/lima-ssh-ready,
the content of the files this boot's `data` entries wrote (the workspace marker holds the test's own path; the scripts must not
name such a path, or nothing is replayed), the values of PARAM_* variables no script names, and this
boot's id (`/proc/sys/kernel/random/boot_id`), which the record keeps as a placeholder and a replay fills
in. Nothing is replayed when a knob changes how the boot behaves (offline, apt locks, delays, hangs).

The tests set the variable for every test but those marked `real_boot` (tests/conftest.py):
provisioning keeps its own tests that run it for real.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from typing import Any

CACHE_VAR = "FAKE_LIMACTL_BOOT_CACHE"
TREES = ("etc", "usr-local", "var", "root", "tmp", "run", "home", "userhome")
NOT_RECORDED = ("run/fake-limactl", "var/log/cloud-init-output.log")  # the double's own; the log is kept apart
VOLATILE = ("run/lima-ssh-ready",)  # holds this boot's instance id: its content is not part of the state
BOOT_ID_MARK = b"@@FAKE_LIMACTL_BOOT_ID@@"
HERE = os.path.dirname(os.path.abspath(__file__))
DOUBLE_SOURCES = ("guest.py", "bootcache.py", "machine.py", os.path.join("guest_tools", "tools.py"))

Entry = tuple[str, int, int, int, str]  # kind (d, f, l), mode, uid, gid, content digest or link target


def folder() -> str | None:
    return os.environ.get(CACHE_VAR) or None


def _walk(root: str, rel: str, out: dict[str, Entry]) -> None:
    try:
        entries = list(os.scandir(os.path.join(root, rel)))
    except OSError:
        return
    for e in entries:
        path = f"{rel}/{e.name}"
        if path in NOT_RECORDED:
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            out[path] = ("d", mode, st.st_uid, st.st_gid, "")
            _walk(root, path, out)
        elif stat.S_ISLNK(st.st_mode):
            out[path] = ("l", mode, st.st_uid, st.st_gid, os.readlink(e.path))
        elif stat.S_ISREG(st.st_mode):
            digest = hashlib.sha256()
            with contextlib.suppress(OSError), open(e.path, "rb") as f:
                digest.update(f.read())
            out[path] = ("f", mode, st.st_uid, st.st_gid, digest.hexdigest())


def listing(guestfs: str) -> dict[str, Entry]:
    """Every entry of the guest's own folders, by path relative to guestfs/."""
    out: dict[str, Entry] = {}
    for tree in TREES:
        if os.path.isdir(os.path.join(guestfs, tree)):
            st = os.lstat(os.path.join(guestfs, tree))
            out[tree] = ("d", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, "")
            _walk(guestfs, tree, out)
    return out


def _double_digest() -> str:
    digest = hashlib.sha256()
    for name in DOUBLE_SOURCES:
        with open(os.path.join(HERE, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def key(scripts: list[dict[str, Any]], env: dict[str, str], user: dict[str, Any], before: dict[str, Entry],
        data: dict[str, str], mounts: list[str], mount_points: list[str]) -> str | None:
    """The record's name for these scripts on a guest in this state; None when the boot must run for real.
    data: the guest path of each file this boot's `data` entries wrote -> its path relative to guestfs/;
    mounts: the host and guest paths of the instance's mounts (what a script does there is not recorded);
    mount_points: those inside the guest's own folders, relative to guestfs/ (the folders the double makes
    for them, and their parents, are where the test happens to keep its project, not the guest's state)."""
    texts = "\n".join(s.get("script", "") for s in scripts)
    if any(path in texts for path in [*data, *mounts] if path):
        return None
    written = set(data.values()) | set(VOLATILE)
    named_env = {k: v for k, v in env.items() if not k.startswith("PARAM_") or k in texts}
    state = {path: (entry if path not in written else entry[:4]) for path, entry in before.items()
             if path in TREES or not any(point == path or point.startswith(path + "/") or path.startswith(point + "/")
                                         for point in mount_points)}
    blob = json.dumps([_double_digest(), [(s["mode"], s.get("script", "")) for s in scripts], named_env, user,
                       sorted(state.items())], sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8", "surrogateescape")).hexdigest()


def record(cache: str, name: str, boot_id: bytes, guestfs: str, before: dict[str, Entry],
           results: list[dict[str, Any]], log: bytes) -> None:
    """Keep what the scripts did (the guest now, compared with `before`) under cache/name; boot_id: this
    boot's, kept as a placeholder wherever a script wrote it."""
    target = os.path.join(cache, name)
    if os.path.isdir(target):
        return
    after = listing(guestfs)
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".record-", dir=cache)
    changed = []
    for path in sorted(after):
        entry = after[path]
        if before.get(path) == entry:
            continue
        has_boot_id = False
        if entry[0] == "f":
            with open(os.path.join(guestfs, path), "rb") as f:
                content = f.read()
            has_boot_id = bool(boot_id) and boot_id in content
            os.makedirs(os.path.dirname(os.path.join(work, "files", path)), exist_ok=True)
            with open(os.path.join(work, "files", path), "wb") as f:
                f.write(content.replace(boot_id, BOOT_ID_MARK) if has_boot_id else content)
        changed.append([path, *entry, has_boot_id])
    deleted = sorted(path for path in before if path not in after)
    with open(os.path.join(work, "record.json"), "w", encoding="utf-8") as f:
        json.dump({"changed": changed, "deleted": deleted, "results": results,
                   "log": log.decode("utf-8", "surrogateescape")}, f)
    try:
        os.rename(work, target)
    except OSError:  # another worker recorded the same boot first
        shutil.rmtree(work, ignore_errors=True)


def replay(cache: str, name: str, boot_id: bytes, guestfs: str, log_fd: int) -> list[dict[str, Any]] | None:
    """Apply the record cache/name to this guest (boot_id: this boot's, put where the placeholder is); its
    scripts' results, or None when there is none."""
    source = os.path.join(cache, name)
    try:
        with open(os.path.join(source, "record.json"), encoding="utf-8") as f:
            rec = json.load(f)
    except OSError:
        return None
    for path in reversed(rec["deleted"]):
        _remove(os.path.join(guestfs, path))
    folders = []
    for path, kind, mode, uid, gid, content, has_boot_id in rec["changed"]:
        host = os.path.join(guestfs, path)
        if kind == "d":
            if not os.path.isdir(host) or os.path.islink(host):
                _remove(host)
                os.mkdir(host)
            folders.append((host, mode, uid, gid))
            continue
        _remove(host)
        if kind == "l":
            os.symlink(content, host)
        else:
            with open(os.path.join(source, "files", path), "rb") as f:
                data = f.read()
            with open(host, "wb") as f:
                f.write(data.replace(BOOT_ID_MARK, boot_id) if has_boot_id else data)
            os.chmod(host, mode)
        with contextlib.suppress(OSError):
            os.lchown(host, uid, gid)
    for host, mode, uid, gid in reversed(folders):
        os.chmod(host, mode)
        with contextlib.suppress(OSError):
            os.lchown(host, uid, gid)
    os.write(log_fd, rec["log"].encode("utf-8", "surrogateescape"))
    return rec["results"]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
