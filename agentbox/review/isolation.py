"""Isolated mode: the agent works on a copy of the workspace inside the VM and proposes its changes as a patch.

An isolated VM (`session.mode: isolated`, or `--isolated` when the VM is created) mounts the host
workspace read-only at GUEST_SOURCE instead of writable at its own path, and a per-VM outbox folder
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

Whether a VM is isolated is fixed when it is created (the mounts are). `mode_of_vm` reads it from what
agentbox rendered for the VM; `session_mode` decides a launch's mode from that and what was asked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import paths
from agentbox.errors import ConfigError, StateError
from agentbox.fsutil import atomic_write, private_dir

if TYPE_CHECKING:
    from agentbox.config.load import Config

LIVE = "live"
ISOLATED = "isolated"
# Where an isolated VM sees the host workspace, read-only. The workspace's own path holds the agent's copy.
GUEST_SOURCE = "/mnt/agentbox/workspace"
NOT_GIT_HINT = (
    "Make it a git repository (`git init`; one without commits works), or use `session.mode: live`."
)


def outbox(vm_name: str) -> Path:
    """The host folder an isolated VM writes its sessions' changes to: the VM's outbox (paths.vm_outbox), where
    each session's folder is its random id next to write-back's creds/."""
    return paths.vm_outbox(vm_name)


def mode_of_vm(expected: dict[str, Any] | None, workspace: Path) -> str | None:
    """live or isolated, from the mounts agentbox rendered for the VM; None when there is no record."""
    if not expected:
        return None
    for location, mount_point, writable in expected.get("mounts", []):
        if location != str(workspace):
            continue
        if mount_point == str(workspace) and writable:
            return LIVE
        if mount_point == GUEST_SOURCE and not writable:
            return ISOLATED
    return None


def session_mode(requested: str, vm_mode: str | None, vm_name: str, asked_by: str, aside: bool = False) -> str:
    """The mode this launch runs in. An isolated VM only runs isolated (it is the stricter). A VM created live
    refuses a launch that asked for isolation rather than run it live, unless `aside` (the session's own
    `--isolated`): then it runs on a copy aside in that VM (launch.sh --copy-aside), as `run --on local` does."""
    if vm_mode == ISOLATED:
        return ISOLATED
    if requested == ISOLATED and aside and vm_mode == LIVE:
        return ISOLATED
    if requested == ISOLATED:
        raise StateError(
            f"isolation was asked for ({asked_by}), but the VM {vm_name} was created live: the agent would "
            "edit your workspace directly, so agentbox does not start it",
            hint="Set `session.mode: isolated` in agentbox.yml (or the global config) and run "
            "`agentbox start --recreate`, or run `agentbox start --recreate --isolated`: either recreates the "
            "VM isolated (its disk is deleted; your workspace on the host is not touched).",
        )
    return LIVE


def not_a_git_work_tree(workspace: Path) -> ConfigError:
    """Isolated mode builds the copy from a git checkpoint and applies proposals with git."""
    return ConfigError(
        f"session.mode: isolated needs the workspace {workspace} to be a git work tree (agentbox makes the "
        "agent's copy from a git checkpoint of it and applies its proposals with git), and it is not one",
        hint=NOT_GIT_HINT,
    )


def mount_point_problem(mount_point: str, workspace: Path) -> str | None:
    """Why an extra mount cannot be had in an isolated VM: the workspace path holds the guest-local copy, and
    a share at, above or in it would put the copy (and its removal) on the host."""
    point = os.path.normpath(mount_point)
    for reserved, what in ((str(workspace), "the workspace path, where the agent's copy lives"),
                           (GUEST_SOURCE, "where the VM sees the workspace")):
        if point == reserved or point.startswith(reserved.rstrip("/") + "/") or reserved.startswith(point + "/"):
            return f"its mount point {point} is at, inside or above {reserved} ({what})"
    return None


def with_isolation(config: Config) -> Config:
    """The config of a launch given `--isolated`: the flag wins over session.mode."""
    return config._replace(
        session_mode=ISOLATED, origins={**config.origins, "session.mode": "the command line (--isolated)"}
    )


def asked_on_command_line(config: Config) -> bool:
    """Whether this launch's isolation is its own `--isolated` (a session on a copy), not session.mode (a VM
    that cannot write the workspace)."""
    return config.session_mode == ISOLATED and config.origins.get("session.mode", "").startswith("the command line")


def asked_by(config: Config) -> str:
    origin = config.origins.get("session.mode", "")
    return origin if origin.startswith("the command line") else f"session.mode: isolated in {origin}"


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
    import fcntl
    import json

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
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
