"""Checkpoints of a git workspace: what it held when a session started and ended, or when asked.

A checkpoint is a commit of the whole working tree (tracked files as they are on disk and untracked
files that are not ignored; agentbox.git.snapshot reads them itself) in agentbox's own store,
`<workspace state dir>/store/` (agentbox.git.store), kept alive by a ref there,
`refs/agentbox/checkpoints/<id>`. Nothing is written into the workspace's `.git`, and no object of
the workspace's can stand in for one of the store's.

The record agentbox keeps, `<workspace state dir>/checkpoints.json` (0600, written atomically under
`checkpoints.lock`), holds a counter and one entry per checkpoint (id, commit, tree, head, time in UTC,
kind, agent, session, message, skipped files, ref, and `uses`: later sessions or commands whose
checkpoint found the very same tree and HEAD, so they share this entry instead of adding one).
Using a checkpoint checks that its ref still names the recorded commit and that this commit (its
content hashed again) still holds the recorded tree; otherwise it fails loudly, naming the checkpoint
and what happened to it, never falling back to something else.

Ids are small integers per workspace (`#12`). Kinds: start and end (of a session), manual
(`agentbox checkpoint`), undo and apply (taken before those change the workspace), task (when a
background task is handed to the VM; its session is `task-ID`). A session has an
id (`s-20250102T030405Z-1a2b`) shared by its start and end checkpoints. Only the last
`checkpoints.keep` checkpoints are kept: older refs are deleted and their records dropped; a
checkpoint of an unchanged workspace adds no entry, so ordinary launches do not push history out.

Records of version 1 named commits in the workspace's own repository (refs/agentbox/checkpoints
there): they are moved into the store once (agentbox.review.migrate), said in one line.

A live session's end checkpoint is taken after its launch returned, by a process of its own
(agentbox.session.endcheckpoint) that holds `checkpoints-end.lock` meanwhile: take() and load() (so every
command that reads checkpoints, and the next launch's start checkpoint) wait for it first (settle()), with a
note when they do, then say what it had to say (`checkpoints-end.notes`: files it left out, its failure).

API for the commands: take(), current(), load(), lookup() (verified), last_session(), statuses().
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import paths
from agentbox.config.checkpointkeys import CheckpointSettings
from agentbox.errors import StateError
from agentbox.fsutil import atomic_write, locked, private_dir
from agentbox.git import dirs, snapshot, store
from agentbox.progress import emit, note
from agentbox.safetext import visible

KINDS = ("start", "end", "manual", "undo", "apply", "task")
VERSION = 2
REF_PREFIX = "refs/agentbox/checkpoints"


class NotARepository(StateError):
    """The workspace is not a git work tree: checkpoints are off."""


class Checkpoint(NamedTuple):
    id: int
    commit: str
    tree: str
    head: str | None  # HEAD when it was taken (its parent); None before the first commit
    time: str  # ISO-8601, UTC
    kind: str
    agent: str | None
    session: str | None
    message: str
    skipped: list[tuple[str, int]]  # files larger than checkpoints.maxFileSize, not captured
    ref: str
    uses: tuple[tuple[str | None, ...], ...] = ()  # (kind, session, agent, time) of later checkpoints of the same tree

    @property
    def label(self) -> str:
        return f"#{self.id}"

    def to_json(self) -> dict[str, Any]:
        data = self._asdict()
        data["skipped"] = [list(item) for item in self.skipped]
        if self.uses:
            data["uses"] = [list(use) for use in self.uses]
        else:
            del data["uses"]
        return data

    def used_as(self) -> list[tuple[str, str | None, str]]:
        """(kind, session, time) of every checkpoint this entry stands for, its own first."""
        return [(self.kind, self.session, self.time),
                *((str(use[0]), use[1], str(use[3])) for use in self.uses)]


class Taken(NamedTuple):
    checkpoint: Checkpoint
    notes: list[str]  # what the snapshot could not capture, besides skipped files


END_LOCK = "checkpoints-end.lock"
END_NOTES = "checkpoints-end.notes"
WAITING = "waiting for the last session's end checkpoint (agentbox records it after the session)"
_holding_end = False  # this process is the end checkpoint's (agentbox.session.endcheckpoint): it holds the lock
_waited: set[str] = set()  # workspaces this process said it waited for (once each)


def end_lock(workspace: Path) -> Path:
    return paths.workspace_state_dir(Path(os.path.realpath(workspace))) / END_LOCK


def end_notes(workspace: Path) -> Path:
    return paths.workspace_state_dir(Path(os.path.realpath(workspace))) / END_NOTES


def hold_end() -> None:
    """This process takes a session's end checkpoint, under the end lock it inherited: it never waits for it."""
    global _holding_end
    _holding_end = True


def settle(workspace: Path) -> None:
    """Wait while a session's end checkpoint is still being taken (a note says so, once), then say what it had to
    say, once (the first command to read checkpoints after it)."""
    if _holding_end:
        return

    try:
        fd = os.open(end_lock(workspace), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no session's end checkpoint was ever handed on
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            key = os.path.realpath(workspace)
            if key not in _waited:
                _waited.add(key)

                note(WAITING)
            fcntl.flock(fd, fcntl.LOCK_SH)
        notes = end_notes(workspace)
        claimed = notes.with_name(f"{notes.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            os.rename(notes, claimed)  # one reader says them, even when several read at once
        except OSError:
            return
        try:
            text = claimed.read_text(errors="replace")  # agentbox's own words, escaped when it wrote them
        finally:
            claimed.unlink(missing_ok=True)
        if text:

            for line in text.splitlines():
                emit(line)
            sys.stderr.flush()
    finally:
        os.close(fd)


def records_file(workspace: Path) -> Path:
    return paths.workspace_state_dir(Path(os.path.realpath(workspace))) / "checkpoints.json"


def repo_of(workspace: Path) -> store.Repo:
    """The workspace's repository, or NotARepository (checkpoints are off)."""
    repo = store.find(workspace)
    if repo is None:

        refused = dirs.locate(workspace).problem
        if refused:
            raise NotARepository(
                f"checkpoints are off: the .git of {visible(str(workspace))} is not followed: {refused}",
                hint="agentbox follows a .git file only to what `git worktree add` made.")
        raise NotARepository(f"checkpoints are off: {visible(str(workspace))} is not a git repository",
                             hint="Checkpoints and `agentbox diff` work in the top folder of a git work tree "
                                  "(`git init` makes one).")
    return repo


def new_session() -> str:
    return time.strftime("s-%Y%m%dT%H%M%SZ-", time.gmtime()) + secrets.token_hex(2)


def take(workspace: Path, kind: str, settings: CheckpointSettings, *, agent: str | None = None,
         session: str | None = None, message: str = "", protect: frozenset[int] = frozenset()) -> Taken:
    """Record a checkpoint of the workspace as it is now; prune the oldest beyond settings.keep, never one
    whose id is in `protect` (the checkpoint an undo is about to use)."""
    if kind not in KINDS:
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    repo = repo_of(workspace)
    settle(workspace)
    snap = snapshot.take(repo, settings.max_file_size)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with _locked(workspace):
        data = _read(workspace, repo)
        found = _parse_all(data, workspace)
        last = found[-1] if found else None
        if last is not None and last.tree == snap.tree and last.head == snap.head and not last.skipped \
                and not snap.skipped and store.resolve(repo, last.ref) == last.commit:
            # Nothing changed since the last checkpoint: this one is that one (no entry pushes history out).
            same = last._replace(uses=(*last.uses, (kind, session, agent, stamp)))
            _write(workspace, data["next"], [*found[:-1], same])
            return Taken(same, snap.notes)
    details = [f"kind: {kind}", *(f"agent: {agent}",) * bool(agent), *(f"session: {session}",) * bool(session),
               *(f"head: {snap.head}",) * bool(snap.head)]
    subject = f"agentbox checkpoint ({kind}{', ' + agent if agent else ''})"
    text = "\n\n".join(part for part in (subject, message, "\n".join(details)) if part) + "\n"
    commit = store.commit(repo, snap.tree, None, text)
    with _locked(workspace):
        data = _read(workspace, repo)
        number = data["next"]
        checkpoint = Checkpoint(number, commit, snap.tree, snap.head, stamp, kind, agent, session, message,
                                snap.skipped, _ref(number))
        store.set_ref(repo, checkpoint.ref, commit)
        kept = [*_parse_all(data, workspace), checkpoint]
        excess = len(kept) - settings.keep
        prunable = [old for old in kept[:-1] if old.id not in protect]
        dropped = prunable[:max(excess, 0)]
        kept = [old for old in kept if old not in dropped]
        store.delete_refs(repo, [old.ref for old in dropped])
        _write(workspace, number + 1, kept)
    return Taken(checkpoint, snap.notes)


def current(workspace: Path, settings: CheckpointSettings) -> store.Snapshot:
    """The workspace as it is now, as a tree (nothing recorded, no ref written)."""
    return snapshot.take(repo_of(workspace), settings.max_file_size)


def load(workspace: Path) -> list[Checkpoint]:
    """Every recorded checkpoint of the workspace, oldest first (none when there is no record)."""
    repo = store.find(workspace)
    settle(workspace)
    with _locked(workspace):
        return _parse_all(_read(workspace, repo), workspace)


def problem(repo: store.Repo, checkpoint: Checkpoint) -> str | None:
    """What happened to a checkpoint's ref or commit since it was taken, or None when it still verifies."""
    return statuses(repo, [checkpoint])[checkpoint.id]


def statuses(repo: store.Repo, checkpoints: list[Checkpoint]) -> dict[int, str | None]:
    """id -> what is wrong with each checkpoint (None: it verifies), with two git calls for all of them."""
    current_refs = store.refs(repo, REF_PREFIX) if checkpoints else {}
    trees = store.commit_trees(repo, [c.commit for c in checkpoints])
    found: dict[int, str | None] = {}
    for checkpoint in checkpoints:
        target = current_refs.get(checkpoint.ref)
        if target is None:
            found[checkpoint.id] = f"its ref {checkpoint.ref} was deleted"
        elif target != checkpoint.commit:
            found[checkpoint.id] = (f"its ref {checkpoint.ref} was rewritten: it names {target}, "
                                    f"not the recorded {checkpoint.commit}")
        elif trees.get(checkpoint.commit) is None:
            found[checkpoint.id] = f"its commit {checkpoint.commit} is missing or was altered in the repository"
        elif trees[checkpoint.commit] != checkpoint.tree:
            found[checkpoint.id] = f"its commit {checkpoint.commit} no longer holds the recorded tree"
        else:
            found[checkpoint.id] = None
    return found


def require(repo: store.Repo, checkpoint: Checkpoint) -> Checkpoint:
    """checkpoint, when it still verifies; else a loud StateError saying what happened to it."""
    wrong = problem(repo, checkpoint)
    if wrong:
        raise StateError(f"checkpoint {checkpoint.label} ({checkpoint.kind}, {local_time(checkpoint.time)}) cannot be "
                         f"used: {wrong}",
                         hint="Something in the workspace (the agent?) changed agentbox's ref. agentbox will not "
                              "guess what it held; pick another checkpoint from `agentbox checkpoints`.")
    return checkpoint


def lookup(workspace: Path, spec: str) -> Checkpoint:
    """The checkpoint a user named: `12`, `#12`, or `last` (the start of the most recent session); verified."""
    repo = repo_of(workspace)
    found = load(workspace)
    if spec == "last":
        start, _end = last_session(found)
        return require(repo, start)
    number = spec[1:] if spec.startswith("#") else spec
    if not number.isdigit():
        raise StateError(f"{visible(spec)!r} is not a checkpoint",
                         hint="Name one by number (`12` or `#12`), or say `last`; `agentbox checkpoints` lists them.")
    for checkpoint in found:
        if checkpoint.id == int(number):
            return require(repo, checkpoint)
    newest = found[-1].id if found else 0
    if 0 < int(number) < (found[0].id if found else 1):
        raise StateError(f"checkpoint #{int(number)} was pruned (agentbox keeps the last checkpoints.keep)",
                         hint="`agentbox checkpoints` lists those that are left.")
    raise StateError(f"there is no checkpoint #{int(number)} of {visible(str(workspace))}"
                     + (f" (the newest is #{newest})" if newest else " (none has been taken yet)"),
                     hint="`agentbox checkpoints` lists them.")


def lookup_and_current(workspace: Path, spec: str, settings: CheckpointSettings) -> tuple[Checkpoint, store.Snapshot]:
    """lookup(spec) and current(), side by side: the lookup's git calls (its ref and commit checked in the
    store) run while the snapshot's `git diff-files` stats the tree. The lookup's error comes first, as when
    they ran one after the other."""
    found: list[Checkpoint] = []
    failed: list[BaseException] = []

    def look() -> None:
        try:
            found.append(lookup(workspace, spec))
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)

    beside = threading.Thread(target=look, name="checkpoint lookup", daemon=True)
    beside.start()
    try:
        now = current(workspace, settings)
    finally:
        beside.join()
    if failed:
        raise failed[0]
    return found[0], now


def last_session(found: list[Checkpoint]) -> tuple[Checkpoint, Checkpoint | None]:
    """The most recent session's start checkpoint and its end checkpoint (None while it has none)."""
    uses = [(c, kind, session) for c in found for kind, session, _time in c.used_as()]
    starts = [(c, session) for c, kind, session in uses if kind == "start"]
    if not starts:
        raise StateError("no session has been recorded for this workspace yet",
                         hint="Checkpoints are taken when an agent or `agentbox shell` starts and ends; "
                              "`agentbox checkpoint` takes one now.")
    start, started = starts[-1]
    ends = [c for c, kind, session in uses if kind == "end" and session == started]
    return start, (ends[-1] if ends else None)


# -- the record ------------------------------------------------------------------------------------


def _ref(number: int) -> str:
    return f"{REF_PREFIX}/{number}"


@contextmanager
def _locked(workspace: Path) -> Iterator[None]:
    lock = records_file(workspace).with_suffix(".lock")
    private_dir(lock.parent)
    with locked(lock):
        yield


def _read(workspace: Path, repo: store.Repo | None = None) -> dict[str, Any]:
    """The record (held under its lock); one of version 1, whose checkpoints were in the workspace's own
    repository, is moved into the store first."""
    path = records_file(workspace)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {"version": VERSION, "next": 1, "checkpoints": []}
    except (OSError, ValueError) as exc:
        raise _damaged(path, str(exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("next"), int) or not isinstance(
            data.get("checkpoints"), list):
        raise _damaged(path, "it does not have the expected fields")
    if data.get("version") == 1 and repo is not None:
        # deferred: start-up (review.migrate and git.read: only an old checkpoint store is moved)
        from agentbox.review import migrate

        data = migrate.move(repo, data)
        atomic_write(path, json.dumps(data, indent=1) + "\n", mode=0o600)
    if data.get("version") != VERSION:
        raise _damaged(path, f"it is version {data.get('version')!r}; this agentbox reads version {VERSION}")
    checked: dict[str, Any] = data
    return checked


def _parse_all(data: dict[str, Any], workspace: Path) -> list[Checkpoint]:
    try:
        return [Checkpoint(int(e["id"]), str(e["commit"]), str(e["tree"]), e.get("head"), str(e["time"]),
                           str(e["kind"]), e.get("agent"), e.get("session"), str(e.get("message", "")),
                           [(str(p), int(s)) for p, s in e.get("skipped", [])], str(e["ref"]),
                           tuple(tuple(use) for use in e.get("uses", [])))
                for e in data["checkpoints"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise _damaged(records_file(workspace), f"an entry lacks or mangles {exc}") from None


def _write(workspace: Path, next_id: int, found: list[Checkpoint]) -> None:
    data = {"version": VERSION, "workspace": str(workspace), "next": next_id,
            "checkpoints": [c.to_json() for c in found]}
    atomic_write(records_file(workspace), json.dumps(data, indent=1) + "\n", mode=0o600)


def _damaged(path: Path, why: str) -> StateError:
    return StateError(f"agentbox's checkpoint record {path} cannot be read: {why}",
                      hint="Move the file away to start a new record (the old checkpoints' refs stay in "
                           "agentbox's store under refs/agentbox/checkpoints/).")


def local_time(stamp: str) -> str:
    """A recorded UTC time in the user's time zone, to the minute (agentbox.tables' one format)."""
    # deferred: start-up (tables imports click, which the launch never imports)
    from agentbox import tables

    return tables.local_time(stamp)
