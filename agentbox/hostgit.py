"""Host git that the repository cannot make run anything: the only module that runs git on the host.

The workspace's `.git` is written by the agent, so its config, hooks and attributes are attacker
input. Every call here therefore builds git's environment from scratch (no system or global config,
no GIT_* variable of the user's, HOME pointing at agentbox's own folder, no pager) and passes
`-c core.hooksPath=/dev/null -c core.fsmonitor=false -c protocol.allow=never` (the last one stops a
lazy fetch of a partial clone from starting a transport the repository's config names).

Work-tree commands (status, update-index, write-tree, diff-tree, cat-file, apply) run against a
**shadow git folder** agentbox owns, `<workspace state dir>/git/`: its HEAD, config, info/exclude and
index are written by agentbox; only the objects are the repository's (GIT_OBJECT_DIRECTORY). Its
config defines no filter, diff driver, textconv or merge driver, so `.gitattributes` naming one has
no effect (git treats an undefined driver as absent). The repository's own config is read by git
only in the calls that must touch the real repository: reading HEAD and the object format
(`rev-parse`), core.ignoreCase (`config`), and writing or reading refs (`update-ref`, `for-each-ref`,
`rev-parse --verify`); none of them runs a hook, filter or pager with the overrides above, and none
reads an object but the one update-ref checks, which agentbox just wrote (so no lazy fetch).

git opens `.gitignore`, `.gitattributes` and the files of `.git` without checking what they are, and
a FIFO there makes it wait forever. Every call has a time limit (time_limit() lowers it for a
launch); when one runs out, the FIFOs git may be waiting on are found, named in the error and
remembered, so the next snapshot fails at once while they are still there.

Snapshot (the working tree as a tree object, the user's index untouched), one walk over the tree:
1. the shadow index is a copy of the user's index when that file's stat signature changed since
   the last copy, else the one agentbox kept from its last snapshot (it then still holds the files
   that were untracked then: those that became ignored since are dropped with `check-ignore`);
2. the shadow HEAD is the real HEAD commit, detached (an unborn branch when there is none), or,
   while the shadow index still holds the tree of the last checkpoint, that checkpoint's commit:
   status then finds the index equal to HEAD through its cache tree without comparing folders;
3. `git status -z --porcelain=v1 -uall --no-renames --ignore-submodules=all` refreshes the shadow
   index and lists worktree-side changes and untracked files (untracked cache on);
4. each of those paths is lstat'ed (never followed): regular files larger than max_file_size are
   skipped and named, FIFOs, sockets and devices left out, an untracked folder (`?? dir/`, a
   nested repository) noted as not captured;
5. `git update-index -z --add --remove --replace --stdin` records the rest, `git write-tree` makes
   the tree.
The alternative, `git add -A` on the shadow index (then `write-tree`), cannot leave out large files
or special files without a walk of its own to find them first, and is slower anyway: `git add` does
not use the untracked cache. benchmarks/run.py measures both on 50,000 files: `add -A` took 1.4 times
as long unchanged and 1.3 times as long after 100 changed files, so the status path is kept.

The copy of the user's index keeps that file's mtime, so git's racy-timestamp checks judge the copy
exactly as they would the original (a file changed in the same clock tick as the index was written
is hashed again). An index the agent's git wrote inside the VM may record other inode and owner
numbers than the host sees: the first snapshot after it then hashes every file once (correct, only
slower); the shadow index it leaves behind is fast again.

Submodules are captured as the commit their gitlink records in the index; their own changes are not.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from agentbox import gitdirs, paths
from agentbox.errors import StateError
from agentbox.fsutil import locked, private_dir
from agentbox.safetext import visible

TIMEOUT = 300  # seconds a git call may take (time_limit() lowers it); a FIFO can make git wait forever
MAX_SCANNED = 500_000  # entries looked at to name the FIFOs that stopped git
MAX_INDEX = 1 << 30  # the user's index is copied only up to this size
MAX_EXCLUDE = 1 << 20  # info/exclude
MAX_MESSAGE = 2000  # characters of git's stderr shown in an error
IDENTITY = {"GIT_AUTHOR_NAME": "agentbox", "GIT_AUTHOR_EMAIL": "agentbox@localhost",
            "GIT_COMMITTER_NAME": "agentbox", "GIT_COMMITTER_EMAIL": "agentbox@localhost"}
_SAFE = ("--no-pager", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
         "-c", "protocol.allow=never")
_DIFF = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-renames")
_UNBORN = b"ref: refs/heads/agentbox-unborn\n"
SHADOW_LAYOUT = 2  # raise it when the shadow's config changes: existing ones are then rewritten


class GitError(StateError):
    """A host git call failed; the message names the command and quotes git (escaped)."""


class GitMissing(GitError):
    """git is not installed on the host."""


class GitTimeout(GitError):
    """A git call did not finish in time (a FIFO where git reads, or a very slow disk)."""


class _TimedOut(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class Repo(NamedTuple):
    work_tree: Path  # the workspace
    git_dir: Path  # this checkout's git folder (a linked worktree's own)
    common_dir: Path  # objects and refs


class Snapshot(NamedTuple):
    tree: str
    head: str | None
    skipped: list[tuple[str, int]]  # (path, size) larger than the limit, not captured
    notes: list[str]  # what else was not captured (nested repositories, submodules' own changes)


class TreeChange(NamedTuple):
    status: str  # "A" added since old, "D" deleted, "M" modified, "T" type changed
    path: str
    old_mode: str
    new_mode: str
    old_oid: str
    new_oid: str


def available() -> bool:
    return shutil.which("git") is not None


def find(workspace: Path) -> Repo | None:
    """The workspace as a git work tree (it has its own `.git`), or None. Runs no git."""
    work_tree = Path(os.path.realpath(workspace))
    dirs = gitdirs.locate(work_tree)
    if dirs.git_dir is None or dirs.common_dir is None:
        return None
    return Repo(work_tree, dirs.git_dir, dirs.common_dir)


def shadow_dir(repo: Repo) -> Path:
    return paths.workspace_state_dir(repo.work_tree) / "git"


def head(repo: Repo) -> str | None:
    """HEAD's commit id; None when there are no commits yet."""
    return _real_head(repo)[1]


def object_format(repo: Repo) -> str:
    return _real_head(repo)[0]


def snapshot(repo: Repo, max_file_size: int) -> Snapshot:
    """The working tree (tracked files and untracked files that are not ignored) as a tree object."""
    with _shadow_locked(repo) as shadow:
        return _snapshot(repo, shadow, max_file_size)


def commit(repo: Repo, tree: str, parent: str | None, message: str) -> str:
    """A commit object of tree (parented on parent) in the repository's objects; no ref is written."""
    _check_objects(repo)
    args = ["commit-tree", "--no-gpg-sign", *(("-p", parent) if parent else ()), "-F", "-", tree]
    made = _shadow_git(repo, args, input=message.encode()).decode().strip()
    shadow = shadow_dir(repo)
    try:
        if (shadow / "tree").read_text().strip() == tree:
            # The next status compares the shadow index with this commit instead of HEAD: with the
            # index's cache tree equal to it, git skips the comparison (it costs 20-60 ms on 50,000
            # files when the working tree differs from HEAD in many folders).
            _put(shadow / "base", (made + "\n").encode())
    except OSError:
        pass
    return made


def set_ref(repo: Repo, ref: str, commit: str) -> None:
    _check_ref(ref)
    _real_git(repo, ["update-ref", "-m", "agentbox checkpoint", ref, commit])


def delete_refs(repo: Repo, refs: list[str]) -> None:
    """Delete refs from the real repository (those already gone are fine)."""
    if not refs:
        return
    for ref in refs:
        _check_ref(ref)
    commands = "".join(f"delete {ref}\n" for ref in refs).encode()
    _real_git(repo, ["update-ref", "--stdin"], input=commands)


def resolve(repo: Repo, rev: str) -> str | None:
    """The object id a ref (or HEAD) names in the real repository; None when it does not exist."""
    if rev != "HEAD":
        _check_ref(rev)
    out = _real_git(repo, ["rev-parse", "-q", "--verify", "--end-of-options", rev], ok=(0, 1))
    return out.decode().strip() or None


def refs(repo: Repo, prefix: str) -> dict[str, str]:
    """Every ref under prefix in the real repository, with the object it names (one `for-each-ref`)."""
    _check_ref(prefix)
    out = _real_git(repo, ["for-each-ref", "--format=%(refname) %(objectname)", prefix])
    found = {}
    for line in out.decode(errors="replace").splitlines():
        name, _, oid = line.rpartition(" ")
        found[name] = oid
    return found


def commit_trees(repo: Repo, commits: list[str]) -> dict[str, str | None]:
    """The tree each commit holds (None when the object is missing, not a commit, or altered: its content
    no longer hashes to its id), in one `cat-file --batch`."""
    wanted = list(dict.fromkeys(commits))
    for oid in wanted:
        _check_oid(oid)
    objects = _batch(repo, wanted)
    found: dict[str, str | None] = {}
    for oid in wanted:
        kind, content = objects.get(oid, (b"", b""))
        tree = None
        if kind == b"commit" and content.startswith(b"tree ") and _object_id(b"commit", content, len(oid)) == oid:
            tree = content[5:content.index(b"\n")].decode()
        found[oid] = tree
    return found


def change_counts(repo: Repo, pairs: list[tuple[str, str]]) -> list[dict[str, int]]:
    """For each (old tree, new tree): how many files were added, modified, deleted ("A", "M", "D", "T")."""
    if not pairs:
        return []
    out = _shadow_git(repo, ["diff-tree", "--stdin", "-r", "--raw", *_DIFF],
                      input="".join(f"{old} {new}\n" for old, new in pairs).encode())
    counts: list[dict[str, int]] = []
    for line in out.split(b"\n"):
        if line.startswith(b":") and counts:
            status = line.split(b"\t", 1)[0].rsplit(b" ", 1)[-1][:1].decode()
            counts[-1][status] = counts[-1].get(status, 0) + 1
        elif line:
            counts.append({})
    return counts


def tree_of(repo: Repo, commit: str) -> str | None:
    """The tree a commit object holds, read from the objects (not through the real repository); None when
    the object is missing or not a commit."""
    _check_oid(commit)
    out = _shadow_git(repo, ["rev-parse", "-q", "--verify", "--end-of-options", f"{commit}^{{tree}}"], ok=(0, 1))
    return out.decode().strip() or None


def changes(repo: Repo, old_tree: str, new_tree: str, paths: list[str] | None = None) -> list[TreeChange]:
    """What differs between two trees, file by file (no rename detection)."""
    out = _shadow_git(repo, ["diff-tree", "-r", "-z", "--raw", *_DIFF, old_tree, new_tree, *_pathspec(paths)])
    fields = out.split(b"\0")
    found = []
    for index in range(0, len(fields) - 1, 2):
        meta, name = fields[index], fields[index + 1]
        old_mode, new_mode, old_oid, new_oid, status = meta.lstrip(b":").decode().split(" ")
        found.append(TreeChange(status[0], os.fsdecode(name), old_mode, new_mode, old_oid, new_oid))
    return found


def diff(repo: Repo, old_tree: str, new_tree: str, *, stat: bool = False, name_only: bool = False,
         binary: bool = False, paths: list[str] | None = None) -> bytes:
    """`git diff-tree` between two trees: a patch (`git apply` reads it back when binary), --stat or --name-only."""
    if name_only:
        shape = ["--name-only"]
    elif stat:
        shape = ["--stat"]
    else:
        shape = ["-p", *(("--binary", "--full-index") if binary else ())]
    return _shadow_git(repo, ["diff-tree", "-r", *shape, *_DIFF, old_tree, new_tree, *_pathspec(paths)])


def read_blobs(repo: Repo, oids: list[str]) -> dict[str, bytes]:
    """Blob contents by id (one `cat-file --batch`); each is checked against its id, so a loose object
    file the agent overwrote is refused rather than restored."""
    wanted = list(dict.fromkeys(oids))
    if not wanted:
        return {}
    for oid in wanted:
        _check_oid(oid)
    objects = _batch(repo, wanted)
    blobs: dict[str, bytes] = {}
    for oid in wanted:
        kind, content = objects.get(oid, (b"", b""))
        if kind != b"blob":
            raise GitError(f"the object {oid} is missing from the repository {visible(str(repo.common_dir))} "
                           f"(or is not a file's content)",
                           hint="Something deleted or garbage-collected it; this checkpoint cannot be restored.")
        if _object_id(b"blob", content, len(oid)) != oid:
            raise GitError(f"the object {oid} in {visible(str(repo.common_dir))} does not hold what its id says: "
                           f"it was altered after it was written", hint="Do not trust this checkpoint's content.")
        blobs[oid] = content
    return blobs


def _batch(repo: Repo, oids: list[str]) -> dict[str, tuple[bytes, bytes]]:
    """oid -> (type, content) of the objects that exist, read by one `cat-file --batch`."""
    if not oids:
        return {}
    out = _shadow_git(repo, ["cat-file", "--batch"], input="".join(f"{oid}\n" for oid in oids).encode())
    found = {}
    position = 0
    for oid in oids:
        end = out.index(b"\n", position)
        header = out[position:end].split(b" ")
        position = end + 1
        if len(header) != 3:
            continue  # "<oid> missing"
        size = int(header[2])
        found[oid] = (header[1], out[position:position + size])
        position += size + 1
    return found


def apply(repo: Repo, patch: bytes, *, check_only: bool, three_way: bool = False) -> None:
    """`git apply` (or `--check`) of patch to the working tree; raises GitError with git's message.

    three_way uses (and leaves changed) the shadow index, which is brought up to date with the working
    tree first and copied afresh from the user's index by the next snapshot. `git apply --3way --check`
    does not try the merge (it passes a patch whose merge will conflict, and the apply then leaves
    conflict markers in the working tree), so the three-way check merges into the shadow index alone
    (`--cached`): a conflict fails it with the working tree untouched.
    """
    args = ["apply", "--whitespace=nowarn", *(("--check",) if check_only else ())]
    if not three_way:
        _shadow_git(repo, [*args, "-"], input=patch, what="git apply")
        return
    with _shadow_locked(repo) as shadow:
        try:
            _snapshot(repo, shadow, max_file_size=1 << 62)
            _index_changing(shadow)
            if check_only:
                _shadow_git(repo, ["apply", "--whitespace=nowarn", "--cached", "--3way", "-"], input=patch,
                            what="git apply --3way")
            else:
                _shadow_git(repo, [*args, "--3way", "-"], input=patch, what="git apply --3way")
        finally:
            _forget_index(shadow)


# -- snapshot ---------------------------------------------------------------------------------------


def _snapshot(repo: Repo, shadow: Path, max_file_size: int) -> Snapshot:
    _refuse_known_fifos(repo, shadow)
    fmt, head_oid = _real_head(repo)
    _write_settings(repo, shadow, fmt)
    _copy_exclude(repo, shadow)
    fresh = _sync_index(repo, shadow)
    base = None if fresh else _read_base(shadow)
    _put_if_changed(shadow / "HEAD", f"{base or head_oid}\n".encode() if base or head_oid else _UNBORN)
    extras = set() if fresh else _read_extras(shadow)
    notes: list[str] = []
    try:
        listing = _status(repo)
    except GitTimeout:
        raise
    except GitError:
        if base:  # pruned and collected since: compare with the real HEAD instead
            (shadow / "base").unlink(missing_ok=True)
            return _snapshot(repo, shadow, max_file_size)
        if head_oid and tree_of(repo, head_oid) is None:
            notes.append(f"HEAD names {head_oid}, which is not a commit in the repository; the snapshot has no parent")
            head_oid = None
            _put_if_changed(shadow / "HEAD", _UNBORN)
        elif fresh:
            # A copied index git cannot read without the user's git folder (a split index): start from HEAD.
            _index_changing(shadow)
            _shadow_git(repo, ["read-tree", *((head_oid,) if head_oid else ("--empty",))])
        else:  # agentbox's own index is damaged (a crash?): copy the user's again
            _forget_index(shadow)
            return _snapshot(repo, shadow, max_file_size)
        listing = _status(repo)
    _check_objects(repo)
    kept = _drop_newly_ignored(repo, shadow, extras)
    newly_ignored, extras = extras - kept, kept
    record: list[bytes] = []
    gone: list[bytes] = []
    real_folders: dict[bytes, bool] = {}
    skipped: list[tuple[str, int]] = []
    for code, name in listing:
        if name in newly_ignored:
            continue  # listed as changed before it left the index: recording it would bring it back
        if code == b"??":
            if name.endswith(b"/"):
                notes.append(f"{visible(os.fsdecode(name))} is a nested git repository; its files are not captured")
                continue
        elif code[1:2] == b" " and code not in (b"DD", b"AA") and b"U" not in code:
            continue  # changed in the index only: the index already holds the working tree's version
        if _beyond_link(repo.work_tree, name, real_folders):
            # A folder on the way became a symlink: the file is gone from the tree (git refuses
            # to --remove a path "beyond a symbolic link"; lstat would follow the link).
            gone.append(name)
            extras.discard(name)
            continue
        try:
            st = os.lstat(repo.work_tree / os.fsdecode(name))
        except (FileNotFoundError, NotADirectoryError):
            record.append(name)  # deleted: --remove takes it out
            extras.discard(name)
            continue
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            if st.st_size > max_file_size:
                skipped.append((os.fsdecode(name), st.st_size))
                continue
        elif not stat.S_ISLNK(st.st_mode):
            continue  # FIFOs, sockets, devices; a folder where a file was is handled by --replace
        record.append(name)
        if code == b"??":
            extras.add(name)
    if gone:
        _index_changing(shadow)
        _shadow_git(repo, ["update-index", "-z", "--force-remove", "--stdin"],
                    input=b"".join(name + b"\0" for name in gone))
    if record:
        _index_changing(shadow)
        _shadow_git(repo, ["update-index", "-z", "--add", "--remove", "--replace", "--stdin"],
                    input=b"".join(name + b"\0" for name in record))
    tree = _tree_of_index(repo, shadow)
    _write_extras(shadow, extras)
    if os.path.lexists(repo.work_tree / ".gitmodules"):
        notes.append("submodules are captured as the commit the index records for them, not their own changes")
    return Snapshot(tree, head_oid, skipped, notes)


def _beyond_link(work_tree: Path, name: bytes, real_folders: dict[bytes, bool]) -> bool:
    """Whether a folder on the way to name is not a real folder (a symlink, a file, missing)."""
    parts = name.split(b"/")[:-1]
    for depth in range(1, len(parts) + 1):
        folder = b"/".join(parts[:depth])
        if folder not in real_folders:
            try:
                real_folders[folder] = stat.S_ISDIR(os.lstat(os.fsencode(work_tree) + b"/" + folder).st_mode)
            except OSError:
                real_folders[folder] = False
        if not real_folders[folder]:
            return True
    return False


def _status(repo: Repo) -> list[tuple[bytes, bytes]]:
    out = _shadow_git(repo, ["status", "-z", "--porcelain=v1", "-uall", "--no-renames",
                             "--ignore-submodules=all"])
    return [(entry[:2], entry[3:]) for entry in out.split(b"\0") if entry]


def _tree_of_index(repo: Repo, shadow: Path) -> str:
    """`git write-tree`, or the tree it wrote last time when the index's content has not changed since
    (status only refreshes stat data; every change of content goes through _index_changing)."""
    known = shadow / "tree"
    try:
        tree = known.read_text().strip()
        if tree:
            return tree
    except OSError:
        pass
    tree = _shadow_git(repo, ["write-tree"]).decode().strip()
    _put(known, (tree + "\n").encode())
    return tree


def _read_base(shadow: Path) -> str | None:
    """A commit of the tree the shadow index last held (see commit()), or None."""
    try:
        base = (shadow / "base").read_text().strip()
    except OSError:
        return None
    return base or None


def _index_changing(shadow: Path) -> None:
    """Called before anything changes the shadow index's content: the tree written from it is stale."""
    (shadow / "tree").unlink(missing_ok=True)


def _drop_newly_ignored(repo: Repo, shadow: Path, extras: set[bytes]) -> set[bytes]:
    """Files a reused shadow index holds only because they were untracked before: those the ignore
    rules now match leave it (an untracked, ignored file is not part of a snapshot)."""
    if not extras:
        return extras
    out = _shadow_git(repo, ["check-ignore", "-z", "--no-index", "--stdin"],
                      input=b"".join(name + b"\0" for name in extras), ok=(0, 1), literal=False)
    ignored = [name for name in out.split(b"\0") if name]
    if ignored:
        _index_changing(shadow)
        _shadow_git(repo, ["update-index", "-z", "--force-remove", "--stdin"],
                    input=b"".join(name + b"\0" for name in ignored))
    return extras - set(ignored)


def _sync_index(repo: Repo, shadow: Path) -> bool:
    """Copy the user's index into the shadow when it changed since the last copy; True when copied."""
    source = repo.git_dir / "index"
    try:
        st = os.lstat(source)
        signature = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns] if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        signature = None
    stamp = shadow / "index.source"
    try:
        known = json.loads(stamp.read_text())
    except (OSError, ValueError):
        known = "unknown"
    if known == signature and (shadow / "index").exists():
        return False
    data = _read_regular(source, MAX_INDEX) if signature else None
    _index_changing(shadow)
    if data is None:
        (shadow / "index").unlink(missing_ok=True)
    else:
        _put(shadow / "index", data)
        os.utime(shadow / "index", ns=(st.st_atime_ns, st.st_mtime_ns))
    _put(stamp, json.dumps(signature).encode())
    return True


def _forget_index(shadow: Path) -> None:
    _index_changing(shadow)
    (shadow / "index.source").unlink(missing_ok=True)


def _read_extras(shadow: Path) -> set[bytes]:
    try:
        return {name for name in (shadow / "extras").read_bytes().split(b"\0") if name}
    except OSError:
        return set()


def _write_extras(shadow: Path, extras: set[bytes]) -> None:
    _put_if_changed(shadow / "extras", b"".join(name + b"\0" for name in sorted(extras)))


# -- the shadow git folder --------------------------------------------------------------------------


@contextmanager
def _shadow_locked(repo: Repo) -> Iterator[Path]:
    """The shadow folder, set up, held by this process alone (two launches of one workspace snapshot in turn)."""
    shadow = private_dir(shadow_dir(repo))
    (shadow / "refs").mkdir(exist_ok=True)
    (shadow / "info").mkdir(exist_ok=True)
    with locked(shadow / "lock"):
        yield shadow


def _create_shadow(repo: Repo) -> None:
    """A shadow folder git accepts, for reading objects before any snapshot made one."""
    with _shadow_locked(repo) as shadow:
        _write_settings(repo, shadow, object_format(repo))
        if not (shadow / "HEAD").exists():
            _put_if_changed(shadow / "HEAD", _UNBORN)


def _write_settings(repo: Repo, shadow: Path, fmt: str) -> None:
    """The shadow's config; rebuilt only when the config files it is read from change (stat signature)."""
    sources = [repo.common_dir / "config", repo.git_dir / "config.worktree", *_global_config_files()]
    stamp = {"layout": SHADOW_LAYOUT, "format": fmt, "sources": [_signature(path) for path in sources]}
    stamp_file = shadow / "config.source"
    try:
        if json.loads(stamp_file.read_text()) == stamp and (shadow / "config").exists():
            return
    except (OSError, ValueError):
        pass
    core = {"repositoryformatversion": "1" if fmt != "sha1" else "0", "bare": "false",
            "untrackedCache": "true", "symlinks": "true", "filemode": "true", "autocrlf": "false",
            "splitIndex": "false", "quotePath": "true"}
    core.update(_case_settings(repo))
    excludes = _global_excludes()
    if excludes:
        core["excludesFile"] = excludes
    lines = ["[core]", *(f"\t{key} = {_quote(value)}" for key, value in core.items()),
             "[gc]", "\tauto = 0", "[index]", "\tsparse = false",
             # the untracked cache serves `status -uall` only when this is configured (git 2.36+)
             "[status]", "\tshowUntrackedFiles = all"]
    if fmt != "sha1":
        lines += ["[extensions]", f"\tobjectFormat = {fmt}"]
    old = (shadow / "config").read_bytes() if (shadow / "config").exists() else None
    new = ("\n".join(lines) + "\n").encode()
    if old is not None and old != new and f"objectFormat = {fmt}" not in old.decode(errors="replace"):
        (shadow / "index").unlink(missing_ok=True)  # an index of the other object format
        _forget_index(shadow)
    _put_if_changed(shadow / "config", new)
    _put(stamp_file, json.dumps(stamp).encode())


def _case_settings(repo: Repo) -> dict[str, str]:
    """core.ignoreCase and core.precomposeUnicode as `git init` found them for this file system (macOS)."""
    out = _real_git(repo, ["config", "-z", "--get-regexp", r"^core\.(ignorecase|precomposeunicode)$"], ok=(0, 1))
    found = {}
    for entry in out.split(b"\0"):
        key, _, value = entry.decode(errors="replace").partition("\n")
        if key and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            found["ignoreCase" if key.endswith("ignorecase") else "precomposeUnicode"] = value.lower()
    return found


def _global_config_files() -> list[Path]:
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(paths.home() / ".config")
    return [paths.home() / ".gitconfig", Path(xdg) / "git" / "config"]


def _global_excludes() -> str | None:
    """The host user's own global excludes file (host-controlled, so trusted), if there is one."""
    env = {**_base_env(paths.home()), "HOME": str(paths.home())}
    del env["GIT_CONFIG_GLOBAL"]
    if os.environ.get("XDG_CONFIG_HOME"):
        env["XDG_CONFIG_HOME"] = os.environ["XDG_CONFIG_HOME"]
    try:
        result = _run(["config", "--global", "--includes", "--path", "--get", "core.excludesFile"], env, Path("/"))
    except _TimedOut:
        return None
    configured = result.stdout.decode(errors="surrogateescape").strip() if result.returncode == 0 else ""
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(paths.home() / ".config")
    candidate = configured or os.path.join(xdg, "git", "ignore")
    return candidate if os.path.isfile(candidate) else None


def _copy_exclude(repo: Repo, shadow: Path) -> None:
    """The repository's info/exclude (read as a capped, regular, unfollowed file) into the shadow."""
    data = _read_regular(repo.common_dir / "info" / "exclude", MAX_EXCLUDE) or b""
    _put_if_changed(shadow / "info" / "exclude", data)


def _check_objects(repo: Repo) -> None:
    """Objects are written into the repository: its objects folder must be a real folder inside the common
    dir, with no fan-out folder (objects/xx) that is a symlink leading the writes elsewhere."""
    objects = repo.common_dir / "objects"
    shown = visible(str(objects))
    try:
        st = os.lstat(objects)
    except OSError as exc:
        raise GitError(f"{shown} cannot be read ({exc.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise GitError(f"{shown} is not a folder (a symbolic link?); agentbox does not write objects through it",
                       hint="The agent may have replaced it. Check the repository before trusting it.")
    with os.scandir(objects) as entries:
        for entry in entries:
            if len(entry.name) == 2 and entry.is_symlink():
                raise GitError(f"{visible(entry.path)} is a symbolic link; agentbox does not write objects through it",
                               hint="The agent may have planted it. Remove it, then check the repository.")


# -- running git ------------------------------------------------------------------------------------


def _real_head(repo: Repo) -> tuple[str, str | None]:
    """The object format and HEAD's commit id (None when unborn), read from the real repository."""
    out = _real_git(repo, ["rev-parse", "--show-object-format", "-q", "--verify", "HEAD"], ok=(0, 1))
    lines = out.decode().split()
    if not lines:
        raise GitError(f"git could not read the object format of {visible(str(repo.git_dir))}")
    return lines[0], (lines[1] if len(lines) > 1 else None)


def _real_git(repo: Repo, args: list[str], input: bytes | None = None, ok: Sequence[int] = (0,)) -> bytes:
    """git in the real repository (refs, HEAD, its config): no work tree, no object reads."""
    env = _base_env(shadow_dir(repo))
    env["GIT_DIR"] = str(repo.git_dir)
    return _checked(repo, args, env, repo.git_dir, input, ok, f"git {args[0]}")


def _shadow_git(repo: Repo, args: list[str], input: bytes | None = None, ok: Sequence[int] = (0,),
                what: str | None = None, literal: bool = True) -> bytes:
    """git on the workspace through the shadow folder: its config, index and HEAD; the repository's objects."""
    shadow = shadow_dir(repo)
    if not (shadow / "config").exists():
        _create_shadow(repo)
    env = _base_env(shadow)
    env.update(GIT_DIR=str(shadow), GIT_WORK_TREE=str(repo.work_tree), GIT_INDEX_FILE=str(shadow / "index"),
               GIT_OBJECT_DIRECTORY=str(repo.common_dir / "objects"), **IDENTITY)
    if literal:  # paths are names, never patterns (check-ignore takes names and refuses the setting)
        env["GIT_LITERAL_PATHSPECS"] = "1"
    return _checked(repo, args, env, repo.work_tree, input, ok, what or f"git {args[0]}")


_limits = threading.local()


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Every git call of this thread inside the block ends within seconds in all (a launch must not wait
    on a FIFO the agent planted where git reads: git opens .gitignore, .gitattributes and everything in
    .git without checking, and blocks there until a writer appears)."""
    import time

    previous = getattr(_limits, "deadline", None)
    _limits.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _limits.deadline = previous


def _timeout() -> float:
    import time

    deadline = getattr(_limits, "deadline", None)
    return TIMEOUT if deadline is None else max(0.1, min(TIMEOUT, deadline - time.monotonic()))


def _checked(repo: Repo, args: list[str], env: dict[str, str], cwd: Path, input: bytes | None,
             ok: Sequence[int], what: str) -> bytes:
    try:
        result = _run(args, env, cwd, input)
    except _TimedOut as timed_out:
        raise _timeout_error(repo, what, timed_out.seconds) from None
    if result.returncode not in ok:
        message = visible(result.stderr.decode(errors="replace").strip()[-MAX_MESSAGE:])
        raise GitError(f"{what} failed in {visible(str(repo.work_tree))} (exit {result.returncode}): {message}")
    return result.stdout


def _timeout_error(repo: Repo, what: str, seconds: float) -> GitTimeout:
    """What to say when git did not finish: the FIFOs it may be waiting on, if any (remembered, so the next
    snapshot fails at once instead of waiting again)."""
    fifos = _find_fifos(repo)
    _remember_fifos(repo, fifos)
    message = f"{what} did not finish within {seconds:.0f} seconds in {visible(str(repo.work_tree))}"
    if fifos:
        shown = ", ".join(visible(str(path)) for path in fifos[:10])
        return GitTimeout(f"{message}; these FIFOs are where git waits for a writer that never comes: {shown}",
                          hint="Remove them (something in the VM may have made them).")
    return GitTimeout(message, hint="A very large repository can be this slow the first time: `agentbox checkpoint` "
                                    f"waits longer ({TIMEOUT} s a step) and makes the next ones fast. Otherwise "
                                    "something keeps git waiting.")


def _run(args: list[str], env: dict[str, str], cwd: Path,
         input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git", path=os.environ.get("PATH", os.defpath))
    if git is None:
        raise GitMissing("git is not installed on this computer (not found on PATH)",
                         hint="Install git to use checkpoints and `agentbox diff`.")
    timeout = _timeout()
    try:
        return subprocess.run([git, *_SAFE, *args], env=env, cwd=cwd, input=input if input is not None else b"",
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise _TimedOut(timeout) from None
    except OSError as exc:
        raise GitError(f"git could not be run: {exc.strerror}") from None


def _base_env(home: Path) -> dict[str, str]:
    """git's whole environment: nothing of the user's but PATH (and TMPDIR), so no GIT_* variable leaks in."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "LC_ALL": "C",
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_NO_LAZY_FETCH": "1",
        "GIT_PAGER": "cat",
        "PAGER": "cat",
    }
    if os.environ.get("TMPDIR"):
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


# -- FIFOs ------------------------------------------------------------------------------------------


def _find_fifos(repo: Repo) -> list[Path]:
    """The FIFOs git opens without looking (after a call timed out; at most MAX_SCANNED entries looked at):
    .gitignore and .gitattributes files of the work tree, and anything in the git folders."""
    found: list[Path] = []
    seen = 0
    roots = dict.fromkeys([repo.work_tree, repo.git_dir, repo.common_dir])
    stack = list(roots)
    while stack and seen < MAX_SCANNED:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if Path(entry.path) not in roots:
                        stack.append(Path(entry.path))
                elif stat.S_ISFIFO(entry.stat(follow_symlinks=False).st_mode) and (
                        entry.name in _READ_BY_NAME or _inside_git_folder(repo, Path(entry.path))):
                    found.append(Path(entry.path))
            except OSError:
                continue
    return sorted(found)


_READ_BY_NAME = (".gitignore", ".gitattributes")


def _inside_git_folder(repo: Repo, path: Path) -> bool:
    return any(folder in path.parents for folder in (repo.git_dir, repo.common_dir))


def _remember_fifos(repo: Repo, fifos: list[Path]) -> None:
    shadow = shadow_dir(repo)
    if shadow.is_dir():
        _put_if_changed(shadow / "fifos", b"".join(os.fsencode(path) + b"\0" for path in fifos))


def _refuse_known_fifos(repo: Repo, shadow: Path) -> None:
    """Fail at once, not after a timeout, while a FIFO that stopped git before is still there."""
    try:
        known = [Path(os.fsdecode(name)) for name in (shadow / "fifos").read_bytes().split(b"\0") if name]
    except OSError:
        return
    still = [path for path in known if _is_fifo(path)]
    if still:
        raise GitError(f"git would wait forever on these FIFOs: {', '.join(visible(str(path)) for path in still[:10])}",
                       hint="Remove them (something in the VM may have made them).")
    (shadow / "fifos").unlink(missing_ok=True)


def _is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.lstat(path).st_mode)
    except OSError:
        return False


# -- small helpers ----------------------------------------------------------------------------------


def _put(path: Path, data: bytes) -> None:
    """Replace a file of the shadow folder in one step (0600). No fsync: these files are a cache agentbox
    rebuilds (a damaged index is copied again from the user's), and a launch should not wait on the disk."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _put_if_changed(path: Path, data: bytes) -> None:
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    _put(path, data)



def _pathspec(paths: list[str] | None) -> list[str]:
    return ["--", *paths] if paths else []


def _check_ref(ref: str) -> None:
    if not ref.startswith("refs/") or any(ch.isspace() or ord(ch) < 0x20 for ch in ref) or ".." in ref:
        raise ValueError(f"not a ref agentbox writes: {ref!r}")


def _check_oid(oid: str) -> None:
    if len(oid) not in (40, 64) or any(ch not in "0123456789abcdef" for ch in oid):
        raise ValueError(f"not an object id: {oid!r}")


def _object_id(kind: bytes, content: bytes, length: int) -> str:
    digest = hashlib.sha1 if length == 40 else hashlib.sha256
    return digest(kind + b" " + str(len(content)).encode() + b"\0" + content).hexdigest()


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _signature(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read_regular(path: Path, limit: int) -> bytes | None:
    """A file of the repository's git folder (agent-writable): regular, unfollowed, non-blocking, capped.
    None when absent or not such a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            return None
        raise GitError(f"{visible(str(path))} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise GitError(f"{visible(str(path))} is larger than {limit:,} bytes; agentbox does not read it")
    return data
