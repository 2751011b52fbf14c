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
into a proposal (agentbox.proposals) after `limactl shell` returns: no extra limactl call.

Whether a VM is isolated is fixed when it is created (the mounts are). `mode_of_vm` reads it from what
agentbox rendered for the VM; `session_mode` decides a launch's mode from that and what was asked.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import paths, staging
from agentbox.errors import ConfigError, StateError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.progress import note, warn
from agentbox.safetext import visible
from agentbox.staging import IsolatedLaunch

if TYPE_CHECKING:
    from agentbox.config import Config
    from agentbox.session_checkpoints import SessionCheckpoints

LIVE = "live"
ISOLATED = "isolated"
SSH_FAILED = 255
# Where an isolated VM sees the host workspace, read-only. The workspace's own path holds the agent's copy.
GUEST_SOURCE = "/mnt/agentbox/workspace"
NOT_GIT_HINT = (
    "Make it a git repository (`git init`; one without commits works), or use `session.mode: live`."
)


def outbox(vm_name: str) -> Path:
    """The host folder an isolated VM writes its sessions' changes to: the VM's outbox (staging.outbox), where
    each session's folder is its random id next to write-back's creds/."""
    return staging.outbox(vm_name)


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


def session_mode(requested: str, vm_mode: str | None, vm_name: str, asked_by: str) -> str:
    """The mode this launch runs in. An isolated VM only runs isolated (it is the stricter); a VM that is not
    isolated refuses a launch that asked for isolation rather than run it live."""
    if vm_mode == ISOLATED:
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
KEEP_BASES = 50
KEEP_SESSIONS = 50
BASE_MESSAGE = "agentbox: the base of an isolated session (the workspace as it was at launch)\n"


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


def begin(config: Config, vm_name: str, agent: str, chdir: str, points: SessionCheckpoints) -> IsolatedLaunch:
    """Before the session: collect what earlier sessions left, choose the base, make this session's outbox folder.

    The base is the launch's start checkpoint (or, with checkpoints off or failed, a commit made the same way),
    unless the VM's copy already has a base with the same content: then that one is sent again and the copy,
    with the agent's earlier work in it, carries over.
    """
    from agentbox import hostgit, proposals

    workspace = config.require_workspace()
    repo = hostgit.find(workspace)
    if repo is None:
        raise not_a_git_work_tree(workspace)
    for made in proposals.collect(workspace, vm_name):
        if made.proposal is not None:
            note(f"an earlier isolated session left changes: {made}")
    start = points.taken.checkpoint if points.taken is not None else None
    if start is not None:
        candidate = Base("", start.tree, start.head, start.commit)
        if start.skipped:
            warn(f"the agent's copy of the workspace lacks the {len(start.skipped)} file"
                 f"{'s' if len(start.skipped) != 1 else ''} the checkpoint left out for their size")
    else:
        candidate = _own_base(repo, config.checkpoints.max_file_size)
    outbox_dir = private_dir(outbox(vm_name))
    while True:
        session = _session_id()
        try:
            os.mkdir(outbox_dir / session, 0o700)  # a fresh random name: never one the VM made (or a link)
            break
        except FileExistsError:
            continue
    with locked_record(workspace) as record:
        candidate = _choose_base(repo, workspace, vm_name, candidate, record)
        base = candidate.commit
        record["sessions"][session] = {"vm": vm_name, "agent": agent, "base": base, "started": now(),
                                       "checkpointSession": points.session}
        _prune(record)
    _write_stream(repo, outbox_dir / session / "base.fi", candidate)
    return IsolatedLaunch(GUEST_SOURCE, base, outbox_dir / session, chdir)


class Base(NamedTuple):
    commit: str  # the commit the VM makes from base.fi (parent: head); "" until chosen
    tree: str
    head: str | None
    stored: str  # a commit of that tree in agentbox's store
    copy: int = 0  # how many times the VM's copy was remade (in the commit's message: a new copy, a new id)

    @property
    def message(self) -> str:
        return BASE_MESSAGE + (f"\ncopy {self.copy}\n" if self.copy else "")


def vm_commit(tree: str, head: str | None, message: str) -> str:
    """The id of the commit base.fi makes in the VM: its fields are fixed, so it follows from tree, head and
    message."""
    from agentbox import hostgit

    fmt = "sha1" if len(tree) == 40 else "sha256"
    return hostgit.object_id(b"commit", hostgit.commit_object(tree, head, message, 0), fmt)


def _own_base(repo: Any, max_file_size: int) -> Base:
    """A commit of the workspace as it is, when no start checkpoint was taken (checkpoints off, or it failed)."""
    from agentbox import hostgit

    snap = hostgit.snapshot(repo, max_file_size)
    if snap.skipped:
        shown = ", ".join(f"{visible(path)} ({size:,} bytes)" for path, size in snap.skipped[:5])
        more = f" and {len(snap.skipped) - 5} more" if len(snap.skipped) > 5 else ""
        warn(f"files larger than {max_file_size:,} bytes (checkpoints.maxFileSize) are not in the agent's copy: "
             f"{shown}{more}")
    stored = hostgit.commit(repo, snap.tree, None, BASE_MESSAGE)
    return Base("", snap.tree, snap.head, stored)


def _choose_base(repo: Any, workspace: Path, vm_name: str, candidate: Base, record: dict[str, Any]) -> Base:
    """The candidate with its commit id, recorded as a base agentbox gave the VM. The id follows from the tree,
    HEAD and how many times the copy was remade: the VM keeps its copy while it gets the same id, and a copy
    marked fresh (its proposal applied or rejected) gets a new one, so launch.sh makes it anew."""
    from agentbox import hostgit

    copies = record.setdefault("copies", {})
    if vm_name in record["fresh"]:
        copies[vm_name] = int(copies.get(vm_name, 0)) + 1
    chosen = candidate._replace(copy=int(copies.get(vm_name, 0)))
    chosen = chosen._replace(commit=vm_commit(chosen.tree, chosen.head, chosen.message))
    hostgit.set_ref(repo, base_ref(workspace, vm_name), chosen.stored)
    if record["current"].get(vm_name) != chosen.commit or chosen.commit not in record["bases"]:
        record["bases"][chosen.commit] = {"tree": chosen.tree, "head": chosen.head, "vm": vm_name, "time": now()}
        record["current"][vm_name] = chosen.commit
    record["fresh"] = [name for name in record["fresh"] if name != vm_name]
    return chosen


def _write_stream(repo: Any, path: Path, base: Base) -> None:
    """base.fi: the fast-import stream from which the VM makes the base commit (see the module's docstring)."""
    from agentbox import gitread, hostgit

    entries = hostgit.tree_entries(repo, base.tree)
    known: set[str] = set()
    try:
        known = {entry.oid for entry in gitread.read_index(repo.git_dir / "index", 1 << 30,
                                                           fmt=hostgit.store_format(repo))}
    except (gitread.GitReadError, OSError):
        pass  # every file inline
    inline = [oid for mode, oid, _ in entries if mode != "160000" and oid not in known]
    blobs = hostgit.read_blobs(repo, inline)
    stamp = b"agentbox <agentbox@localhost> 0 +0000"
    message = base.message.encode()
    parts = [b"commit refs/agentbox/base\n", b"author " + stamp + b"\n", b"committer " + stamp + b"\n",
             b"data %d\n" % len(message), message, b"\n"]
    if base.head:
        parts.append(b"from " + base.head.encode() + b"\n")
    parts.append(b"deleteall\n")
    for mode, oid, name in entries:
        quoted = hostgit.fast_import_path(name)
        if oid in blobs:
            data = blobs[oid]
            parts += [b"M " + mode.encode() + b" inline " + quoted + b"\n", b"data %d\n" % len(data), data, b"\n"]
        else:
            parts.append(b"M " + mode.encode() + b" " + oid.encode() + b" " + quoted + b"\n")
    parts.append(b"\ndone\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(b"feature done\n")
        handle.writelines(parts)


def _prune(record: dict[str, Any]) -> None:
    keep = set(record["current"].values())
    bases = sorted(record["bases"].items(), key=lambda item: item[1].get("time", ""))
    for commit, _ in bases[: max(0, len(bases) - KEEP_BASES)]:
        if commit not in keep:
            del record["bases"][commit]
    sessions = sorted(record["sessions"].items(), key=lambda item: item[1].get("started", ""))
    for session, _ in sessions[: max(0, len(sessions) - KEEP_SESSIONS)]:
        del record["sessions"][session]


def finish(config: Config, vm_name: str, launch: IsolatedLaunch, code: int) -> None:
    """After the session: its changes (and any other finished session's) become proposals."""
    from agentbox import proposals

    workspace = config.require_workspace()
    session = launch.outbox.name
    made = proposals.collect(workspace, vm_name)
    for item in made:
        if item.session != session and item.proposal is not None:
            note(f"an earlier isolated session left changes: {item}")
    own = [item for item in made if item.session == session]
    for item in own:
        if item.proposal is None:
            if item.problem is None:
                note("the session changed nothing in the workspace copy: no proposal")
            continue
        note(f"{item}; `agentbox review` shows it, `agentbox apply` applies it to {workspace}")
        refused = proposals.refusals_of(workspace, item.proposal)
        if refused:
            shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
            warn(f"apply will refuse proposal {item.proposal} as it is: {shown}")
    # No finished outbox: launch.sh ended before writing one (the program never ran, or launch.sh was
    # stopped). After a lost connection (ssh's 255) it may still be running: its folder is left for later.
    if not own and proposals.forget_session(workspace, vm_name, session, only_if_empty=code == SSH_FAILED):
        note("the session's changes were not collected (the launch step ended early); they stay in the "
             f"VM's copy at {workspace}")


def mark_fresh(workspace: Path, vm_name: str, base: str) -> None:
    """Remake the VM's copy at its next launch, when it still holds the work of this base (rejected or applied)."""
    with locked_record(workspace) as record:
        if record["current"].get(vm_name) == base and vm_name not in record["fresh"]:
            record["fresh"].append(vm_name)


def _session_id() -> str:
    import secrets
    import time

    return time.strftime("s-%Y%m%dT%H%M%SZ-", time.gmtime()) + secrets.token_hex(4)


def now() -> str:
    import datetime

    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
