"""agentbox's own checkpoint store, and the only module that runs git on the host.

Checkpoints live in a bare repository agentbox owns, `<workspace state dir>/store/` (never mounted into a
VM): their commits, trees, blobs and refs. Nothing is ever written under the workspace's git folder, and
git never runs with it as its git folder: the workspace's `.git` is written by the agent, so its config,
hooks, reflogs, objects and refs are attacker input. What agentbox needs from it (HEAD, the index's list
of tracked paths, the object format) it reads itself through agentbox.git.read (no-follow, regular files,
size caps, every object checked against its id).

The store's objects are made by agentbox from bytes it read itself (agentbox.git.snapshot: folder
descriptors, O_NOFOLLOW, the inode that was listed, size caps) and written as loose objects, so no
object of the workspace can stand in for one. git runs only on the store: to diff trees, read objects
back (each checked against its id again), write and delete refs (no reflogs), and apply a patch to an
index of the store (`apply --cached`). The one git call that sees the work tree is `git diff-files`,
which only lstat()s the paths agentbox recorded (it opens none: no entry agentbox records is "racily
clean", see agentbox.git.snapshot) to say which files changed since the last checkpoint.

Every call builds git's environment from scratch (no system or global config, no GIT_* variable of the
user's, HOME in the store, no pager) and passes `-c core.hooksPath=/dev/null -c core.fsmonitor=false
-c protocol.allow=never`; each has a time limit (time_limit() lowers it for a launch).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import hosttools, paths
from agentbox.errors import StateError
from agentbox.fsutil import locked, private_dir
from agentbox.git.dirs import locate
from agentbox.safetext import visible

TIMEOUT = 300  # seconds a git call may take (time_limit() lowers it)
MAX_MESSAGE = 2000  # characters of git's stderr shown in an error
IDENTITY = {"GIT_AUTHOR_NAME": "agentbox", "GIT_AUTHOR_EMAIL": "agentbox@localhost",
            "GIT_COMMITTER_NAME": "agentbox", "GIT_COMMITTER_EMAIL": "agentbox@localhost"}
SIGNATURE = b"agentbox <agentbox@localhost>"
_SAFE = ("--no-pager", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
         "-c", "protocol.allow=never")
_DIFF = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-renames")
STORE_LAYOUT = 1


class GitError(StateError):
    """A host git call failed; the message names the command and quotes git (escaped)."""


class GitMissing(GitError):
    """git is not installed on the host."""


class GitTimeout(GitError):
    """A git call did not finish in time (a very slow disk)."""


class Repo(NamedTuple):
    work_tree: Path  # the workspace
    git_dir: Path  # this checkout's git folder (a linked worktree's own): read by agentbox only
    common_dir: Path  # the repository's shared git folder: read by agentbox only


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
    return tool() is not None


def tool() -> str | None:
    """The host's git: found on PATH without empty or relative entries (a workspace's `git` never runs)."""
    return hosttools.which("git")


def find(workspace: Path) -> Repo | None:
    """The workspace as a git work tree (it has its own `.git`), or None. Runs no git."""
    work_tree = Path(os.path.realpath(workspace))
    dirs = locate(work_tree)
    if dirs.git_dir is None or dirs.common_dir is None:
        return None
    return Repo(work_tree, dirs.git_dir, dirs.common_dir)


def store_dir(repo: Repo | Path) -> Path:
    """The workspace's checkpoint store (a bare repository of agentbox's, in its state folder)."""
    work_tree = repo.work_tree if isinstance(repo, Repo) else Path(os.path.realpath(repo))
    return paths.workspace_state_dir(work_tree) / "store"


def head(repo: Repo) -> str | None:
    """HEAD's commit id as the workspace's git folder names it (read by agentbox); None when unborn."""
    # deferred: start-up (git.read: the warm launch reads no repository)
    from agentbox.git import read

    return read.head(repo.git_dir, repo.common_dir)


def object_format(repo: Repo) -> str:
    # deferred: start-up (git.read: the warm launch reads no repository)
    from agentbox.git import read

    return read.object_format(repo.common_dir)


# -- objects ----------------------------------------------------------------------------------------


def object_id(kind: bytes, content: bytes, fmt: str) -> str:
    digest = hashlib.sha1 if fmt == "sha1" else hashlib.sha256
    return digest(kind + b" " + str(len(content)).encode() + b"\0" + content).hexdigest()


def write_object(store: Path, kind: bytes, content: bytes, fmt: str) -> str:
    """A loose object of the store (written once; an object already there is content-addressed, so kept)."""
    oid = object_id(kind, content, fmt)
    folder = store / "objects" / oid[:2]
    target = folder / oid[2:]
    if target.exists():
        return oid
    folder.mkdir(exist_ok=True)
    data = zlib.compress(kind + b" " + str(len(content)).encode() + b"\0" + content, 1)
    tmp = folder / f".tmp-{os.getpid()}-{threading.get_ident()}-{oid[2:12]}"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, target)
    return oid


class ObjectWriter:
    """The store's new objects, written by one `git fast-import` (one pack, not a file per object) that is
    started at the first object the store does not have yet; `finish` makes the snapshot's tree from the
    previous snapshot's commit and the paths that changed, and ends it."""

    SNAPSHOT_REF = "refs/agentbox/snapshot"

    def __init__(self, repo: Repo, store: Path, fmt: str) -> None:
        self.repo = repo
        self.store = store
        self.fmt = fmt
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr: Any = None
        self.sent: set[str] = set()

    def blob(self, data: bytes) -> str:
        oid = object_id(b"blob", data, self.fmt)
        if oid in self.sent or (self.store / "objects" / oid[:2] / oid[2:]).exists():
            return oid
        self._write(b"blob\ndata %d\n" % len(data) + data + b"\n")
        self.sent.add(oid)
        return oid

    def finish(self, parent: str | None, changes: list[tuple[bytes, int | None, str | None]]) -> tuple[str, str]:
        """(commit, tree) of parent's tree with changes applied: (path, mode, oid) written, (path, None, None)
        removed; without a parent, changes must list every entry."""
        header = (b"commit " + self.SNAPSHOT_REF.encode() + b"\ncommitter " + SIGNATURE + b" 0 +0000\ndata 0\n"
                  + (b"from " + parent.encode() + b"\n" if parent else b""))
        lines = [header]
        for path, mode, oid in changes:
            quoted = fast_import_path(path)
            if mode is None:
                lines.append(b"D " + quoted + b"\n")
            else:
                lines.append(b"M %o " % mode + (oid or "").encode() + b" " + quoted + b"\n")
        self._write(b"".join(lines) + b"\ndone\n")
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=remaining())
        except subprocess.TimeoutExpired:
            self.abandon()
            raise GitTimeout(f"git fast-import did not finish for {visible(str(self.repo.work_tree))}") from None
        if self.process.returncode != 0:
            message = visible(self._errors().decode(errors="replace").strip()[-MAX_MESSAGE:])
            raise GitError(f"git fast-import failed for {visible(str(self.repo.work_tree))}: {message}")
        out = _store_git(self.repo, ["rev-parse", self.SNAPSHOT_REF, self.SNAPSHOT_REF + "^{tree}"]).split()
        self._tidy()
        return out[0].decode(), out[1].decode()

    def abandon(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _errors(self) -> bytes:
        self.stderr.seek(0)
        return bytes(self.stderr.read())

    def _write(self, data: bytes) -> None:
        if self.process is None:

            self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (kept across calls: what git says when it fails)
            self.process = _store_popen(self.repo, ["-c", "fastimport.unpackLimit=0", "fast-import", "--quiet",
                                                    "--done", "--force"], self.stderr)
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(data)
        except BrokenPipeError:
            self.process.wait()
            raise GitError(f"git fast-import failed for {visible(str(self.repo.work_tree))}: "
                           f"{visible(self._errors().decode(errors='replace').strip()[-MAX_MESSAGE:])}") from None

    def _tidy(self) -> None:
        """One pack per snapshot that changed something: past PACKS_BEFORE_REPACK, they become one (objects no
        ref reaches, those of no checkpoint and not the last snapshot, go)."""
        packs = list((self.store / "objects" / "pack").glob("*.pack"))
        if len(packs) > PACKS_BEFORE_REPACK:
            _store_git(self.repo, ["repack", "-a", "-d", "-q"])


PACKS_BEFORE_REPACK = 20


def fast_import_path(name: bytes) -> bytes:
    """A path as fast-import reads it: C-style quoted when it starts with a quote or holds a control
    character, a backslash or a byte above 0x7e."""
    if not name.startswith(b'"') and not any(byte < 0x20 or byte in (0x5C, 0x7F) for byte in name):
        return name
    escaped = bytearray(b'"')
    for byte in name:
        if byte in (0x22, 0x5C):
            escaped += b"\\" + bytes([byte])
        elif byte < 0x20 or byte >= 0x7F:
            escaped += b"\\%03o" % byte
        else:
            escaped.append(byte)
    return bytes(escaped + b'"')


def commit_object(tree: str, parent: str | None, message: str, when: int) -> bytes:
    stamp = SIGNATURE + b" " + str(when).encode() + b" +0000"
    lines = [b"tree " + tree.encode(), *((b"parent " + parent.encode(),) if parent else ()),
             b"author " + stamp, b"committer " + stamp]
    return b"\n".join(lines) + b"\n\n" + message.encode()


def commit(repo: Repo, tree: str, parent: str | None, message: str) -> str:
    """A commit object of tree in the store (parent: an earlier commit of the store, or None); no ref."""
    store = init_store(repo)
    return write_object(store, b"commit", commit_object(tree, parent, message, int(time.time())), _format(store))


def set_ref(repo: Repo, ref: str, commit: str) -> None:
    _check_ref(ref)
    _store_git(repo, ["update-ref", "--no-deref", ref, commit])


def delete_refs(repo: Repo, refs: list[str]) -> None:
    """Delete refs from the store (those already gone are fine)."""
    if not refs:
        return
    for ref in refs:
        _check_ref(ref)
    _store_git(repo, ["update-ref", "--stdin"], input="".join(f"delete {ref}\n" for ref in refs).encode())


def resolve(repo: Repo, ref: str) -> str | None:
    """The object a ref of the store names; None when it does not exist."""
    _check_ref(ref)
    loose = _loose_ref(init_store(repo) / ref)
    if loose is not None:
        return loose
    out = _store_git(repo, ["rev-parse", "-q", "--verify", "--end-of-options", ref], ok=(0, 1))
    return out.decode().strip() or None


def _loose_ref(path: Path) -> str | None:
    """The object id a loose ref file of the store holds, read without a git process (an unchanged checkpoint asks
    once per launch); None when it is not plainly one (absent, packed, symbolic): git is asked then."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    oid = data.decode("ascii", "replace").strip()
    return oid if data.endswith(b"\n") and len(oid) in (40, 64) and all(c in "0123456789abcdef" for c in oid) else None


def refs(repo: Repo, prefix: str) -> dict[str, str]:
    """Every ref under prefix in the store, with the object it names (read from the loose ref files, or one
    `for-each-ref` when the store has packed refs or an odd file there)."""
    _check_ref(prefix)
    loose = _loose_refs(init_store(repo), prefix.rstrip("/"))
    if loose is not None:
        return loose
    out = _store_git(repo, ["for-each-ref", "--format=%(refname) %(objectname)", prefix])
    found = {}
    for line in out.decode(errors="replace").splitlines():
        name, _, oid = line.rpartition(" ")
        found[name] = oid
    return found


def commit_trees(repo: Repo, commits: list[str]) -> dict[str, str | None]:
    """The tree each commit of the store holds (None when missing, not a commit, or not what its id says)."""
    wanted = list(dict.fromkeys(commits))
    for oid in wanted:
        _check_oid(oid)
    store = init_store(repo)
    objects = {oid: loose for oid in wanted if (loose := _loose_object(store, oid)) is not None}
    objects.update(_batch(repo, [oid for oid in wanted if oid not in objects]))
    found: dict[str, str | None] = {}
    for oid in wanted:
        kind, content = objects.get(oid, (b"", b""))
        tree = None
        if kind == b"commit" and content.startswith(b"tree ") and _verified(b"commit", content, oid):
            tree = content[5:content.index(b"\n")].decode()
        found[oid] = tree
    return found


def tree_of(repo: Repo, commit: str) -> str | None:
    """The tree a commit of the store holds; None when the object is missing or not a commit."""
    return commit_trees(repo, [commit])[commit]


def change_counts(repo: Repo, pairs: list[tuple[str, str]]) -> list[dict[str, int]]:
    """For each (old tree, new tree): how many files were added, modified, deleted ("A", "M", "D", "T")."""
    if not pairs:
        return []
    out = _store_git(repo, ["diff-tree", "--stdin", "-r", "--raw", *_DIFF],
                     input="".join(f"{old} {new}\n" for old, new in pairs).encode())
    counts: list[dict[str, int]] = []
    for line in out.split(b"\n"):
        if line.startswith(b":") and counts:
            status = line.split(b"\t", 1)[0].rsplit(b" ", 1)[-1][:1].decode()
            counts[-1][status] = counts[-1].get(status, 0) + 1
        elif line:
            counts.append({})
    return counts


def changes(repo: Repo, old_tree: str, new_tree: str, paths: list[str] | None = None) -> list[TreeChange]:
    """What differs between two trees of the store, file by file (no rename detection)."""
    out = _store_git(repo, ["diff-tree", "-r", "-z", "--raw", *_DIFF, old_tree, new_tree, *_pathspec(paths)])
    fields = out.split(b"\0")
    found = []
    for index in range(0, len(fields) - 1, 2):
        meta, name = fields[index], fields[index + 1]
        old_mode, new_mode, old_oid, new_oid, status = meta.lstrip(b":").decode().split(" ")
        found.append(TreeChange(status[0], os.fsdecode(name), old_mode, new_mode, old_oid, new_oid))
    return found


def diff(repo: Repo, old_tree: str, new_tree: str, *, stat: bool = False, name_only: bool = False,
         binary: bool = False, paths: list[str] | None = None) -> bytes:
    """`git diff-tree` between two trees of the store: a patch (binary: one `git apply` reads back), --stat or
    --name-only."""
    if name_only:
        shape = ["--name-only"]
    elif stat:
        shape = ["--stat"]
    else:
        shape = ["-p", *(("--binary", "--full-index") if binary else ())]
    return _store_git(repo, ["diff-tree", "-r", *shape, *_DIFF, old_tree, new_tree, *_pathspec(paths)])


def tree_entries(repo: Repo, tree: str) -> list[tuple[str, str, bytes]]:
    """(mode, oid, path) of every file, link and submodule a tree of the store holds (one `ls-tree -r`)."""
    out = _store_git(repo, ["ls-tree", "-r", "-z", "--full-tree", tree])
    found = []
    for entry in out.split(b"\0"):
        if entry:
            meta, _, name = entry.partition(b"\t")
            mode, _kind, oid = meta.decode().split(" ")
            found.append((mode, oid, name))
    return found


def read_blobs(repo: Repo, oids: list[str]) -> dict[str, bytes]:
    """Blob contents of the store by id (one `cat-file --batch`), each checked against its id."""
    wanted = list(dict.fromkeys(oids))
    if not wanted:
        return {}
    for oid in wanted:
        _check_oid(oid)
    objects = _batch(repo, wanted)
    blobs: dict[str, bytes] = {}
    shown = visible(str(store_dir(repo)))
    for oid in wanted:
        kind, content = objects.get(oid, (b"", b""))
        if kind != b"blob":
            raise GitError(f"the object {oid} is missing from agentbox's checkpoint store {shown} "
                           f"(or is not a file's content)",
                           hint="Something deleted it; this checkpoint cannot be restored.")
        if not _verified(b"blob", content, oid):
            raise GitError(f"the object {oid} in {shown} does not hold what its id says: it was altered after it "
                           f"was written", hint="Do not trust this checkpoint's content.")
        blobs[oid] = content
    return blobs


def apply_to_tree(repo: Repo, tree: str, patch: bytes, *, three_way: bool) -> str:
    """The tree patch makes of tree, computed in the store alone (`git apply --cached` on a scratch index
    read from tree; with three_way, git's three-way merge, which refuses rather than leave conflicts).
    Raises GitError with git's message when the patch does not apply."""
    store = init_store(repo)
    with tempfile.TemporaryDirectory(dir=store, prefix="apply-") as scratch:
        index = str(Path(scratch) / "index")
        _store_git(repo, ["read-tree", tree], index=index)
        _store_git(repo, ["apply", "--whitespace=nowarn", "--cached", *(("--3way",) if three_way else ()), "-"],
                   input=patch, index=index, what="git apply" + (" --3way" if three_way else ""))
        return _store_git(repo, ["write-tree"], index=index).decode().strip()


def chain_commit(repo: Repo, tree: str, parent: str | None, message: str) -> str:
    """A commit of tree on parent in the store, its time fixed: the same tree on the same parent is the same
    commit (an isolated task's base, agentbox.tasks.bundles)."""
    store = init_store(repo)
    return write_object(store, b"commit", commit_object(tree, parent, message, 0), _format(store))


def bundle(repo: Repo, path: Path, ref: str, commit: str, prerequisite: str | None = None) -> None:
    """`git bundle create PATH REF [^PREREQUISITE]` of the store, REF set to commit first: the commit and what it
    holds, less what prerequisite (an ancestor the reader has already) holds. path: a new file agentbox owns."""
    set_ref(repo, ref, commit)
    if prerequisite is not None:
        _check_oid(prerequisite)
    _store_git(repo, ["bundle", "create", "-q", str(path), ref, *((f"^{prerequisite}",) if prerequisite else ())],
               what="git bundle create")


def _loose_refs(store: Path, prefix: str) -> dict[str, str] | None:
    """The refs under prefix as loose files of the store (agentbox writes each checkpoint's ref so, with
    update-ref); None when git must say: packed refs, or a file that is not plainly an object id."""
    if (store / "packed-refs").exists():
        return None
    found: dict[str, str] = {}
    for folder, dirs, names in os.walk(store / prefix):
        dirs.sort()
        for name in names:
            path = Path(folder) / name
            oid = _loose_ref(path)
            if oid is None:
                return None
            found[path.relative_to(store).as_posix()] = oid
    return found


def _loose_object(store: Path, oid: str) -> tuple[bytes, bytes] | None:
    """(type, content) of a loose object of the store (checkpoint commits are written so: write_object), read
    without a git process; None when it is not there loose (or not whole): `cat-file` is asked then."""
    try:
        data = zlib.decompress((store / "objects" / oid[:2] / oid[2:]).read_bytes())
    except (OSError, zlib.error):
        return None
    header, nul, content = data.partition(b"\0")
    kind, _, size = header.partition(b" ")
    return (kind, content) if nul and size == str(len(content)).encode() else None


def _batch(repo: Repo, oids: list[str]) -> dict[str, tuple[bytes, bytes]]:
    """oid -> (type, content) of the store's objects that exist, read by one `cat-file --batch`."""
    if not oids:
        return {}
    out = _store_git(repo, ["cat-file", "--batch"], input="".join(f"{oid}\n" for oid in oids).encode())
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


def _verified(kind: bytes, content: bytes, oid: str) -> bool:
    return object_id(kind, content, "sha1" if len(oid) == 40 else "sha256") == oid


# -- the store --------------------------------------------------------------------------------------


@contextmanager
def store_locked(repo: Repo) -> Iterator[Path]:
    """The store, set up, held by this process alone (two launches of one workspace snapshot in turn)."""
    store = init_store(repo)
    with locked(store / "agentbox.lock"):
        yield store


def init_store(repo: Repo) -> Path:
    """The store's folder, made a bare repository of the workspace's object format the first time."""
    store = store_dir(repo)
    if (store / "agentbox-layout").exists():
        return store
    try:
        return _make_store(repo, store)
    except OSError as exc:
        raise GitError(f"agentbox's checkpoint store {visible(str(store))} cannot be set up ({exc.strerror})",
                       hint="Check that agentbox's state folder is writable, or move what is in the way.") from None


def _make_store(repo: Repo, store: Path) -> Path:
    fmt = object_format(repo)
    private_dir(store.parent)
    private_dir(store)
    for folder in ("objects", "refs", "refs/heads", "refs/tags", "info"):
        (store / folder).mkdir(exist_ok=True)
    (store / "HEAD").write_bytes(b"ref: refs/heads/none\n")
    lines = ["[core]", f"\trepositoryformatversion = {0 if fmt == 'sha1' else 1}", "\tbare = true",
             "\tlogAllRefUpdates = false", "\tfilemode = true", "\tsymlinks = true", "\tcheckStat = default",
             "\ttrustctime = true", "\tpreloadIndex = true", "[gc]", "\tauto = 0", "\treflogExpire = now",
             "[safe]", "\tdirectory = *"]
    if fmt != "sha1":
        lines += ["[extensions]", f"\tobjectFormat = {fmt}"]
    (store / "config").write_text("\n".join(lines) + "\n")
    (store / "agentbox-layout").write_text(f"{STORE_LAYOUT} {fmt}\n")
    return store


def _format(store: Path) -> str:
    try:
        return (store / "agentbox-layout").read_text().split()[1]
    except (OSError, IndexError):
        return "sha1"


def store_format(repo: Repo) -> str:
    return _format(init_store(repo))


# -- running git ------------------------------------------------------------------------------------


def require_git() -> str:
    """The host's git, or GitMissing."""
    git = tool()
    if git is None:
        raise GitMissing("git is not installed on this computer (not found on PATH)",
                         hint="Install git to use checkpoints and `agentbox diff`.")
    return git


def _store_env(repo: Repo, **extra: str) -> tuple[Path, dict[str, str]]:
    """The store and git's whole environment for a call on it (see _base_env)."""
    store = init_store(repo)
    env = _base_env(store)
    env.update(GIT_DIR=str(store), GIT_CONFIG_GLOBAL=str(store / "config"), GIT_LITERAL_PATHSPECS="1", **IDENTITY,
               **extra)
    return store, env


def _store_popen(repo: Repo, args: list[str], stderr: Any) -> subprocess.Popen[bytes]:
    git = require_git()
    store, env = _store_env(repo)
    return subprocess.Popen([git, *_SAFE, *args], env=env, cwd=store, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=stderr)


class Pending(NamedTuple):
    """A git call running while agentbox does something else; result() waits for it."""

    repo: Repo
    process: subprocess.Popen[bytes]
    what: str

    def result(self) -> bytes:
        try:
            out, error = self.process.communicate(timeout=remaining())
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise GitTimeout(f"{self.what} did not finish for {visible(str(self.repo.work_tree))}") from None
        if self.process.returncode != 0:
            message = visible(error.decode(errors="replace").strip()[-MAX_MESSAGE:])
            raise GitError(f"{self.what} failed for {visible(str(self.repo.work_tree))} "
                           f"(exit {self.process.returncode}): {message}")
        return out


def start_diff_files(repo: Repo, index: Path) -> Pending:
    """`git diff-files` on the store's stat index (it only lstat()s the recorded paths, opening none), started
    now; its answer is read later."""
    git = require_git()
    _, env = _store_env(repo, GIT_INDEX_FILE=str(index), GIT_WORK_TREE=str(repo.work_tree))
    process = subprocess.Popen([git, *_SAFE, "diff-files", "--name-only", "-z", "--ignore-submodules=all"], env=env,
                               cwd=repo.work_tree, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    return Pending(repo, process, "git diff-files")


def _store_git(repo: Repo, args: list[str], input: bytes | None = None, ok: Sequence[int] = (0,),
               index: str | None = None, work_tree: Path | None = None, what: str | None = None) -> bytes:
    """git on agentbox's own store (never on the workspace's git folder)."""
    extra = {"GIT_INDEX_FILE": index} if index is not None else {}
    if work_tree is not None:
        extra["GIT_WORK_TREE"] = str(work_tree)
    store, env = _store_env(repo, **extra)
    return _checked(repo, args, env, work_tree or store, input, ok, what or f"git {args[0]}")


_limits = threading.local()


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Every git call of this thread inside the block ends within seconds in all."""
    previous = getattr(_limits, "deadline", None)
    _limits.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _limits.deadline = previous


def remaining() -> float:
    """Seconds left of this thread's time_limit (TIMEOUT without one)."""
    deadline = getattr(_limits, "deadline", None)
    return TIMEOUT if deadline is None else max(0.1, min(TIMEOUT, deadline - time.monotonic()))


def _checked(repo: Repo, args: list[str], env: dict[str, str], cwd: Path, input: bytes | None,
             ok: Sequence[int], what: str) -> bytes:
    git = require_git()
    seconds = remaining()
    try:
        result = subprocess.run([git, *_SAFE, *args], env=env, cwd=cwd, input=input if input is not None else b"",
                                capture_output=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        raise GitTimeout(f"{what} did not finish within {seconds:.0f} seconds for {visible(str(repo.work_tree))}",
                         hint="A very large workspace can be this slow the first time: `agentbox checkpoint` waits "
                              f"longer ({TIMEOUT} s a step) and makes the next ones fast.") from None
    except OSError as exc:
        raise GitError(f"git could not be run: {exc.strerror}") from None
    if result.returncode not in ok:
        message = visible(result.stderr.decode(errors="replace").strip()[-MAX_MESSAGE:])
        raise GitError(f"{what} failed for {visible(str(repo.work_tree))} (exit {result.returncode}): {message}")
    return result.stdout


def _base_env(home: Path) -> dict[str, str]:
    """git's whole environment: nothing of the user's but PATH (and TMPDIR), so no GIT_* variable leaks in."""
    env = {
        "PATH": _search_path(),
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


def _search_path() -> str:
    return hosttools.search_path()


def _pathspec(paths: list[str] | None) -> list[str]:
    return ["--", *paths] if paths else []


def _check_ref(ref: str) -> None:
    if not ref.startswith("refs/") or any(ch.isspace() or ord(ch) < 0x20 for ch in ref) or ".." in ref:
        raise ValueError(f"not a ref agentbox writes: {ref!r}")


def _check_oid(oid: str) -> None:
    if len(oid) not in (40, 64) or any(ch not in "0123456789abcdef" for ch in oid):
        raise ValueError(f"not an object id: {oid!r}")
