"""The report a session or a background task leaves when it ends: one record, signed into the host's chain
(agentbox.review.reportchain).

A record says: kind (session, task), agent, VM, workspace, mode (work: live or isolated; network), whether the
session was kept (detached) and its state (ended; "running" for a kept session the launch left running: its
record is written when the launch returns, the end unknown), start and end (ISO 8601 UTC), exit code, the
checkpoints (start and end ids) and the files changed between them (counts and paths, at most MAX_PATHS), the
proposal made (an isolated session's or task's), the network summary of the session's window and the credential
broker's (agentbox.net.sessionlog), the tripwire's findings and the held instruction changes.

A live session's end checkpoint is taken after its launch returned, by a process of its own
(agentbox.session.endcheckpoint): the two meet in `reports/pending/SESSION*`. Whichever comes second (the launch
with the record's draft, that process with the end checkpoint and the files changed) completes the record and
adds it to the chain, so a session's end waits for neither. Writing the record reads the proxy log's tail back to
the session's start and the chain's head only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from agentbox.fsutil import atomic_write, locked, private_dir
from agentbox.git import store
from agentbox.net import sessionlog
from agentbox.progress import warn
from agentbox.review import checkpoints, quarantine, reportchain, tripwire

MAX_PATHS = 50
PENDING = "pending"
DRAFT, END = ".draft.json", ".end.json"
STATUS = {"A": "added", "M": "modified", "T": "modified", "D": "removed"}


class Facts(NamedTuple):
    """What a session or task was, for its report."""

    kind: str  # "session" | "task"
    agent: str | None
    vm: str
    workspace: str
    isolated: bool
    network: str | None  # network.mode, when known
    kept: bool = False
    task: int | None = None


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def iso(moment: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment)) if moment is not None else None


def draft(facts: Facts, started: str, code: int | None, *, running: bool = False,
          held_instructions: Sequence[quarantine.Held] = ()) -> dict[str, Any]:
    """The record without its checkpoints, files, proposal and tripwire (the callers add those they have)."""
    found = sessionlog.entries(facts.vm, started)
    window = sessionlog.window(facts.vm) if facts.kind == "session" else ""
    return {
        "kind": facts.kind, "task": facts.task, "agent": facts.agent, "vm": facts.vm, "workspace": facts.workspace,
        "mode": {"work": "isolated" if facts.isolated else "live", "network": facts.network},
        "kept": facts.kept, "state": "running" if running else "ended",
        "started": started, "ended": None if running else now(), "exitCode": None if running else code,
        "checkpoints": {"start": None, "end": None}, "files": None, "proposal": None,
        "network": sessionlog.network(found, window), "broker": sessionlog.broker(facts.vm, started, found),
        "tripwire": None, "heldInstructions": instructions_part(held_instructions),
    }


def instructions_part(held: Sequence[quarantine.Held]) -> list[dict[str, str]]:
    """The instruction-file changes this session or task left, held (the workspace has the approved version)."""
    return [{"path": item.label, "change": item.kind,
             "held": item.held.describe() if item.held is not None else "absent"} for item in held]


def tripwire_part(changes: Sequence[tripwire.Change], others: int) -> dict[str, Any]:
    return {"changed": [{"path": change.label, "change": change.kind} for change in changes], "unacknowledged": others}


def files_part(changes: Sequence[store.TreeChange]) -> dict[str, Any]:
    counts = {"added": 0, "modified": 0, "removed": 0}
    for change in changes:
        counts[STATUS.get(change.status, "modified")] += 1
    paths = sorted(change.path for change in changes)
    return {**counts, "paths": paths[:MAX_PATHS], "more": max(0, len(paths) - MAX_PATHS)}


def between(workspace: Path, start_tree: str, end_tree: str) -> dict[str, Any] | None:
    """The files changed between two checkpoints' trees (None: they cannot be compared)."""
    try:
        return files_part(store.changes(checkpoints.repo_of(workspace), start_tree, end_tree))
    except Exception:  # a report never stops a session's end: it says what it could not know
        return None


def write(record: dict[str, Any]) -> None:
    """Sign the record into the chain; a failure is a warning (the session's end goes on)."""
    try:
        reportchain.append(record)
    except OSError as exc:
        warn(f"the session's report was not written: {exc}")


def finish_later(record: dict[str, Any], session: str) -> None:
    """The launch's half when the end checkpoint is being taken by its own process: leave the draft, or complete
    the record with what that process left."""
    _meet(session, DRAFT, record)


def end_taken(session: str, end: dict[str, Any]) -> None:
    """The end checkpoint's half: {"end": id or None, "files": files_part or None}."""
    _meet(session, END, end)


def _meet(session: str, mine: str, data: dict[str, Any]) -> None:
    folder = private_dir(reportchain.folder() / PENDING)
    base = folder / session
    other = base.with_name(session + (END if mine == DRAFT else DRAFT))
    with locked(folder / ".lock"):
        try:
            theirs = json.loads(other.read_bytes())
        except FileNotFoundError:
            atomic_write(base.with_name(session + mine), json.dumps(data), mode=0o600)
            return
        except (OSError, ValueError):
            theirs = {}
        record, end = (data, theirs) if mine == DRAFT else (theirs, data)
        if isinstance(record, dict) and record:
            record["checkpoints"]["end"] = end.get("end") if isinstance(end, dict) else None
            record["files"] = end.get("files") if isinstance(end, dict) else None
            write(record)
        os.unlink(other)
