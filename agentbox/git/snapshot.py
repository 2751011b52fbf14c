"""The workspace as a tree in agentbox's checkpoint store, read by agentbox itself.

A snapshot holds what `git status -uall` would call the working tree: the files the workspace's index
tracks, as they are on disk, and the untracked files that are not ignored. git never opens a path of
the work tree here: agentbox walks it itself and reads every file it records through folder
descriptors (`O_DIRECTORY|O_NOFOLLOW` from the workspace down, then `O_NOFOLLOW|O_NONBLOCK`), keeps
it only when fstat() shows a regular file with the inode it listed, reads at most max_file_size bytes
of it, and hashes the bytes into the store itself. A symlink is recorded as its target, a FIFO, socket
or device is left out, a folder that became a symlink is not followed. The ignore rules (.gitignore
files, info/exclude, the user's global excludes file) are read the same way and matched by
agentbox.git.ignore; the tracked paths come from the workspace's index as agentbox.git.read reads it.

Fast when little changed, with a cache in the store (`stat.cache`, agentbox's own):
- every folder's listing and what was decided about its entries, kept while the folder's stat (inode,
  mtime), its .gitignore's and the rules above it are unchanged: an unchanged folder is one lstat(); the
  files it records are kept apart (`files.<generation>.cache`, named by `walk.cache`) and read only when
  something changed, so an unchanged tree loads a few kilobytes, not a megabyte per 50,000 files;
- every recorded file's stat data and object id, also written as a git index (`stat.index`) for one
  `git diff-files`, which lstat()s those paths in C and names the ones that changed. It opens nothing:
  git reads a file only for an entry that is "racily clean" (modified no earlier than the index file),
  and an entry recorded within RACY_NS of the moment the index is written is recorded with mtime 0, so
  it is reported changed (and read again by agentbox) instead.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import marshal
import os
import stat
import struct
import time
from pathlib import Path
from typing import Any

from agentbox import paths, vmread
from agentbox.git.store import (
    GitError,
    GitTimeout,
    ObjectWriter,
    Pending,
    Repo,
    Snapshot,
    require_git,
    start_diff_files,
    store_format,
    store_locked,
    tree_of,
)
from agentbox.safetext import visible

CACHE_VERSION = 3  # entries.cache
WALK_VERSION = 4  # walk.cache: its folders' recorded files apart, in the files cache it names
WALK_VERSIONS = (3, WALK_VERSION)  # a version 3 walk.cache holds them inline: still read, written as 4
RACY_NS = 2_000_000_000
MAX_INDEX = 1 << 30  # the workspace's index is read up to this size
MAX_RULES = 1 << 20  # a .gitignore, info/exclude or the global excludes file
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
REGULAR, EXECUTABLE, LINK, GITLINK = 0o100644, 0o100755, 0o120000, 0o160000
STAT_INDEX = "stat.index"


def take(repo: Repo, max_file_size: int) -> Snapshot:
    """The working tree (tracked files and untracked files that are not ignored) as a tree in the store."""
    require_git()
    with store_locked(repo) as store:
        return _take(repo, store, max_file_size)


def _take(repo: Repo, store: Path, max_file_size: int) -> Snapshot:
    """The snapshot (the store must be held locked by the caller)."""
    try:
        return _walked(repo, store, max_file_size)
    except _StaleCache:  # the walk cache named a files cache that is gone or damaged: start over without them
        (store / "walk.cache").unlink(missing_ok=True)
        return _walked(repo, store, max_file_size)


class _StaleCache(Exception):
    pass


def _walked(repo: Repo, store: Path, max_file_size: int) -> Snapshot:
    # git diff-files takes as long as the rest together: started before the caches are even loaded (run()
    # drops it when the cache says the stat index does not match what was recorded).
    stat_index = store / STAT_INDEX
    early = start_diff_files(repo, stat_index) if stat_index.exists() else None
    walk = None
    collecting = gc.isenabled()
    gc.disable()  # tens of thousands of small objects: the collector would run over them again and again
    try:
        walk = _Walk(repo, store, max_file_size)
        snap = walk.run(early)
        early = None
        return snap
    finally:
        if early is not None and early.process.returncode is None:
            early.process.kill()
            early.process.wait()
        if walk is not None:
            walk.close()
        if collecting:
            gc.enable()


class _Walk:
    def __init__(self, repo: Repo, store: Path, max_file_size: int) -> None:
        self.repo = repo
        self.store = store
        self.limit = max_file_size
        self.fmt = store_format(repo)
        self.cache = _load(store / "walk.cache", self.fmt, WALK_VERSIONS)
        self._recorded: dict[str, Any] | None = None  # entries.cache, read only when something changed
        self._tracked_sets: tuple[set[bytes], dict[bytes, str], set[bytes]] | None = None
        self.fds: dict[bytes, int | None] = {}
        self.notes: list[str] = []

    @property
    def recorded(self) -> dict[str, Any]:
        """entries: path -> [mode, oid, ino, size, mtime, ctime, dev, uid, gid]; tracked: [index signature,
        tracked paths, gitlinks]."""
        if self._recorded is None:
            loaded = _load(self.store / "entries.cache", self.fmt)
            if not self.cache["index_written"]:
                loaded = _empty(self.fmt)
            loaded.setdefault("entries", {})
            loaded.setdefault("tracked", None)
            self._recorded = loaded
        return self._recorded

    def close(self) -> None:
        for fd in self.fds.values():
            if fd is not None:
                os.close(fd)

    # -- the walk ----------------------------------------------------------------------------------

    def run(self, early: Pending | None) -> Snapshot:
        """early: `git diff-files` on the stat index, already started (None when there is no stat index)."""
        # deferred: start-up (git.ignore: only taking a snapshot reads ignore rules; a launch takes none)
        from agentbox.git import ignore

        started = time.time_ns()
        written = self.cache["index_written"]
        pending = early if written else None
        if early is not None and pending is None:
            early.process.kill()
            early.process.wait()
        try:
            tracked_sig = self._index_signature()
            global_rules, global_sig = self._global_rules()
            context = _digest(repr((global_sig, tracked_sig)).encode())
            matcher = ignore.Matcher(global_rules, ignore_case=self._ignore_case())
            old_dirs: dict[bytes, Any] = self.cache["dirs"]
            new_dirs: dict[bytes, Any] = {}  # folder -> [ino, mtime, context, has .gitignore, decided]
            unchanged = tracked_sig == self.cache["tracked_sig"]
            stack: list[tuple[bytes, Any, bytes, bool]] = [(b"", matcher, context, False)]
            while stack:
                folder, rules, ctx, inside_ignored = stack.pop()
                st = self._dir_stat(folder)
                if st is None:
                    unchanged = False
                    continue
                known: list[Any] = old_dirs.get(folder) or [None, None, None, False, None]
                same_listing = known[0] == st.st_ino and known[1] == st.st_mtime_ns
                names = None if same_listing else self._listing(folder)
                if names is None and not same_listing:
                    unchanged = False
                    continue
                has_rules = known[3] if names is None else (b".gitignore" in names and names[b".gitignore"] != "d")
                if has_rules:
                    sig, rules = self._folder_rules(folder, rules)
                    ctx = _digest(ctx + repr(sig).encode())
                if same_listing and known[2] == ctx:
                    decided = known[4]
                else:
                    unchanged = False
                    names = names if names is not None else self._listing(folder)
                    if names is None:
                        continue
                    tracked, gitlinks, tracked_dirs = self._tracked(tracked_sig)
                    decided = self._decide(folder, names, rules, tracked, gitlinks, tracked_dirs, inside_ignored)
                new_dirs[folder] = [st.st_ino, st.st_mtime_ns, ctx, has_rules, decided]
                if decided[2]:
                    self.notes.extend(decided[2])
                for name, ignored in decided[1]:
                    sub_ctx = _digest(ctx + b"ignored") if ignored else ctx
                    stack.append((_join(folder, name), rules, sub_ctx, inside_ignored or ignored))
            # A stat index recorded as written but gone: git would take it as empty and report nothing changed.
            reported = self._unusable() if written and early is None else self._reported(pending)
            pending = None
        finally:
            if pending is not None:
                pending.process.kill()
                pending.process.wait()
        changed = [path for path in reported if path] if reported is not None else []
        unchanged = unchanged and reported is not None and len(new_dirs) == len(old_dirs) and not changed
        return self._record(new_dirs, changed, unchanged, started, tracked_sig)

    def _reported(self, pending: Pending | None) -> list[bytes] | None:
        """The recorded paths whose stat changed; None when the stat index is unusable (damaged or gone):
        then every file is read again."""
        if pending is None:
            return []
        try:
            return pending.result().split(b"\0")
        except GitTimeout:
            raise
        except GitError:
            return self._unusable()

    def _unusable(self) -> list[bytes] | None:
        """None: the stat index cannot say what changed, so every file is read again (and the index written
        anew)."""
        self.cache["index_written"] = False
        self._recorded = None
        return None

    def _decide(self, folder: bytes, names: dict[bytes, str], rules: Any, tracked: set[bytes],
                gitlinks: dict[bytes, str], tracked_dirs: set[bytes], inside_ignored: bool) -> list[Any]:
        """Which entries of a folder are recorded (files) and walked (folders, with whether they are ignored:
        a tracked folder git ignores is walked for its tracked files only), and what is said about it."""
        kept: list[tuple[bytes, int]] = []
        subdirs: list[tuple[bytes, bool]] = []
        notes: list[str] = []
        for name, kind in sorted(names.items()):
            if not folder and name == b".git":
                continue
            path = _join(folder, name)
            shown = os.fsdecode(path)
            if path in gitlinks:
                kept.append((name, GITLINK))
                continue
            if kind == "d":
                ignored = inside_ignored or rules.is_ignored(shown, True)
                if path not in tracked_dirs and ignored:
                    continue
                if path not in tracked_dirs and self._is_nested_repository(path):
                    notes.append(f"{visible(shown)}/ is a nested git repository; its files are not captured")
                    continue
                subdirs.append((name, ignored))
            elif kind in ("f", "l") and (path in tracked or not (inside_ignored or rules.is_ignored(shown, False))):
                kept.append((name, LINK if kind == "l" else REGULAR))
        return [kept, subdirs, notes, any(kind == GITLINK for _, kind in kept)]

    def _is_nested_repository(self, path: bytes) -> bool:
        fd = self._folder_fd(path)
        if fd is None:
            return False
        try:
            os.stat(".git", dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def _listing(self, folder: bytes) -> dict[bytes, str] | None:
        """name -> "f" (regular file), "l" (link), "d" (folder) or "o" (anything else), read through the folder's
        descriptor; None when it is not a folder reached without a link."""
        fd = self._folder_fd(folder)
        if fd is None:
            return None
        found: dict[bytes, str] = {}
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        if entry.is_symlink():
                            kind = "l"
                        elif entry.is_dir(follow_symlinks=False):
                            kind = "d"
                        elif entry.is_file(follow_symlinks=False):
                            kind = "f"
                        else:
                            kind = "o"
                    except OSError:
                        continue
                    found[os.fsencode(entry.name)] = kind
        except OSError:
            return None
        return found

    # -- recording -----------------------------------------------------------------------------------

    def _record(self, dirs: dict[bytes, Any], reported: list[bytes], unchanged: bool, started: int,
                tracked_sig: Any) -> Snapshot:
        """The snapshot from what the walk found: the cached tree while nothing changed (no folder, no
        recorded file's stat, no file left out for its size), else the files that changed read into the
        store and the tree made anew from the last one."""
        tree = self.cache["tree"]
        if unchanged and tree and self.cache["commit"]:
            skipped = self._still_skipped(None)
            if skipped is not None:
                return self._finish(tree, skipped, dirs, tracked_sig, save=skipped != self.cache["skipped"])
        self._fill_files(dirs)
        files = {_join(folder, name): kind for folder, entry in dirs.items() for name, kind in entry[4][0]}
        skipped = self._still_skipped(files)
        entries: dict[bytes, list[Any]] = self.recorded["entries"]
        gitlinks = self._tracked(tracked_sig)[1] if any(kind == GITLINK for kind in files.values()) else {}
        changes: list[tuple[bytes, int | None, str | None]] = []
        for path in [path for path in entries if path not in files]:
            del entries[path]
            changes.append((path, None, None))
        todo = [path for path in files if path not in entries
                or (files[path] == GITLINK and entries[path][1] != gitlinks.get(path))
                or entries[path][3] > self.limit]
        todo += [path for path in reported if path in entries]
        todo += [path for path in (skipped or {}) if path in files]
        writer = ObjectWriter(self.repo, self.store, self.fmt)
        left_out: dict[bytes, int] = {}
        try:
            for path in dict.fromkeys(todo):
                kind = files.get(path)
                if kind is None:
                    continue
                had = entries.pop(path, None)
                if kind == GITLINK:
                    made: list[Any] | int | None = [GITLINK, gitlinks.get(path, "0" * 40), 0, 0, 0, 0, 0, 0, 0]
                else:
                    made = self._read(path, started, writer)
                if isinstance(made, list):
                    entries[path] = made
                    if had is None or had[:2] != made[:2]:
                        changes.append((path, made[0], made[1]))
                    continue
                if isinstance(made, int):
                    left_out[path] = made
                if had is not None:
                    changes.append((path, None, None))
            parent = self.cache["commit"] if self.cache["tree"] and not self._missing(self.cache["commit"]) else None
            if parent is None:
                changes = [(path, entry[0], entry[1]) for path, entry in sorted(entries.items())]
            if changes or parent is None:
                commit, tree = writer.finish(parent, changes)
            else:
                writer.abandon()
                commit, tree = self.cache["commit"], self.cache["tree"]
        except BaseException:
            writer.abandon()
            raise
        _write_index(self.store / STAT_INDEX, entries, self.fmt, started)
        _save(self.store / "entries.cache", self.recorded)
        self.cache["index_written"] = True
        self.cache["commit"] = commit
        return self._finish(tree, left_out, dirs, tracked_sig)

    def _finish(self, tree: str, skipped: dict[bytes, int], dirs: dict[bytes, Any], tracked_sig: Any,
                save: bool = True) -> Snapshot:
        """The snapshot; the walk's cache written when something in it changed."""
        if save:
            self.cache["tree"] = tree
            self.cache["skipped"] = skipped
            self.cache["tracked_sig"] = tracked_sig
            self._save_walk(dirs)
        notes = list(dict.fromkeys(self.notes))
        if any(entry[4][3] for entry in dirs.values()):
            notes.append("submodules are captured as the commit the index records for them, not their own changes")
        shown_skipped = sorted((os.fsdecode(path), size) for path, size in skipped.items())
        return Snapshot(tree, self._head(), shown_skipped, notes)

    def _fill_files(self, dirs: dict[bytes, Any]) -> None:
        """Each folder's recorded files (decided[0]) where the walk cache left them in its files cache."""
        wanted = [entry[4] for entry in dirs.values() if entry[4][0] is None]
        if not wanted:
            return
        name = self.cache.get("files")
        kept = _load(self.store / name, self.fmt, (WALK_VERSION,)) if isinstance(name, str) else {}
        found = kept.get("files")
        by_folder: dict[bytes, Any] = found if isinstance(found, dict) else {}
        for folder, entry in dirs.items():
            if entry[4][0] is None:
                if folder not in by_folder:
                    raise _StaleCache
                entry[4][0] = by_folder[folder]

    def _save_walk(self, dirs: dict[bytes, Any]) -> None:
        """walk.cache, its folders' recorded files in a files cache of a new generation (written first, so
        walk.cache never names one that is not whole); unchanged folders keep the one named already."""
        old = self.cache.get("files")
        if any(entry[4][0] is not None for entry in dirs.values()):
            self._fill_files(dirs)
            name = f"files.{time.time_ns():x}.{os.getpid()}.cache"
            _save(self.store / name, {"version": WALK_VERSION, "fmt": self.fmt,
                                      "files": {folder: entry[4][0] for folder, entry in dirs.items()}})
            self.cache["files"] = name
        self.cache["dirs"] = {folder: [*entry[:4], [None, *entry[4][1:]]] for folder, entry in dirs.items()}
        self.cache["version"] = WALK_VERSION
        _save(self.store / "walk.cache", self.cache)
        if old != self.cache.get("files"):  # the one it replaced, and any a crash left between the two writes
            for stale in self.store.glob("files.*.cache"):
                if stale.name != self.cache["files"]:
                    stale.unlink(missing_ok=True)

    def _missing(self, commit: str | None) -> bool:
        return not commit or tree_of(self.repo, commit) is None

    def _still_skipped(self, files: dict[bytes, int] | None) -> dict[bytes, int] | None:
        """Files left out for their size last time, when all are still there (in files, when given) and still
        too large (their sizes now); None when one of them changed (it is read again)."""
        found = {}
        for path in self.cache["skipped"]:
            st = self._lstat(path) if files is None or path in files else None
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_size <= self.limit:
                return None
            found[path] = st.st_size
        return found

    def _read(self, path: bytes, started: int, writer: ObjectWriter) -> list[Any] | int | None:
        """The stat entry of a file after writing its content to the store; its size when it is larger than
        the limit; None when it is no longer a regular file or link where it was listed."""
        folder, _, name = path.rpartition(b"/")
        parent = self._folder_fd(folder)
        if parent is None:
            return None
        try:
            before = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISLNK(before.st_mode):
            try:
                target = os.readlink(name, dir_fd=parent)
            except OSError:
                return None
            return _entry(LINK, writer.blob(os.fsencode(target)), before, started)
        if not stat.S_ISREG(before.st_mode):
            return None
        if before.st_size > self.limit:
            return before.st_size
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=parent)
        except OSError:
            return None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_ino, opened.st_dev) != (before.st_ino, before.st_dev):
                return None  # swapped between the listing and the open: not what was listed
            chunks = []
            left = self.limit + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if len(data) > self.limit:
            return len(data)
        mode = EXECUTABLE if opened.st_mode & stat.S_IXUSR else REGULAR
        oid = writer.blob(data)
        steady = (after.st_mtime_ns, after.st_ctime_ns, after.st_size) == (
            opened.st_mtime_ns, opened.st_ctime_ns, len(data))
        return _entry(mode, oid, after, started if steady else None)

    # -- what the workspace's git folder says (read by agentbox) -----------------------------------

    def _index_signature(self) -> Any:
        try:
            st = os.lstat(self.repo.git_dir / "index")
        except OSError:
            return None
        return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]

    def _tracked(self, sig: Any) -> tuple[set[bytes], dict[bytes, str], set[bytes]]:
        """The paths the workspace's index tracks, its gitlinks, and every folder on the way to a tracked path
        (read by agentbox.git.read when the index changed, else from the cache)."""
        # deferred: start-up (git.read: only taking a snapshot reads the repository; a launch takes none)
        from agentbox.git import read

        if self._tracked_sets is not None:
            return self._tracked_sets
        known = self.recorded["tracked"]
        if known is not None and known[0] == sig:
            tracked, gitlinks = set(known[1]), dict(known[2])
        else:
            tracked, gitlinks = set(), {}
            if sig is not None:
                try:
                    for entry in read.read_index(self.repo.git_dir / "index", MAX_INDEX, fmt=self.fmt):
                        path = os.fsencode(entry.path)
                        tracked.add(path)
                        if entry.mode == GITLINK:
                            gitlinks[path] = entry.oid
                except read.GitReadError as exc:
                    self.notes.append(f"the workspace's index could not be read ({exc.message}); tracked files that "
                                      "the ignore rules match are not captured")
            self.recorded["tracked"] = [sig, sorted(tracked), gitlinks]
        tracked_dirs = {b""}
        for path in tracked:
            folder = path.rpartition(b"/")[0]
            while folder and folder not in tracked_dirs:
                tracked_dirs.add(folder)
                folder = folder.rpartition(b"/")[0]
        self._tracked_sets = (tracked, gitlinks, tracked_dirs)
        return self._tracked_sets

    def _global_rules(self) -> tuple[list[Any], Any]:
        # deferred: start-up (git.ignore: only taking a snapshot reads ignore rules; a launch takes none)
        from agentbox.git import ignore

        found = []
        signatures = []
        for path, source in ((self.repo.common_dir / "info" / "exclude", "info/exclude"),
                             (_global_excludes(), "the global excludes file")):
            if path is None:
                continue
            data, sig = _read_rules(path)
            signatures.append(sig)
            found.append(ignore.parse_capped(data, "", source, MAX_RULES))
        return found, signatures

    def _folder_rules(self, folder: bytes, rules: Any) -> tuple[Any, Any]:
        # deferred: start-up (git.ignore: only taking a snapshot reads ignore rules; a launch takes none)
        from agentbox.git import ignore

        parent = self._folder_fd(folder)
        data, sig = (None, None) if parent is None else _read_at(parent, b".gitignore", MAX_RULES)
        base = os.fsdecode(folder)
        source = f"{base}/.gitignore" if base else ".gitignore"
        return sig, rules.with_dir(base, ignore.parse_capped(data, base, source, MAX_RULES))

    def _ignore_case(self) -> bool:
        # deferred: start-up (git.read: only taking a snapshot reads the repository; a launch takes none)
        from agentbox.git import read

        try:
            value = read.config_value(self.repo.common_dir, "core", "ignorecase")
        except read.GitReadError:
            return False
        return (value or "").lower() in ("true", "yes", "on", "1")

    def _head(self) -> str | None:
        # deferred: start-up (git.read: only taking a snapshot reads the repository; a launch takes none)
        from agentbox.git import read

        try:
            return read.head(self.repo.git_dir, self.repo.common_dir)
        except read.GitReadError as exc:
            self.notes.append(f"HEAD could not be read ({exc.message}); the checkpoint names no HEAD")
            return None

    # -- file-system access, never through a link --------------------------------------------------

    def _folder_fd(self, folder: bytes) -> int | None:
        if folder in self.fds:
            return self.fds[folder]
        if not folder:
            try:
                fd: int | None = os.open(self.repo.work_tree, DIR_FLAGS)
            except OSError:
                fd = None
        else:
            parent_name, _, name = folder.rpartition(b"/")
            parent = self._folder_fd(parent_name)
            try:
                fd = None if parent is None else os.open(name, DIR_FLAGS, dir_fd=parent)
            except OSError:
                fd = None
        self.fds[folder] = fd
        return fd

    def _dir_stat(self, folder: bytes) -> os.stat_result | None:
        """A folder's lstat by its path (one call; only its data is used: anything read is reached through
        folder descriptors), None when it is not a folder now."""
        try:
            st = os.lstat(os.fsencode(self.repo.work_tree) + (b"/" + folder if folder else b""))
        except OSError:
            return None
        return st if stat.S_ISDIR(st.st_mode) else None

    def _lstat(self, path: bytes) -> os.stat_result | None:
        folder, _, name = path.rpartition(b"/")
        if not path:
            try:
                return os.lstat(self.repo.work_tree)
            except OSError:
                return None
        parent = self._folder_fd(folder)
        if parent is None:
            return None
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return None


def _entry(mode: int, oid: str, st: os.stat_result, started: int | None) -> list[Any]:
    # Recorded with mtime 0 (so reported changed and read again) when it may be racily clean.
    recent = started is None or st.st_mtime_ns >= started - RACY_NS or st.st_ctime_ns >= started - RACY_NS
    mtime = 0 if recent else st.st_mtime_ns
    return [mode, oid, st.st_ino, st.st_size, mtime, st.st_ctime_ns, st.st_dev, st.st_uid, st.st_gid]


def _join(folder: bytes, name: bytes) -> bytes:
    return folder + b"/" + name if folder else name


def _digest(data: bytes) -> bytes:
    return hashlib.sha1(data).digest()


# -- the git index for diff-files ---------------------------------------------------------------------


def _write_index(path: Path, entries: dict[bytes, list[Any]], fmt: str, started: int) -> None:
    """A version 2 git index of the recorded entries (their stat data), dated `started` so that git
    judges no entry racily clean (the recent ones are recorded with mtime 0)."""
    mask = 0xFFFFFFFF
    parts = [b"DIRC", struct.pack(">II", 2, len(entries))]
    for name in sorted(entries):
        mode, oid, ino, size, mtime, ctime, dev, uid, gid = entries[name]
        fixed = struct.pack(">IIIIIIIIII", (ctime // 1_000_000_000) & mask, ctime % 1_000_000_000,
                            (mtime // 1_000_000_000) & mask, mtime % 1_000_000_000, dev & mask, ino & mask,
                            mode, uid & mask, gid & mask, size & mask)
        body = fixed + bytes.fromhex(oid) + struct.pack(">H", min(len(name), 0xFFF)) + name
        parts.append(body + b"\0" * (8 - len(body) % 8))
    data = b"".join(parts)
    digest = hashlib.sha1 if fmt == "sha1" else hashlib.sha256
    data += digest(data).digest()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.utime(tmp, ns=(started, started))
    os.replace(tmp, path)


# -- the cache ---------------------------------------------------------------------------------------


def _empty(fmt: str) -> dict[str, Any]:
    return {"version": CACHE_VERSION, "fmt": fmt, "dirs": {}, "tree": None, "commit": None, "skipped": {},
            "index_written": False, "tracked_sig": "unknown", "files": None}


def _load(path: Path, fmt: str, versions: tuple[int, ...] = (CACHE_VERSION,)) -> dict[str, Any]:
    try:
        data = marshal.loads(path.read_bytes())  # marshal.load on a file reads it in tiny pieces
    except (OSError, EOFError, ValueError, TypeError):
        return _empty(fmt)
    if not isinstance(data, dict) or data.get("version") not in versions or data.get("fmt") != fmt:
        return _empty(fmt)
    return data


def _save(path: Path, cache: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(marshal.dumps(cache))
    os.replace(tmp, path)


# -- rule files, read by agentbox --------------------------------------------------------------------


def _read_at(parent: int, name: bytes, limit: int) -> tuple[bytes | None, Any]:
    """A rules file under a folder descriptor, read by agentbox's one reader of agent-written files
    (agentbox.vmread: never through a link, never blocking, at most limit bytes); (None, None) when it is
    absent or not such a file (a larger one counts as absent too: git would not read rules from it either
    way we could trust)."""
    try:
        data, st = vmread.read_checked(parent, os.fsdecode(name), limit)
    except vmread.Refused:
        return None, None
    return data, [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_rules(path: Path) -> tuple[bytes | None, Any]:
    try:
        parent = os.open(path.parent, DIR_FLAGS)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            return None, None
        return None, None
    try:
        return _read_at(parent, os.fsencode(path.name), MAX_RULES)
    finally:
        os.close(parent)


def _global_excludes() -> Path | None:
    """The host user's own global excludes file (host-controlled): core.excludesFile of ~/.gitconfig when it
    names one plainly, else $XDG_CONFIG_HOME/git/ignore."""
    # deferred: start-up (git.read: only taking a snapshot reads the repository; a launch takes none)
    from agentbox.git import read

    xdg = os.environ.get("XDG_CONFIG_HOME") or str(paths.home() / ".config")
    for config in (paths.home() / ".gitconfig", Path(xdg) / "git" / "config"):
        try:
            value = read.config_file_value(config, "core", "excludesfile")
        except read.GitReadError:
            value = None
        if value:
            return Path(os.path.expanduser(value))
    return Path(xdg) / "git" / "ignore"
