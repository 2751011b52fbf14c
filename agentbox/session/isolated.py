"""An isolated session: before it, the base the agent's copy starts from; after it, its changes as proposals.

agentbox.review.isolation describes the mode and keeps the record (isolated.json); this module runs the session's
two host steps around the one `limactl shell` (agentbox.session.launch).
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox.fsutil import private_dir
from agentbox.git import snapshot, store
from agentbox.progress import note, warn
from agentbox.review import isolation
from agentbox.safetext import visible
from agentbox.staginglayout import IsolatedLaunch
from agentbox.vm import workmode

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.session.checkpointing import SessionCheckpoints


SSH_FAILED = 255
KEEP_BASES = 50
KEEP_SESSIONS = 50
BASE_MESSAGE = "agentbox: the base of an isolated session (the workspace as it was at launch)\n"


def begin(config: Config, vm_name: str, agent: str, chdir: str, points: SessionCheckpoints,
          aside: bool = False) -> IsolatedLaunch:
    """Before the session: collect what earlier sessions left, choose the base, make this session's outbox folder.
    `aside`: the VM was created live; it mounts the workspace at its own path, and the copy goes elsewhere.

    The base is the launch's start checkpoint (or, with checkpoints off or failed, a commit made the same way),
    unless the VM's copy already has a base with the same content: then that one is sent again and the copy,
    with the agent's earlier work in it, carries over.
    """
    # deferred: start-up (review.proposals and its patch checks: an isolated session only, never a live launch)
    from agentbox.review import proposals

    workspace = config.require_workspace()
    repo = store.find(workspace)
    if repo is None:
        raise workmode.not_a_git_work_tree(workspace)
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
    outbox_dir = private_dir(isolation.outbox(vm_name))
    while True:
        session = _session_id()
        try:
            os.mkdir(outbox_dir / session, 0o700)  # a fresh random name: never one the VM made (or a link)
            break
        except FileExistsError:
            continue
    with isolation.locked_record(workspace) as record:
        candidate = _choose_base(repo, workspace, vm_name, candidate, record)
        base = candidate.commit
        record["sessions"][session] = {"vm": vm_name, "agent": agent, "base": base, "started": isolation.now(),
                                       "checkpointSession": points.session}
        _prune(record)
    _write_stream(repo, outbox_dir / session / "base.fi", candidate)
    source = str(workspace) if aside else workmode.GUEST_SOURCE
    return IsolatedLaunch(source, base, outbox_dir / session, chdir, aside)


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
    fmt = "sha1" if len(tree) == 40 else "sha256"
    return store.object_id(b"commit", store.commit_object(tree, head, message, 0), fmt)


def _own_base(repo: Any, max_file_size: int) -> Base:
    """A commit of the workspace as it is, when no start checkpoint was taken (checkpoints off, or it failed)."""
    snap = snapshot.take(repo, max_file_size)
    if snap.skipped:
        shown = ", ".join(f"{visible(path)} ({size:,} bytes)" for path, size in snap.skipped[:5])
        more = f" and {len(snap.skipped) - 5} more" if len(snap.skipped) > 5 else ""
        warn(f"files larger than {max_file_size:,} bytes (checkpoints.maxFileSize) are not in the agent's copy: "
             f"{shown}{more}")
    stored = store.commit(repo, snap.tree, None, BASE_MESSAGE)
    return Base("", snap.tree, snap.head, stored)


def _choose_base(repo: Any, workspace: Path, vm_name: str, candidate: Base, record: dict[str, Any]) -> Base:
    """The candidate with its commit id, recorded as a base agentbox gave the VM. The id follows from the tree,
    HEAD and how many times the copy was remade: the VM keeps its copy while it gets the same id, and a copy
    marked fresh (its proposal applied or rejected) gets a new one, so launch.sh makes it anew."""
    copies = record.setdefault("copies", {})
    if vm_name in record["fresh"]:
        copies[vm_name] = int(copies.get(vm_name, 0)) + 1
    chosen = candidate._replace(copy=int(copies.get(vm_name, 0)))
    chosen = chosen._replace(commit=vm_commit(chosen.tree, chosen.head, chosen.message))
    store.set_ref(repo, isolation.base_ref(workspace, vm_name), chosen.stored)
    if record["current"].get(vm_name) != chosen.commit or chosen.commit not in record["bases"]:
        record["bases"][chosen.commit] = {"tree": chosen.tree, "head": chosen.head, "vm": vm_name,
                                          "time": isolation.now()}
        record["current"][vm_name] = chosen.commit
    record["fresh"] = [name for name in record["fresh"] if name != vm_name]
    return chosen


def _write_stream(repo: Any, path: Path, base: Base) -> None:
    """base.fi: the fast-import stream from which the VM makes the base commit (see the module's docstring)."""
    # deferred: start-up (git.read: an isolated session only, never a live launch)
    from agentbox.git import read

    entries = store.tree_entries(repo, base.tree)
    known: set[str] = set()
    try:
        known = {entry.oid for entry in read.read_index(repo.git_dir / "index", 1 << 30,
                                                           fmt=store.store_format(repo))}
    except (read.GitReadError, OSError):
        pass  # every file inline
    inline = [oid for mode, oid, _ in entries if mode != "160000" and oid not in known]
    blobs = store.read_blobs(repo, inline)
    stamp = b"agentbox <agentbox@localhost> 0 +0000"
    message = base.message.encode()
    parts = [b"commit refs/agentbox/base\n", b"author " + stamp + b"\n", b"committer " + stamp + b"\n",
             b"data %d\n" % len(message), message, b"\n"]
    if base.head:
        parts.append(b"from " + base.head.encode() + b"\n")
    parts.append(b"deleteall\n")
    for mode, oid, name in entries:
        quoted = store.fast_import_path(name)
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


def finish(config: Config, vm_name: str, launch: IsolatedLaunch, code: int) -> dict[str, int] | None:
    """After the session: its changes (and any other finished session's) become proposals. Returns this session's
    proposal ({"id", "files"}), if it made one."""
    # deferred: start-up (review.proposals and its patch checks: an isolated session only, never a live launch)
    from agentbox.review import proposals

    workspace = config.require_workspace()
    session = launch.outbox.name
    made = proposals.collect(workspace, vm_name)
    for item in made:
        if item.session != session and item.proposal is not None:
            note(f"an earlier isolated session left changes: {item}")
    own = [item for item in made if item.session == session]
    for item in own:
        if item.proposal is None:
            if item.filed_as is not None:
                note(f"the session changed nothing in the workspace copy since proposal {item.filed_as}: no new "
                     "proposal")
            elif item.problem is None:
                note("the session changed nothing in the workspace copy: no proposal")
            continue
        note(f"{item}; `agentbox review` shows it, `agentbox apply` applies it to {workspace}")
        refused = proposals.refusals_of(workspace, item.proposal)
        if refused:
            shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
            warn(f"apply will refuse proposal {item.proposal} as it is: {shown}")
    # No finished outbox: launch.sh ended before writing one (the program never ran, or launch.sh was
    # stopped). After ssh's 255 (a signal ended launch.sh, or the connection went) it may still be running: its
    # folder is left for later, and said all the same.
    if not own and proposals.forget_session(workspace, vm_name, session, only_if_empty=code == SSH_FAILED):
        note("the session's changes were not collected (the launch step ended early); they stay in the "
             f"VM's copy at {workspace}")
    return next(({"id": item.proposal, "files": item.files} for item in own if item.proposal is not None), None)


def _session_id() -> str:
    return time.strftime("s-%Y%m%dT%H%M%SZ-", time.gmtime()) + secrets.token_hex(4)
