"""Proposals: an isolated session's changes, kept on the host for review and applied only as a checked patch.

After an isolated session (agentbox.review.isolation) the VM has left, in its outbox session folder,
`changes.patch` (`git diff --binary --full-index --no-renames` of the copy against its base), maybe the
agent's `summary.md`, and `base` (written last: the folder is finished). `collect` turns each finished
folder into a proposal and removes the folder:

    <workspace state dir>/proposals/<id>/proposal.json   version, id, status, agent, vm, session, created,
                                                          base {commit, tree, head}, files [{status, path,
                                                          oldPath?}], added, removed, patchSha256, patchSize,
                                                          summary ("agent" or "generated"), problem
    <workspace state dir>/proposals/<id>/changes.patch   the patch as the VM wrote it
    <workspace state dir>/proposals/<id>/summary.md      the agent's summary, or one made from the patch
    <workspace state dir>/events.jsonl                    proposal_created, proposal_reviewed,
                                                          proposal_applied, proposal_rejected: one JSON
                                                          object per line

Ids are small integers per workspace. A proposal is `pending` until it is `applied` or `rejected`; a
later proposal from the same copy (same base) marks the earlier pending ones `superseded` (it holds their
changes too, unless the agent undid them). A superseded proposal is never applied (the one that superseded it
is), and rejecting a proposal rejects the ones it superseded. A session that leaves the copy's changes exactly as
the last proposal of that copy has them files nothing: those changes were filed (and maybe settled) already.

Nothing from the VM is trusted: outbox files are opened relative to the folder's descriptor, never
through a link, regular files only, with size caps (a FIFO or a device never blocks or feeds
agentbox); the base must be one agentbox gave that VM; the patch is parsed by agentbox.review.patchcheck and
applied only when it names nothing the host must not take, with its digest checked against the one
recorded when it was collected (an edited patch is refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import fsutil, lazyre, paths, vmread
from agentbox.config.checkpointkeys import CheckpointSettings
from agentbox.errors import AgentboxError, StateError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.git import snapshot, store
from agentbox.progress import warn
from agentbox.review import checkpoints, isolation, patchcheck, restore, rewind, tripwire
from agentbox.safetext import visible
from agentbox.vm import workmode

VERSION = 1
PENDING, APPLIED, REJECTED, SUPERSEDED = "pending", "applied", "rejected", "superseded"
PATCH, SUMMARY, BASE, RECORD = "changes.patch", "summary.md", "base", "proposal.json"
MAX_PATCH = 64 * 1024 * 1024
MAX_SUMMARY = 256 * 1024
MAX_BASE = 256
_OID = lazyre.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_SESSION = lazyre.compile(r"s-[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")


class Collected(NamedTuple):
    """A finished session folder: the proposal it became (None: the session changed nothing)."""

    session: str
    proposal: int | None
    files: int
    problem: str | None = None
    filed_as: int | None = None  # the copy's changes are exactly those of this earlier proposal: nothing new

    def __str__(self) -> str:
        if self.proposal is None:
            return f"no changes since proposal {self.filed_as}" if self.filed_as is not None else "no changes"
        what = f"proposal {self.proposal}: {self.files} file{'s' if self.files != 1 else ''} changed"
        return f"{what} (apply will refuse it: {self.problem})" if self.problem else what


class OutboxError(AgentboxError):
    """A file in the outbox that agentbox will not read (a link, not a regular file, too large)."""


def folder(workspace: Path) -> Path:
    return paths.workspace_state_dir(workspace) / "proposals"


def events_file(workspace: Path) -> Path:
    return paths.workspace_state_dir(workspace) / "events.jsonl"


@contextmanager
def locked(workspace: Path) -> Iterator[None]:
    """One agentbox at a time collects, applies or marks a workspace's proposals."""
    with fsutil.locked(private_dir(paths.workspace_state_dir(workspace)) / "proposals.lock"):
        yield


def append_event(workspace: Path, event: str, **fields: Any) -> None:
    """One line of events.jsonl, written with a single append (lines of concurrent writers never mix)."""
    line = json.dumps({"time": isolation.now(), "event": event, **fields}, sort_keys=False) + "\n"
    private_dir(paths.workspace_state_dir(workspace))
    fd = os.open(events_file(workspace), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- from the outbox ----------------------------------------------------------------------------


def collect(workspace: Path, vm_name: str) -> list[Collected]:
    """Every finished session folder in the VM's outbox, made into a proposal (or noted as unchanged) and removed.

    Folders still being written (no `base` yet: their session may still run) are left alone; so are names
    agentbox did not make.
    """
    made: list[Collected] = []
    with locked(workspace):
        try:
            outbox_fd = os.open(isolation.outbox(vm_name), vmread.DIR_FLAGS)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateError(f"cannot read the outbox {isolation.outbox(vm_name)}: {exc.strerror}") from exc
        try:
            with isolation.locked_record(workspace) as record:
                for name in sorted(os.listdir(outbox_fd)):
                    session = record["sessions"].get(name)
                    if session is None or session.get("vm") != vm_name or not _SESSION.fullmatch(name):
                        continue
                    result = _collect_one(workspace, vm_name, outbox_fd, name, session, record)
                    if result is not None:
                        made.append(result)
                        del record["sessions"][name]
                        try:
                            _remove_at(outbox_fd, name)
                        except (OSError, StateError) as exc:  # it is no longer a session's: never read again
                            warn(f"could not remove the outbox folder {name} of {vm_name}: "
                                 f"{getattr(exc, 'message', None) or exc}")
        finally:
            os.close(outbox_fd)
    return made


def forget_session(workspace: Path, vm_name: str, session: str, only_if_empty: bool) -> bool:
    """A session that ended without a finished outbox folder: drop the folder (only an empty one, when its
    launch step may still run) and agentbox's record of it. True when the folder held something the VM wrote,
    dropped or kept."""
    written = False
    with locked(workspace):
        try:
            outbox_fd = os.open(isolation.outbox(vm_name), vmread.DIR_FLAGS)
        except OSError:
            return False
        try:
            try:
                session_fd = vmread.open_dir(outbox_fd, session)
            except OSError:
                return False
            try:
                written = bool(os.listdir(session_fd))
            finally:
                os.close(session_fd)
            if written and only_if_empty:
                return True
            _remove_at(outbox_fd, session)
            with isolation.locked_record(workspace) as record:
                record["sessions"].pop(session, None)
        finally:
            os.close(outbox_fd)
    return written


def _collect_one(
    workspace: Path, vm_name: str, outbox_fd: int, name: str, session: dict[str, Any], record: dict[str, Any]
) -> Collected | None:
    try:
        session_fd = vmread.open_dir(outbox_fd, name)
    except OSError:
        return None
    try:
        base_bytes = read_at(session_fd, BASE, MAX_BASE)
        if base_bytes is None:
            return None  # not finished
        base = base_bytes.decode("ascii", "replace").strip()
        known = record["bases"].get(base)
        if not _OID.fullmatch(base) or known is None or known.get("vm") != vm_name:
            warn(f"the outbox of isolated session {name} names a base agentbox did not give {vm_name} "
                 f"({visible(base[:80])}); its changes are not taken")
            return Collected(name, None, 0, "unknown base")
        patch = read_at(session_fd, PATCH, MAX_PATCH) or b""
        summary = read_at(session_fd, SUMMARY, MAX_SUMMARY)
    except OutboxError as exc:
        warn(f"the outbox of isolated session {name}: {exc.message}; its changes are not taken "
             "(they stay in the VM's copy)")
        return Collected(name, None, 0, exc.message)
    finally:
        os.close(session_fd)
    if not patch:
        return Collected(name, None, 0)
    earlier = _last_of_copy(workspace, vm_name, base)
    if earlier is not None and earlier.get("patchSha256") == hashlib.sha256(patch).hexdigest():
        return Collected(name, None, 0, filed_as=earlier["id"])
    proposal = _store(workspace, vm_name, name, session, base, known, patch, summary, record)
    return Collected(name, proposal["id"], len(proposal["files"]), proposal.get("problem"))


def _last_of_copy(workspace: Path, vm_name: str, base: str) -> dict[str, Any] | None:
    """The newest proposal a session of this copy (the VM's copy from this base) filed, whatever became of it."""
    same = [p for p in _all(workspace) if p.get("vm") == vm_name and p.get("task") is None
            and (p.get("base") or {}).get("commit") == base]
    return same[-1] if same else None


def read_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A file of a folder the VM wrote (vmread's rules), None when absent; OutboxError says why it is not read."""
    try:
        return vmread.read_at(dir_fd, name, limit)
    except vmread.Refused as refused:
        raise OutboxError(refused.message) from None


def _remove_at(parent_fd: int, name: str) -> None:
    """Remove a file or folder the VM wrote, without following any link in it."""
    if not vmread.remove(parent_fd, name):
        raise StateError(f"{visible(name)} in the outbox could not be removed (folders nested more than "
                         f"{vmread.MAX_DEPTH} deep?); remove it by hand")


# -- the store ----------------------------------------------------------------------------------


def store_task(workspace: Path, task: int, agent: str, vm_name: str, base: dict[str, Any], patch: bytes,
               summary: bytes | None) -> Collected:
    """An isolated task's changes (`agentbox run --on`), as a proposal: base is the task's {commit, tree, head} in
    agentbox's store (what its copy started from). Unlike a session's, it supersedes no earlier proposal: each
    task has a copy of its own."""
    commit = str(base.get("commit") or "")
    if not _OID.fullmatch(commit):
        raise StateError(f"task {task} has no valid base commit ({visible(commit[:80])})")
    with locked(workspace), isolation.locked_record(workspace) as record:
        proposal = _store(workspace, vm_name, f"task-{task}", {"agent": agent}, commit, base, patch, summary,
                          record, task=task)
    return Collected(f"task-{task}", proposal["id"], len(proposal["files"]), proposal.get("problem"))


def _store(
    workspace: Path, vm_name: str, session_id: str, session: dict[str, Any], base: str, known: dict[str, Any],
    patch: bytes, summary: bytes | None, record: dict[str, Any], task: int | None = None,
) -> dict[str, Any]:
    problem = None
    try:
        changes = patchcheck.parse(patch, limit=MAX_PATCH)
    except patchcheck.PatchError as exc:
        changes, problem = [], f"the patch cannot be read: {exc}"
    files = [_file_entry(change) for change in changes]
    proposals_dir = private_dir(folder(workspace))
    # Never an id used before, even when proposal folders were deleted: events.jsonl names them.
    number = max(int(record.get("nextProposal", 1)), 1 + max((p["id"] for p in _all(workspace)), default=0))
    record["nextProposal"] = number + 1
    proposal = {
        "version": VERSION,
        "id": number,
        "status": PENDING,
        "agent": session.get("agent"),
        "vm": vm_name,
        "session": session_id,
        "created": isolation.now(),
        "started": session.get("started"),
        "base": {"commit": base, "tree": known.get("tree"), "head": known.get("head")},
        "files": files,
        "added": sum(change.added_lines for change in changes),
        "removed": sum(change.removed_lines for change in changes),
        "patchSha256": hashlib.sha256(patch).hexdigest(),
        "patchSize": len(patch),
        "summary": "agent" if summary is not None else "generated",
        "problem": problem,
        **({"task": task} if task is not None else {}),
    }
    # Written under a temporary name, renamed last: a proposal folder is whole or absent.
    staging = proposals_dir / f".{number}.partial"
    if os.path.lexists(staging):

        shutil.rmtree(staging)  # left by an agentbox that was killed here; agentbox's own folder
    private_dir(staging)
    atomic_write(staging / PATCH, patch, mode=0o600)
    atomic_write(staging / SUMMARY, summary if summary is not None else generated_summary(proposal), mode=0o600)
    atomic_write(staging / RECORD, json.dumps(proposal, indent=2), mode=0o600)
    os.rename(staging, proposals_dir / str(number))
    for earlier in [] if task is not None else _all(workspace):
        if earlier["id"] != number and earlier["status"] == PENDING and earlier.get("vm") == vm_name and \
                earlier.get("base", {}).get("commit") == base:
            _update(workspace, earlier, status=SUPERSEDED, supersededBy=number)
    append_event(workspace, "proposal_created", proposal=number, agent=proposal["agent"], vm=vm_name,
                 session=session_id, base=base, files=len(files), patchSha256=proposal["patchSha256"],
                 **({"task": task} if task is not None else {}))
    return proposal


def _file_entry(change: Any) -> dict[str, Any]:
    entry = {"status": change.status, "path": change.new_path if change.new_path is not None else change.old_path}
    if change.status in ("renamed", "copied"):
        entry["oldPath"] = change.old_path
    return entry


def generated_summary(proposal: dict[str, Any]) -> bytes:
    """What the proposal changes, when the agent wrote no summary: the files, like `git diff --stat` in words."""
    files = proposal["files"]
    origin = f"isolated task {proposal['task']}" if proposal.get("task") else "an isolated session"
    lines = [
        f"# Changes from {origin} of {proposal.get('agent') or 'an agent'}",
        "",
        "(written by agentbox from the patch: the agent left no summary)",
        "",
        f"{len(files)} file{'s' if len(files) != 1 else ''} changed, {proposal['added']} line(s) added, "
        f"{proposal['removed']} removed:",
        "",
    ]
    for entry in files:
        source = f" (from {entry['oldPath']})" if entry.get("oldPath") else ""
        lines.append(f"- {entry['status']}: {entry['path']}{source}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _all(workspace: Path) -> list[dict[str, Any]]:
    """Every proposal of the workspace, oldest first (a folder without a readable record is left out)."""
    found = []
    try:
        names = os.listdir(folder(workspace))
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            data = json.loads((folder(workspace) / name / RECORD).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("id") == int(name):
            found.append(data)
    return sorted(found, key=lambda p: p["id"])


def all_proposals(workspace: Path) -> list[dict[str, Any]]:
    return _all(workspace)


def _update(workspace: Path, proposal: dict[str, Any], **changes: Any) -> dict[str, Any]:
    proposal = {**proposal, **changes}
    atomic_write(folder(workspace) / str(proposal["id"]) / RECORD, json.dumps(proposal, indent=2), mode=0o600)
    return proposal


def find(workspace: Path, wanted: str | None) -> dict[str, Any]:
    """The proposal named by its id (`3` or `#3`), or the newest pending one."""
    proposals = _all(workspace)
    if wanted is None:
        pending = [p for p in proposals if p["status"] == PENDING]
        if not pending:
            others = " (`agentbox proposals` lists the others)" if proposals else ""
            raise StateError(
                f"no pending proposal for {workspace}{others}",
                hint="Proposals come from isolated sessions: `agentbox <agent> --isolated` (or session.mode: "
                "isolated).",
            )
        return pending[-1]
    text = wanted.lstrip("#")
    if not text.isdigit():
        raise StateError(f"{visible(wanted)} is not a proposal id (a number, as `agentbox proposals` lists them)")
    for proposal in proposals:
        if proposal["id"] == int(text):
            return proposal
    raise StateError(f"there is no proposal {text} for {workspace}", hint="`agentbox proposals` lists them.")


def patch_path(workspace: Path, proposal: dict[str, Any]) -> Path:
    return folder(workspace) / str(proposal["id"]) / PATCH


def read_patch(workspace: Path, proposal: dict[str, Any]) -> bytes:
    """The stored patch, checked against the digest recorded when it was collected."""
    path = patch_path(workspace, proposal)
    try:
        dir_fd = os.open(path.parent, vmread.DIR_FLAGS)
    except OSError as exc:
        raise StateError(
            f"proposal {proposal['id']}: its folder {path.parent} cannot be read ({exc.strerror})"
        ) from exc
    try:
        data = read_at(dir_fd, PATCH, MAX_PATCH)
    except OutboxError as exc:
        raise StateError(f"proposal {proposal['id']}: {exc.message}") from exc
    finally:
        os.close(dir_fd)
    if data is None:
        raise StateError(f"proposal {proposal['id']}: its patch {path} is missing")
    if hashlib.sha256(data).hexdigest() != proposal.get("patchSha256"):
        raise StateError(
            f"proposal {proposal['id']}: {path} was changed after agentbox collected it (its sha256 is not the "
            "one recorded then), so agentbox will not apply it",
            hint="Nothing was changed in the workspace. Run the isolated session again for a new proposal.",
        )
    return data


def read_summary(workspace: Path, proposal: dict[str, Any]) -> bytes:
    dir_fd = os.open(folder(workspace) / str(proposal["id"]), vmread.DIR_FLAGS)
    try:
        return read_at(dir_fd, SUMMARY, MAX_SUMMARY) or b""
    except OutboxError as exc:
        return f"(summary.md not shown: {exc.message})\n".encode()
    finally:
        os.close(dir_fd)


# -- review, apply, reject ----------------------------------------------------------------------


def host_exec_paths(workspace: Path, proposal: dict[str, Any]) -> list[str]:
    """The proposal's paths that the host runs without asking (the tripwire's list), for review's flags."""
    matcher = _host_exec_matcher(workspace)
    found = []
    for entry in proposal["files"]:
        for path in (entry.get("oldPath"), entry["path"]):
            if path is not None and path not in found and matcher(path):
                found.append(path)
    return found


def refusals(workspace: Path, proposal: dict[str, Any], patch: bytes, allow_host_exec: bool,
             left_out: frozenset[str] = frozenset()) -> list[str]:
    """Why apply refuses this patch, one line per change (empty: it may be applied). A host-run file among
    `left_out` (the paths of changes apply leaves out) needs no permission: it is not written."""
    if proposal.get("problem"):
        return [str(proposal["problem"])]
    try:
        changes = patchcheck.parse(patch, limit=MAX_PATCH)
    except patchcheck.PatchError as exc:
        return [f"the patch cannot be read: {exc}"]
    try:
        on_host = _on_host(workspace, proposal, changes)
    except StateError as exc:
        return [exc.message]
    runs = _host_exec_matcher(workspace)
    return patchcheck.problems(
        changes, host_exec=lambda path: path not in left_out and runs(path), allow_host_exec=allow_host_exec,
        on_host=on_host,
    )


def steering(old_path: str | None, new_path: str | None, steers: Callable[[str], bool]) -> bool:
    """Whether a change touches a file that steers an agent: a rename or copy to or from one counts whole."""
    return any(path is not None and steers(path) for path in (old_path, new_path))


def instruction_entries(proposal: dict[str, Any], steers: Callable[[str], bool]) -> list[dict[str, Any]]:
    """The proposal's file entries (named as its patch names them) that apply leaves out unless asked."""
    return [entry for entry in proposal["files"] if steering(entry.get("oldPath"), entry["path"], steers)]


class Selection(NamedTuple):
    """What one apply writes: its part of the patch, and the instruction changes it leaves out."""

    patch: bytes
    files: int
    left_out: tuple[str, ...]  # every path of the changes left out (a rename's both names), in the patch's order


def _select(proposal: dict[str, Any], patch: bytes, steers: Callable[[str], bool] | None) -> Selection:
    """The whole patch, or (steers given) the patch without the changes to instruction files; for a proposal
    applied without them, with steers None: only those changes."""
    try:
        parts = patchcheck.split(patch, limit=MAX_PATCH)
    except patchcheck.PatchError:
        return Selection(patch, len(proposal["files"]), ())  # refusals() names the problem
    earlier = set(proposal.get("leftOut") or ())
    if proposal["status"] == APPLIED:
        keep = [bool({change.old_path, change.new_path} & earlier) for change, _ in parts]
    else:
        keep = [steers is None or not steering(change.old_path, change.new_path, steers) for change, _ in parts]
    left_out = tuple(dict.fromkeys(path for (change, _), kept in zip(parts, keep, strict=True) if not kept
                                   for path in (change.old_path, change.new_path) if path is not None))
    taken = [text for (_, text), kept in zip(parts, keep, strict=True) if kept]
    return Selection(b"".join(taken), len(taken), left_out)


def refusals_of(workspace: Path, number: int) -> list[str]:
    """What apply would refuse in a stored proposal, host-run files included (the note after a session)."""
    proposal = find(workspace, str(number))
    try:
        return refusals(workspace, proposal, read_patch(workspace, proposal), allow_host_exec=False)
    except StateError as exc:
        return [exc.message]


def _host_exec_matcher(workspace: Path) -> Any:
    return tripwire.host_exec_matcher(workspace)


def _on_host(workspace: Path, proposal: dict[str, Any], changes: list[Any]) -> Callable[[str], Any]:
    """What each path the patch names is on the host: the workspace's entry (never followed) and the base's mode."""
    named = {path for change in changes for path in (change.old_path, change.new_path)
             if path is not None and patchcheck.path_problem(path) is None}
    if not named:
        return lambda path: patchcheck.NOT_THERE
    in_base = base_modes(workspace, proposal, sorted(named))
    found = {}
    for path in named:
        mode, target, folder = _workspace_entry(workspace, path)
        base = in_base.get(path)
        if patchcheck.SYMLINK in (mode, base):
            mode = patchcheck.SYMLINK
        found[path] = patchcheck.OnHost(mode or base, target, folder)
    return lambda path: found.get(path, patchcheck.NOT_THERE)


def base_modes(workspace: Path, proposal: dict[str, Any], paths: list[str]) -> dict[str, str]:
    """The mode ("100644", "120000"...) of each of paths that the proposal's base tree holds (absent: not there).

    The only use of hostgit for proposals' checks: where the base tree is read from may change, not what it says.
    """
    tree = (proposal.get("base") or {}).get("tree")
    repo = store.find(workspace)
    if not isinstance(tree, str) or repo is None:
        raise StateError(f"proposal {proposal['id']}: its base tree cannot be read, so agentbox cannot tell what "
                         "the files it changes are on your host")
    empty = _EMPTY_TREE[store.object_format(repo)]
    wanted = set(paths)
    # Named on the command line while few (a long list would pass the argument limit), else the whole tree.
    listed = store.changes(repo, empty, tree, sorted(wanted) if len(wanted) <= 1000 else None)
    return {change.path: change.new_mode for change in listed if change.path in wanted}


_EMPTY_TREE = {"sha1": "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
               "sha256": "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321"}


def _workspace_entry(workspace: Path, path: str) -> tuple[str | None, str | None, str | None]:
    """(mode, link target, a folder on the way that is a link) of path in the workspace, walked one name at a time
    from the workspace's descriptor, never through a link."""
    parts = path.split("/")
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None, None, None
    try:
        for index, name in enumerate(parts):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                return None, None, None
            last = index == len(parts) - 1
            if stat.S_ISLNK(st.st_mode):
                if not last:
                    return None, None, "/".join(parts[:index + 1])
                try:
                    return patchcheck.SYMLINK, os.readlink(name, dir_fd=fd), None
                except OSError:
                    return patchcheck.SYMLINK, None, None
            if last:
                if stat.S_ISREG(st.st_mode):
                    return (patchcheck.EXECUTABLE if st.st_mode & 0o100 else patchcheck.REGULAR), None, None
                return (patchcheck.TREE if stat.S_ISDIR(st.st_mode) else patchcheck.OTHER), None, None
            if not stat.S_ISDIR(st.st_mode):
                return None, None, None
            try:
                inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                return None, None, None
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    return None, None, None


def mark_reviewed(workspace: Path, proposal: dict[str, Any]) -> None:
    append_event(workspace, "proposal_reviewed", proposal=proposal["id"], patchSha256=proposal.get("patchSha256"))


class Applied(NamedTuple):
    proposal: dict[str, Any]
    checkpoint: int | None  # the checkpoint taken before applying (None for --check)
    head_moved: bool
    files: int = 0  # the file changes written (or, for --check, that would be)
    left_out: tuple[str, ...] = ()  # the paths of the instruction changes left out


def apply(
    workspace: Path, wanted: str | None, *, check_only: bool, three_way: bool, allow_host_exec: bool,
    settings: CheckpointSettings, steers: Callable[[str], bool] | None = None,
) -> Applied:
    """Apply a proposal to the workspace, or only check that it would apply. Refuses, with the workspace left
    exactly as it was: an applied proposal, a patch edited since it was collected, any change patchcheck
    refuses, a HEAD that moved since the base (unless three_way), and anything `git apply --check` refuses.

    `steers` (instructionfiles.matcher): the changes to files that steer an agent are left out (Applied.left_out),
    and a proposal of nothing else is refused. Without it, a proposal applied with them left out takes them now."""
    with locked(workspace):
        proposal = find(workspace, wanted)
        number = proposal["id"]
        _refuse_settled(workspace, proposal, taking_instructions=steers is None)
        later = proposal["status"] == APPLIED  # its instruction changes, left out before
        patch = read_patch(workspace, proposal)
        selection = _select(proposal, patch, steers)
        if later:  # the rest was checked (and is written): only these changes are checked again
            patch, selection = selection.patch, selection._replace(left_out=())
        found = refusals(workspace, proposal, patch, allow_host_exec, frozenset(selection.left_out))
        if found:
            listing = "\n".join(f"  - {line}" for line in found)
            host_exec = any("host runs without asking" in line for line in found)
            raise StateError(
                f"proposal {number} is refused; nothing was changed in {workspace}:\n{listing}",
                hint="`agentbox review` shows the patch. " + (
                    "Changes to files your host runs are taken only with `agentbox apply --allow-host-exec`, "
                    "after you have read them." if host_exec else "Ask the agent for a patch without these changes."
                ),
            )
        if not selection.files:
            raise StateError(
                f"proposal {number} changes only files that steer an agent ({_listed(selection.left_out)}), which "
                f"apply leaves out unless you name them; nothing was changed in {workspace}",
                hint=f"Read them (`agentbox review {number}`); `agentbox apply {number} --include-instructions` takes "
                "them.",
            )
        repo = store.find(workspace)
        if repo is None:
            raise StateError(f"{workspace} is no longer a git work tree; a proposal is applied with git",
                             hint=workmode.NOT_GIT_HINT)
        base_head = proposal["base"].get("head")
        now = store.head(repo)
        moved = now != base_head
        if moved and not three_way:
            raise StateError(
                f"HEAD moved since proposal {number} was made (from {_short(base_head)} to {_short(now)}): its "
                "patch was made against the old one; nothing was changed",
                hint=f"`agentbox apply {number} --3way` merges it with git's three-way merge, which refuses "
                "rather than leave conflicts.",
            )
        # The patch is applied to a tree of agentbox's store (the workspace as it is now); agentbox then
        # writes the files that changed itself (agentbox.review.restore): git never opens a path of the workspace.
        now_snap = snapshot.take(repo, settings.max_file_size)
        result_tree = store.apply_to_tree(repo, now_snap.tree, selection.patch, three_way=three_way)
        if check_only:
            return Applied(proposal, None, moved, selection.files, selection.left_out)
        checkpoint, before_tree = _checkpoint_before(workspace, number, settings)
        if before_tree != now_snap.tree:
            raise StateError(f"the workspace changed while proposal {number} was being applied; nothing was changed",
                             hint=f"Run `agentbox apply {number}` again.")
        _write_tree(repo, now_snap, result_tree)
        if later:
            proposal = _update(workspace, proposal, leftOut=[], instructionsApplied=isolation.now(),
                               instructionsCheckpoint=checkpoint)
        else:
            proposal = _update(workspace, proposal, status=APPLIED, applied=isolation.now(), checkpoint=checkpoint,
                               leftOut=list(selection.left_out))
        append_event(workspace, "proposal_applied", proposal=number, checkpoint=checkpoint, threeWay=three_way,
                     patchSha256=proposal.get("patchSha256"), leftOut=list(selection.left_out),
                     **({"instructionsOnly": True} if later else {}))
        if proposal.get("vm"):
            isolation.mark_fresh(workspace, proposal["vm"], proposal["base"]["commit"])
        return Applied(proposal, checkpoint, moved, selection.files, selection.left_out)


def _listed(paths: Sequence[str], limit: int = 10) -> str:
    shown = [visible(path) for path in paths[:limit]]
    return ", ".join(shown + ([f"and {len(paths) - limit} more"] if len(paths) > limit else []))


def _refuse_settled(workspace: Path, proposal: dict[str, Any], taking_instructions: bool = False) -> None:
    """An applied or rejected proposal is settled: apply (and apply --check) refuse it, saying which and what to do.
    An applied one whose instruction changes were left out still takes them, when asked to."""
    number = proposal["id"]
    if proposal["status"] == APPLIED and proposal.get("leftOut"):
        if taking_instructions:
            return
        raise StateError(
            f"proposal {number} was applied already, without its changes to files that steer an agent "
            f"({_listed(proposal['leftOut'])}); applying it again would change nothing",
            hint=f"Read them (`agentbox review {number}`); `agentbox apply {number} --include-instructions` takes "
            "them.",
        )
    if proposal["status"] == APPLIED:
        checkpoint = proposal.get("checkpoint")
        raise StateError(
            f"proposal {number} was applied already (at {proposal.get('applied', 'an earlier time')}); applying it "
            "again would change nothing",
            hint=(f"`agentbox undo {checkpoint}` returns the workspace to how it was before it. " if checkpoint
                  is not None else "") + "`agentbox proposals` lists the pending ones.",
        )
    if proposal["status"] == SUPERSEDED:
        _refuse_superseded(workspace, proposal)
    if proposal["status"] == REJECTED:
        with_later = (f" with proposal {proposal['rejectedWith']}, which superseded it"
                      if proposal.get("rejectedWith") is not None else "")
        raise StateError(
            f"proposal {number} was rejected{with_later} (at {proposal.get('rejected', 'an earlier time')}), and a "
            "rejected proposal is never applied; nothing was changed",
            hint=f"Its patch stays in {folder(workspace) / str(number)} to read. For these changes, run an "
            "isolated session again (its copy starts from your workspace as it is now) and apply that proposal.",
        )


def _refuse_superseded(workspace: Path, proposal: dict[str, Any]) -> None:
    """A superseded proposal's changes are in the one that superseded it: that one is applied (or rejected), never
    the earlier one, whose patch would bring back what the later one's fate settled."""
    number = proposal["id"]
    later = holder(workspace, proposal)
    if later is None:
        raise StateError(f"proposal {number} was superseded by a later proposal of the same copy, which is gone; a "
                         "superseded proposal is never applied; nothing was changed",
                         hint="Run an isolated session again for a proposal of your workspace as it is now.")
    other = later["id"]
    hint = {
        PENDING: f"`agentbox review {other}` shows proposal {other}; `agentbox apply {other}` applies it.",
        APPLIED: f"Proposal {other} was applied: its changes are in your workspace already.",
        REJECTED: f"Proposal {other} was rejected, and these changes with it. For them, run an isolated session "
                  "again and apply that proposal.",
    }.get(later["status"], "`agentbox proposals` lists the proposals.")
    raise StateError(
        f"proposal {number} was superseded by proposal {other} ({later['status']}), a later session of the same copy "
        "whose proposal holds these changes too; a superseded proposal is never applied; nothing was changed",
        hint=hint,
    )


def holder(workspace: Path, proposal: dict[str, Any], known: list[dict[str, Any]] | None = None
           ) -> dict[str, Any] | None:
    """The proposal that holds a superseded one's changes: the last of its chain of supersededBy (None: gone).
    `known`: the workspace's proposals, when the caller has read them."""
    by_id = {p["id"]: p for p in (known if known is not None else _all(workspace))}
    current, seen = proposal, {proposal["id"]}
    while current["status"] == SUPERSEDED:
        later = by_id.get(current.get("supersededBy"))
        if later is None or later["id"] in seen:
            return None
        current = later
        seen.add(current["id"])
    return current


def _write_tree(repo: Any, now: Any, result_tree: str) -> None:
    """Bring the workspace from the snapshot now to result_tree, writing only the files that differ."""
    todo = rewind.plan(repo, result_tree, now.tree, now.skipped, None, clean=True)
    result = restore.apply(repo.work_tree, todo.operations)
    if result.failures:
        shown = "; ".join(f"{visible(failure.path)}: {failure.reason}" for failure in result.failures[:5])
        raise StateError(f"some files of the proposal could not be written: {shown}",
                         hint="The checkpoint taken before applying it is kept: `agentbox undo` returns to it.")


def _checkpoint_before(workspace: Path, number: int, settings: CheckpointSettings) -> tuple[int, str]:
    """Taken whatever checkpoints.enabled says (that is about launches): `agentbox undo` can take the apply back.
    Returns its id and tree."""
    taken = checkpoints.take(workspace, "apply", settings, message=f"before applying proposal {number}")
    return taken.checkpoint.id, taken.checkpoint.tree


class Rejected(NamedTuple):
    proposal: dict[str, Any]
    superseded: list[int]  # the proposals it superseded, rejected with it


def reject(workspace: Path, wanted: str | None) -> Rejected:
    """Mark a proposal rejected (its files are kept), and with it the proposals it superseded (it holds their
    changes); the VM's copy is made anew at its next isolated session."""
    with locked(workspace):
        proposal = find(workspace, wanted)
        if proposal["status"] == APPLIED:
            raise StateError(f"proposal {proposal['id']} was applied already; rejecting it changes nothing",
                             hint=f"`agentbox undo {proposal.get('checkpoint')}` returns to the workspace as it "
                             "was before it.")
        if proposal["status"] != REJECTED:
            proposal = _update(workspace, proposal, status=REJECTED, rejected=isolation.now())
            append_event(workspace, "proposal_rejected", proposal=proposal["id"],
                         patchSha256=proposal.get("patchSha256"))
        known = _all(workspace)
        held = [earlier for earlier in known if earlier["status"] == SUPERSEDED
                and (holder(workspace, earlier, known) or {}).get("id") == proposal["id"]]
        for earlier in held:
            _update(workspace, earlier, status=REJECTED, rejected=isolation.now(), rejectedWith=proposal["id"])
            append_event(workspace, "proposal_rejected", proposal=earlier["id"],
                         patchSha256=earlier.get("patchSha256"), rejectedWith=proposal["id"])
        if proposal.get("vm"):
            # The copy holds what was just rejected (a later proposal of the same copy holds it too, so that one
            # stays pending, and is kept on the host): the next session starts from the workspace again.
            isolation.mark_fresh(workspace, proposal["vm"], proposal["base"]["commit"])
        return Rejected(proposal, [earlier["id"] for earlier in held])


def _short(commit: str | None) -> str:
    return commit[:12] if commit else "no commit"
