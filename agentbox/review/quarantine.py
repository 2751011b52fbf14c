"""The instruction files' quarantine: what a session writes for the next agent waits for the user.

The files that steer an agent (agentbox.review.instructionfiles: CLAUDE.md, AGENTS.md, .claude/, .mcp.json, ...)
have an approved state per workspace, kept on the host in agentbox's state folder (the agent, root in the VM,
cannot reach it): each path's entry (a file's digest and mode, a link's target, absent) and the approved contents
(content-addressed copies, 0600 in a 0700 folder). The first time agentbox sees a workspace, what is there is
approved (nobody was asked).

- At a session's end every change of a listed path is held: the session's version is copied into the store (a
  link as its target, a FIFO or a file over the size limit as what it is, never opened) and the approved version
  is put back in the workspace (agentbox.review.instructionrestore): the next agent, in the VM or on the host,
  reads what the user approved.
- At a launch's start the paths are compared with the record: one stat signature when nothing changed. A change
  made while nothing of the project ran (the tripwire's rule, tripwire.nothing_else_ran) is the user's edit on the
  host and becomes approved; anything else is held, as at a session's end.
- `agentbox instructions` lists, diffs, approves and rejects held changes (approve writes the held version into the
  workspace and approves it; reject drops it).

Where it can be bypassed: while a session runs its agent sees its own edits; a process it left running in the VM
can write a file again after agentbox put it back and before the next agent reads it (the next session's end holds
that too); folders the walk skips or does not reach (instructionscan.SKIPPED, the bounds) are not searched.

What an approved CLAUDE.md or GEMINI.md imports (`@path`, agentbox.review.instructionimports) is covered too: the
record keeps the imported paths, recomputed whenever an approved version changes. A path that becomes imported
because the user approved a held change is held in turn (a session that adds `@docs/x.md` and writes docs/x.md
does not get docs/x.md in unseen); one imported by the user's own edit, or by a record of an older agentbox, is
approved as it is (nobody else was involved).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from agentbox import paths
from agentbox.fsutil import atomic_write, locked, private_dir
from agentbox.review import instructionrestore
from agentbox.review.instructionscan import ANYWHERE, FILE, Entry, Folder, Scan, scan
from agentbox.review.tripwire import Busy, Change, nothing_else_ran
from agentbox.safetext import visible

if TYPE_CHECKING:
    from agentbox.review import instructionimports

HINT = "`agentbox instructions` to review them"
TREE = "tree.json"  # the folders the last walk for instruction files in any folder went through
BAR = "!" * 78
ADDED, MODIFIED, REMOVED = "added", "modified", "removed"


class Held(NamedTuple):
    """A change waiting for the user: the approved version (None: absent), the one a session left (None: removed)."""

    label: str
    approved: Entry | None
    held: Entry | None
    when: float
    by: str

    @property
    def kind(self) -> str:
        if self.approved is None:
            return ADDED
        return REMOVED if self.held is None else MODIFIED


class Record(NamedTuple):
    workspace: Path
    files: tuple[str, ...]
    approved: dict[str, Entry]
    signature: str
    held: dict[str, Held]
    looked: float | None = None  # when a session's end last compared the files
    live: Mapping[str, int] = MappingProxyType({})  # session -> pid, between its start and end
    kept: Mapping[str, float] = MappingProxyType({})  # VM a kept session went on in -> when
    imported: tuple[str, ...] | None = ()  # what the approved files import (None: not computed yet)
    tree: Mapping[str, Folder] = MappingProxyType({})  # the folders the last walk went through (instructionscan)


class Outcome(NamedTuple):
    """What a start or an end did: the changes held now (`newly` by this check), the paths taken as the user's
    edits, what could not be put back, what the walk passed over."""

    held: list[Held]
    newly: list[Held]
    yours: list[str]
    problems: list[str]
    passed: list[str]


# -- the record -------------------------------------------------------------------------------------


def folder(workspace: Path) -> Path:
    return paths.state_dir() / "instructions" / paths.workspace_key(workspace)


def load(workspace: Path) -> Record | None:
    try:
        data = json.loads((folder(workspace) / "record.json").read_text())
        record = Record(
            Path(data["workspace"]), tuple(data["files"]),
            {label: Entry(*value) for label, value in data["approved"].items()}, str(data["signature"]),
            {label: Held(label, _entry(value["approved"]), _entry(value["held"]), float(value["when"]),
                         str(value["by"])) for label, value in data["held"].items()},
            float(data["looked"]) if data.get("looked") is not None else None,
            {str(key): int(value) for key, value in data.get("live", {}).items()},
            {str(key): float(value) for key, value in data.get("kept", {}).items()},
            tuple(data["imported"]) if "imported" in data else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.workspace == workspace else None


def _with_tree(record: Record) -> Record:
    """The record with the folders the last walk went through (kept apart: a launch's check never reads them)."""
    try:
        data = json.loads((folder(record.workspace) / TREE).read_text())
        tree = {str(label): Folder(int(v[0]), int(v[1]), int(v[2]), tuple(v[3]), tuple(v[4]), bool(v[5]))
                for label, v in data.items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        tree = {}
    return record._replace(tree=tree)


def _save_tree(record: Record, before: Mapping[str, Folder]) -> None:
    if record.tree != before:
        data = {label: list(entry) for label, entry in record.tree.items()}
        atomic_write(private_dir(folder(record.workspace)) / TREE, json.dumps(data), mode=0o600)


def held(workspace: Path) -> list[Held]:
    """The changes held for the workspace, by path (for `agentbox instructions` and the session's report)."""
    record = load(workspace)
    return sorted(record.held.values()) if record is not None else []


def blob(workspace: Path, digest: str) -> bytes | None:
    """A kept copy (approved or held) by its sha256."""
    if not digest or not all(char in "0123456789abcdef" for char in digest):
        return None
    try:
        return (folder(workspace) / "blobs" / digest).read_bytes()
    except OSError:
        return None


def _save(record: Record) -> None:
    data = {
        "workspace": str(record.workspace), "files": list(record.files),
        "approved": {label: list(entry) for label, entry in record.approved.items()},
        "signature": record.signature,
        "held": {label: {"approved": _list(item.approved), "held": _list(item.held), "when": item.when, "by": item.by}
                 for label, item in record.held.items()},
        "looked": record.looked, "live": dict(record.live), "kept": dict(record.kept),
        "imported": list(record.imported or ()),
    }
    atomic_write(private_dir(folder(record.workspace)) / "record.json", json.dumps(data), mode=0o600)


def _keep(workspace: Path, found: Scan, entries: Iterable[Entry | None]) -> None:
    """Copy the contents of `entries` (regular files) into the store."""
    store = folder(workspace) / "blobs"
    for entry in entries:
        if entry is None or entry.kind != FILE or entry.value not in found.data:
            continue
        if not (store / entry.value).exists():
            atomic_write(private_dir(store) / entry.value, found.data[entry.value], mode=0o600)


def _tidy(record: Record) -> None:
    """Copies neither approved nor held go."""
    used = {entry.value for entry in record.approved.values() if entry.kind == FILE}
    used |= {entry.value for item in record.held.values() for entry in (item.approved, item.held)
             if entry is not None and entry.kind == FILE}
    store = folder(record.workspace) / "blobs"
    try:
        names = os.listdir(store)
    except OSError:
        return
    for name in names:
        if name not in used:
            (store / name).unlink(missing_ok=True)


@contextmanager
def _locked(workspace: Path) -> Iterator[None]:
    """Two sessions of one workspace can end at once; each read-modify-write is serialized."""
    with locked(private_dir(folder(workspace)) / "lock"):
        yield


# -- a launch's start and a session's end -----------------------------------------------------------


def begin(workspace: Path, files: tuple[str, ...], busy: Busy | None, session: str | None,
          discover: bool = False) -> Outcome:
    """Before the agent starts: changes since the last check are the user's (nothing else ran) or held, and the
    approved versions are put back. `session` names the launch until end() (None: a look, no launch).

    A launch's check (discover False) is one stat signature of the listed paths and of the instruction files found
    in other folders before; only `discover` (a first look, `agentbox instructions`) and end() walk the workspace's
    folders for new ones."""
    with _locked(workspace):
        record = load(workspace)
        discover = discover or record is None
        if record is not None and discover:
            record = _with_tree(record)
        listed, known = _scope(record, files, discover)
        quick = scan(workspace, listed, contents=False, tree=record.tree if record else None, known=known)
        if record is not None and not discover and record.signature == quick.signature and record.files == files \
                and record.imported is not None:
            outcome = Outcome(sorted(record.held.values()), [], [], [], [])
            after = record
        else:
            found = scan(workspace, listed, tree=quick.tree, known=known)
            if record is None:
                _keep(workspace, found, found.entries.values())
                after = _imports(Record(workspace, files, dict(found.entries), "", {}, imported=None,
                                        tree=found.tree), None)[0]
                outcome = Outcome([], [], [], [], found.passed)
            else:
                asked: list[tuple[bool, dict[str, int], dict[str, float]]] = []

                def quiet() -> bool:
                    asked.append(nothing_else_ran(record.looked, record.live, record.kept, busy))
                    return asked[0][0]

                after, outcome = _compared(_relisted(record, files, found), found, quiet, "a change since the last "
                                           "session's end")
                if asked:  # launches gone and kept sessions ended are forgotten once the rule was asked
                    after = after._replace(live=asked[0][1], kept=asked[0][2])
                if after.imported is None:  # a record of an older agentbox: its imports, as they are
                    after = _imports(after, None)[0]
            after = _signed(after)
            if discover:
                _save_tree(after, record.tree if record is not None else {})
        if session is not None:
            after = after._replace(live={**after.live, session: os.getpid()})
        if after != record:
            _save(after)
    return outcome


def end(workspace: Path, files: tuple[str, ...], session: str | None, by: str,
        kept_in: str | None = None) -> Outcome:
    """After the session: what it changed is held and the approved versions are put back, the workspace's folders
    walked for instruction files anywhere (their listings kept while a folder's stat holds). `by` says which session
    (shown in the list); `kept_in`: the session goes on in that VM (detached)."""
    with _locked(workspace):
        record = load(workspace)
        if record is None:  # begin() makes the record: nothing to compare with
            return Outcome([], [], [], [], [])
        record = _with_tree(record)
        listed, _ = _scope(record, files, True)
        found = scan(workspace, listed, tree=record.tree)
        after, outcome = _compared(_relisted(record, files, found), found, lambda: False, by)
        after = _signed(after)
        _save_tree(after, record.tree)
        live = {key: pid for key, pid in after.live.items() if key != session}
        kept = {**after.kept, **({kept_in: time.time()} if kept_in else {})}
        _save(after._replace(looked=time.time(), live=live, kept=kept))
    return outcome


def _scope(record: Record | None, files: tuple[str, ...], discover: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(what a scan lists, the files found in other folders before, looked at alone). Without `discover`, the list
    without its `**/NAME` entries: no walk of the workspace's folders."""
    imported = (record.imported or ()) if record is not None else ()
    if discover or record is None:
        return files + imported, ()
    fixed = tuple(entry for entry in files if not entry.startswith(ANYWHERE)) + imported
    direct = _covered(fixed)
    return fixed, tuple(sorted(label for label in {*record.approved, *record.held} if not direct(label)))


def _relisted(record: Record, files: tuple[str, ...], found: Scan) -> Record:
    """A longer list (an agent a config defines, a newer agentbox): the newly listed paths are approved as they
    are, nobody was asked about them."""
    record = record._replace(tree=found.tree)
    if record.files == files:
        return record
    before, now = _covered(_listed(record)), _covered(files + (record.imported or ()))
    fresh = {label: entry for label, entry in found.entries.items() if not before(label)}
    _keep(record.workspace, found, fresh.values())
    approved = {label: entry for label, entry in record.approved.items() if now(label) and before(label)}
    return record._replace(files=files, approved={**approved, **fresh},
                           held={label: item for label, item in record.held.items() if now(label)})


def _covered(files: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a label is one of `files`, lies in one of their folders, or is a folder on the way to one."""
    anywhere = {entry[len(ANYWHERE):].casefold() for entry in files if entry.startswith(ANYWHERE)}

    def covers(label: str) -> bool:
        return label.rpartition("/")[2].casefold() in anywhere or any(
            label == entry.rstrip("/") or (entry.endswith("/") and label.startswith(entry))
            or entry.startswith(label + "/") for entry in files)

    return covers


def _listed(record: Record) -> tuple[str, ...]:
    """What the scan covers: the list, and what the approved files import."""
    return record.files + (record.imported or ())


def _signed(record: Record) -> Record:
    """The record with the signature a launch's check compares: the workspace's as it is now (after a put-back, a
    newly covered path, a walk that found files in other folders)."""
    listed, known = _scope(record, record.files, False)
    return record._replace(signature=scan(record.workspace, listed, contents=False, known=known).signature)


def _imports(record: Record, hold_by: str | None) -> tuple[Record, list[Held], list[str]]:
    """What the approved files import, computed again. A path newly imported is held as added and removed from
    the workspace when `hold_by` names why (the user approved the change that imports it: what it imports is
    still unseen), or approved as it is (None: the user's own edit, a first look, an older record)."""
    workspace = record.workspace
    newly: list[Held] = []
    problems: list[str] = []
    imports = _imports_module()
    for _ in range(imports.MAX_HOPS + 1):
        imported = imports.followed(record.approved, imports.importing(),
                                               lambda digest: blob(workspace, digest))
        if imported == record.imported:
            break
        covered = _covered(_listed(record))
        fresh = [label for label in imported if not covered(label)]
        now = _covered(record.files + imported)
        record = record._replace(imported=imported,
                                 approved={label: entry for label, entry in record.approved.items() if now(label)},
                                 held={label: item for label, item in record.held.items() if now(label)})
        found = scan(workspace, fresh)
        _keep(workspace, found, found.entries.values())
        if hold_by is None:
            record = record._replace(approved={**record.approved, **found.entries})
            continue
        items = [Held(label, None, entry, time.time(), hold_by) for label, entry in sorted(found.entries.items())]
        newly += items
        record = record._replace(held={**record.held, **{item.label: item for item in items}})
        problems += _put_back(workspace, [(item.label, None) for item in items])
    return record, newly, problems


def _compared(record: Record, found: Scan, quiet: Callable[[], bool], by: str) -> tuple[Record, Outcome]:
    """The changes between the approved state and `found`: approved (quiet(): nothing else of the project could
    have made them, the user's) or held and put back. quiet() is asked only when something changed."""
    changed = sorted(label for label in set(record.approved) | set(found.entries)
                     if record.approved.get(label) != found.entries.get(label))
    if not changed:
        return record, Outcome(sorted(record.held.values()), [], [], [], found.passed)
    workspace = record.workspace
    _keep(workspace, found, [found.entries.get(label) for label in changed])
    approved = dict(record.approved)
    held_now = dict(record.held)
    if quiet():
        for label in changed:
            approved.pop(label, None)
            if label in found.entries:
                approved[label] = found.entries[label]
        after = _imports(record._replace(approved=approved), None)[0]
        _tidy(after)
        return after, Outcome(sorted(held_now.values()), [], changed, [], found.passed)
    now = time.time()
    newly = [Held(label, approved.get(label), found.entries.get(label), now, by) for label in changed]
    held_now.update({item.label: item for item in newly})
    problems = _put_back(workspace, [(item.label, item.approved) for item in newly])
    return record._replace(held=held_now), Outcome(sorted(held_now.values()), newly, [], problems, found.passed)


def _put_back(workspace: Path, versions: list[tuple[str, Entry | None]]) -> list[str]:
    """Each label made its version: removals first (a link where a folder goes), then the files, outermost first."""
    order = sorted(versions, key=lambda pair: (pair[1] is not None, pair[0].count("/"), pair[0]))
    problems = []
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for label, entry in order:
            problem = instructionrestore.put(fd, label, entry, lambda digest: blob(workspace, digest))
            if problem:
                problems.append(problem)
    finally:
        os.close(fd)
    return problems


# -- the user's word --------------------------------------------------------------------------------


class Decided(NamedTuple):
    done: list[Held]  # what was decided
    problems: list[str]  # what could not be written
    imported: list[Held]  # what an approved version newly imports, held now
    imports: dict[str, instructionimports.Targets]  # an approved file that imports -> what it imports


def decide(workspace: Path, labels: list[str], approve: bool) -> Decided:
    """Approve (the held version goes into the workspace and is approved) or reject (dropped; the workspace keeps
    the approved one) each held label."""
    with _locked(workspace):
        record = load(workspace)
        if record is None:
            return Decided([], [], [], {})
        chosen = [record.held[label] for label in labels if label in record.held]
        versions = [(item.label, item.held if approve else item.approved) for item in chosen]
        problems = _put_back(workspace, versions)
        failed = {label for label, _ in versions if any(problem.startswith(_shown(label)) for problem in problems)}
        approved = dict(record.approved)
        held_now = dict(record.held)
        for item in chosen:
            if item.label in failed:
                continue
            held_now.pop(item.label)
            if approve:
                approved.pop(item.label, None)
                if item.held is not None:
                    approved[item.label] = item.held
        done = [item for item in chosen if item.label not in failed]
        after, imported, more = _imports(record._replace(approved=approved, held=held_now),
                                         f"imported by {names(item.label for item in done)}, approved")
        after = _signed(after)
        _save(after)
        _tidy(after)
        importing = {name.casefold() for name in _imports_module().importing()}
        found = {item.label: _imported_by(workspace, item) for item in done if approve and (
            item.label.rpartition("/")[2].casefold() in importing or item.label in (after.imported or ()))}
    return Decided(done, problems + more, imported, {label: targets for label, targets in found.items()
                                                     if targets.inside or targets.outside})


def _imported_by(workspace: Path, item: Held) -> instructionimports.Targets:
    imports = _imports_module()
    data = blob(workspace, item.held.value) if item.held is not None and item.held.kind == FILE else None
    found: instructionimports.Targets = (
        imports.targets(item.label, data) if data is not None else imports.Targets([], []))
    return found


def _imports_module() -> ModuleType:
    """agentbox.review.instructionimports, loaded when an approved version changed (a quiet launch never needs it)."""
    # deferred: start-up (review.instructionimports: only when what the approved files import is worked out again)
    from agentbox.review import instructionimports

    return instructionimports


# -- printing ---------------------------------------------------------------------------------------


HELD_NOTE = "held: the workspace has the approved version back; `agentbox instructions`"


def noted(found: tuple[list[Change], int], outcome: Outcome) -> tuple[list[Change], int]:
    """The tripwire's findings after a session (tripwire.end_session), each file this check held and put back
    noted so: the warning names it (the host runs it), and says it is the approved version the host will run."""
    put_back = {item.label for item in outcome.newly
                if not any(problem.startswith(_shown(item.label)) for problem in outcome.problems)}
    changes, others = found
    return [change._replace(note=HELD_NOTE) if change.label in put_back else change for change in changes], others


def start(workspace: Path, files: tuple[str, ...], busy: Busy | None, session: str | None,
          discover: bool = False) -> None:
    """begin() and what it says before the agent starts: the user's edits approved, changes held, the reminder."""
    outcome = begin(workspace, files, busy, session, discover)
    report_yours(outcome.yours)
    report(outcome, "something of this project (a task, a kept session or another launch)")
    remind([item for item in outcome.held if item not in outcome.newly])


def remind(found: list[Held], stream: TextIO | None = None) -> None:
    """The compact reminder at a launch, before the agent starts."""
    if found:
        count = f"{len(found)} change{'s' if len(found) != 1 else ''} to instruction files"
        print(f"agentbox: {count} {'is' if len(found) == 1 else 'are'} held, agents see the approved version: "
              f"{names(item.label for item in found)}; run {HINT}", file=stream or sys.stderr, flush=True)


def report_yours(labels: list[str], stream: TextIO | None = None) -> None:
    """One plain line at a launch: instruction files changed while nothing of the project ran, approved."""
    if labels:
        files = f"{len(labels)} instruction file{'s' if len(labels) != 1 else ''}"
        print(f"agentbox: {files} changed while no session or task of this project ran, taken as your own edits "
              f"(approved): {names(labels)}", file=stream or sys.stderr, flush=True)


def report(outcome: Outcome, after: str = "the session", stream: TextIO | None = None) -> None:
    """The loud warning when changes were held (after the session's output), with what could not be put back and
    what the walk passed over."""
    out = stream or sys.stderr
    lines = []
    if outcome.newly:
        count = f"{len(outcome.newly)} instruction file{'s' if len(outcome.newly) != 1 else ''}"
        lines += [BAR, f"agentbox: WARNING: {after} changed {count} that the next agent would obey: "
                  f"{names(item.label for item in outcome.newly)}.",
                  "The changes are held and the workspace keeps the approved version; run "
                  f"{HINT} (`agentbox instructions diff`, `approve`, `reject`)."]
    lines += [f"agentbox: {problem}" for problem in outcome.problems]
    lines += [f"agentbox: instruction folders not looked at: {passed}" for passed in outcome.passed]
    if outcome.newly:
        lines.append(BAR)
    if lines:
        print("\n".join(lines), file=out, flush=True)


def names(labels: Iterable[str], most: int = 10) -> str:
    listed = [_shown(label) for label in labels]
    return ", ".join(listed[:most] + ([f"and {len(listed) - most} more"] if len(listed) > most else []))


def _shown(label: str) -> str:
    return visible(label)


def _entry(value: list[Any] | None) -> Entry | None:
    return Entry(str(value[0]), str(value[1]), int(value[2])) if value is not None else None


def _list(entry: Entry | None) -> list[Any] | None:
    return list(entry) if entry is not None else None
