"""Isolated mode: the agent works on a copy of the workspace inside the VM and proposes its changes as a patch.

An isolated VM (`session.mode: isolated`, or `--isolated` when the VM is created) mounts the host
workspace read-only (agentbox.vm.workmode) instead of writable at its own path, and a per-VM outbox folder
writable at its own path. At each launch the host records a checkpoint of the workspace (the
base, a tree in agentbox's own store). The VM cannot read the store, so agentbox writes the base into
the session's outbox folder as a `git fast-import` stream, `base.fi`: one commit whose parent is the
workspace's HEAD and whose files are those of the base, each named by its object id where the
workspace's index already has that content (the VM's clone of the read-only mount has it) and sent
inline otherwise. Its author, committer, date and message are fixed, so the commit's id is known to
agentbox before the VM makes it, and the VM checks it. provision/launch.sh makes the copy at the
workspace's own path in the VM, a git clone of the read-only mount with that commit checked out, runs
the agent there and, when it exits, leaves
`changes.patch` (and the agent's `summary.md`) in a session folder of the outbox. The host turns that
into a proposal (agentbox.review.proposals) after `limactl shell` returns: no extra limactl call.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentbox import paths
from agentbox.fsutil import atomic_write, private_dir


def outbox(vm_name: str) -> Path:
    """The host folder an isolated VM writes its sessions' changes to: the VM's outbox (paths.vm_outbox), where
    each session's folder is its random id next to write-back's creds/."""
    return paths.vm_outbox(vm_name)


# -- one isolated session, host side -------------------------------------------------------------
#
# `<workspace state dir>/isolated.json` (0600, under isolated.lock) remembers, per workspace:
#   bases:    commit -> {tree, head, vm, time}: every base agentbox gave a VM (an outbox naming any other
#             base is not believed)
#   current:  vm -> the base commit its copy was last given (sent again while the workspace is unchanged,
#             so the copy, and the agent's work in it, carries over to the next session)
#   fresh:    VMs whose copy must be remade at the next launch (its proposal was rejected or applied)
#   sessions: session id -> {vm, agent, base, started, checkpointSession}: the outbox folders agentbox made
#   nextProposal: the next proposal id (ids are never used twice: events.jsonl names them)

RECORD = "isolated.json"


@contextmanager
def locked_record(workspace: Path) -> Iterator[dict[str, Any]]:
    """isolated.json for reading and changing; written back when the block ends without an error."""
    folder = private_dir(paths.workspace_state_dir(workspace))
    fd = os.open(folder / "isolated.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            record = json.loads((folder / RECORD).read_text())
        except (OSError, ValueError):
            record = {}
        if not isinstance(record, dict):
            record = {}
        for key in ("bases", "current", "sessions"):
            record.setdefault(key, {})
        record.setdefault("fresh", [])
        before = json.dumps(record, sort_keys=True)
        yield record
        if json.dumps(record, sort_keys=True) != before:
            atomic_write(folder / RECORD, json.dumps(record, indent=2), mode=0o600)
    finally:
        os.close(fd)


def base_ref(workspace: Path, vm_name: str) -> str:
    """The ref of agentbox's store that keeps a VM's current base from garbage collection."""
    digest = hashlib.sha256(f"{workspace}\0{vm_name}".encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return f"refs/agentbox/isolated/{digest}"


def mark_fresh(workspace: Path, vm_name: str, base: str) -> None:
    """Remake the VM's copy at its next launch, when it still holds the work of this base (rejected or applied)."""
    with locked_record(workspace) as record:
        if record["current"].get(vm_name) == base and vm_name not in record["fresh"]:
            record["fresh"].append(vm_name)


def now() -> str:
    # deferred: start-up (datetime: tests/test_own_time.py keeps it off the launch)
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
