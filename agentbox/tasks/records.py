"""Background tasks (`agentbox run`): their records on the host and what their runner in the VM reports.

A task's record lives in agentbox's state folder, `<state>/tasks/ID/` (paths.tasks_dir): `task.json`
(id, name, VM, workspace, agent, argv, folder, state, times, exit code, the transitions it went through,
its checkpoint, its worktree), `prompt`, and, once it ended, `stdout` and `stderr`. Nothing of it is in a
VM's folder, so it outlives the VM and `agentbox rm`. Ids are small integers, one counter per state
folder, handed out under a lock (`<state>/tasks/.lock`), so two `agentbox run` at once never share one.

While the task is handed to the VM, its runner (provision/task-runner.sh) works in the task's folder in
the VM's outbox, `<state>/vms/VM/outbox/tasks/ID/` (staging.py lists its files): the host reads the
runner's `state`, `heartbeat`, `stdout` and `stderr` there, as files the VM wrote (no link followed,
regular files only, the state file read up to a few KiB). No limactl call is needed to follow a task.
When agentbox sees a task ended, it moves the outputs into the record (a rename: a gigabyte of output
costs nothing) and removes the outbox folder.

The state machine is agentbox.tasks.transitions's. agentbox updates a record whenever a command looks at it
(`tasks`, `logs`, `wait`, `cancel`, `run`, `stop`, `rm`): the runner's state becomes the record's, and a
task whose VM is no longer running (one `limactl list` for all of them), or whose runner stopped beating,
becomes Failed with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import fsutil, lazyre, paths, vmread
from agentbox.errors import AgentboxError, StateError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.git import read, snapshot, store
from agentbox.progress import warn
from agentbox.review import checkpoints, migrate, proposals, quarantine
from agentbox.safetext import visible
from agentbox.session import endreport
from agentbox.tasks import recordcache, transitions
from agentbox.tasks.transitions import CANCELLED, ENDED, FAILED, PENDING, QUEUED, RUNNING
from agentbox.vm.lima import Lima

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.git.store import Repo

RECORD = "task.json"
PROMPT = "prompt"
OUTPUTS = ("stdout", "stderr")
LOCAL = "local"
CHANGES, SUMMARY = "changes.patch", "summary.md"  # an isolated task's, written by its runner before its end
MAX_STATE_BYTES = 4096
HEARTBEAT_STALE = 20.0  # seconds without a heartbeat before a Running task counts as lost
PENDING_STALE = 300.0  # a Pending task its `agentbox run` never handed over (that process died)
GRACE_SECONDS = 5  # between TERM and KILL when a task is cancelled or times out
WORKTREES = ".agentbox/worktrees"  # agentbox.session.worktrees.FOLDER; the runner adds /.agentbox/ to .git/info/exclude
_TIME = lazyre.compile(r"\d{1,12}(\.\d{1,9})?")
RUNNER_STATES = {"queued": QUEUED, "running": RUNNING, "completed": transitions.COMPLETED, "failed": FAILED,
                 "timeout": transitions.TIMEOUT, "cancelled": CANCELLED}


class UnknownTask(AgentboxError):
    exit_code = 2


@dataclass
class Task:
    id: int
    vm: str
    workspace: str
    agent: str
    argv: list[str]
    cwd: str
    state: str = PENDING
    name: str | None = None
    created: float = 0.0
    timeout: int | None = None  # seconds
    transitions: list[dict[str, Any]] = field(default_factory=list)  # {"state", "time"}
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    checkpoint: int | None = None
    base: str | None = None  # a worktree task: the commit its branch starts from
    worktree: str | None = None
    branch: str | None = None
    summary: str = ""  # the prompt's start, for listings
    harvested: bool = False  # outputs moved into the record
    host: str = LOCAL  # where it runs: "local" (this machine's VM) or a host's name (agentbox hosts)
    isolated: bool = False  # it works on a copy of the workspace; its changes come back as a proposal
    copy_base: dict[str, Any] | None = None  # an isolated task's base: {commit, tree, head} of agentbox's store
    proposal: int | None = None  # the proposal its changes became
    proposal_files: int | None = None  # how many files it changes
    outcome: str | None = None  # an isolated task's changes: "proposal N: ...", "no changes", or why none was made
    # A task on a remote host (agentbox.tasks.remote; its keeper, agentbox.tasks.keeper, updates these):
    remote_key: str | None = None  # its name there (its folder `outbox/tasks/KEY` in the VM's outbox there)
    handed: bool = False  # the host took it (else it waits for the host, Pending)
    seen: float | None = None  # when its host last answered for it
    unreachable_since: float | None = None  # the first failed look since its host last answered
    heartbeat_seen: float | None = None  # the runner's heartbeat as last read there (the host's clock)
    heartbeat_moved: float | None = None  # when (this machine's clock) that heartbeat was seen to move
    forward_port: int | None = None  # the host's port on which its VM reaches this machine's proxy (or None)
    forward_master: int | None = None  # the ssh master connection the forward was made on (a new one: make it again)
    forward_local: int | None = None  # this machine's proxy port it was made to
    session: bool = False  # an interactive session (`agentbox AGENT --on HOST --detach`): the agent in tmux there
    # The instruction files whose changes its end holds (agentbox.review.quarantine); empty when the quarantine is off
    instructions: list[str] = field(default_factory=list)

    @property
    def remote(self) -> bool:
        return self.host != LOCAL

    @property
    def job(self) -> bool:
        """Handed to its place as a runtime Job (an isolated task, here or on a host): its keeper follows it
        (agentbox.tasks.keeper) through the place's runtime; otherwise this machine reads its runner's folder."""
        return self.remote or self.remote_key is not None

    @property
    def settled(self) -> bool:
        """Ended, and its outputs (and changes) are home in the record: nothing more will happen to it."""
        return not self.active and self.harvested

    @property
    def label(self) -> str:
        return f"task {self.id}" + (f" ({self.name})" if self.name else "")

    @property
    def active(self) -> bool:
        return self.state in transitions.ACTIVE

    def to_json(self) -> dict[str, Any]:
        """The documented form (`agentbox tasks --json`)."""
        return {
            "id": self.id, "name": self.name, "state": self.state, "exitCode": self.exit_code,
            "reason": self.reason, "agent": self.agent, "vm": self.vm, "workspace": self.workspace,
            "cwd": self.cwd, "argv": list(self.argv), "prompt": self.summary, "timeoutSec": self.timeout,
            "created": iso(self.created), "started": iso(self.started), "ended": iso(self.ended),
            "transitions": [{"state": t["state"], "time": iso(t["time"])} for t in self.transitions],
            "checkpoint": self.checkpoint, "worktree": self.worktree, "branch": self.branch, "base": self.base,
            "stdout": str(output_path(self, "stdout")), "stderr": str(output_path(self, "stderr")),
            "host": self.host, "isolated": self.isolated, "proposal": self.proposal,
            "seen": iso(self.seen), "unreachableSince": iso(self.unreachable_since),
            "forwardPort": self.forward_port, "session": self.session,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Task:
        known = cls.__dataclass_fields__
        return cls(**{key: value for key, value in data.items() if key in known})

    @classmethod
    def restore(cls, fields: dict[str, Any]) -> Task:
        """A record from fields from_json accepted before (agentbox.tasks.recordcache's): the same Task, made
        without the dataclass's __init__, ten times cheaper for a listing of a thousand."""
        task = object.__new__(cls)
        values = dict(_DEFAULTS)
        values["transitions"] = []
        values["instructions"] = []
        values.update(fields)
        task.__dict__.update(values)
        return task


REQUIRED = frozenset(name for name, spec in Task.__dataclass_fields__.items()
                     if spec.default is MISSING and spec.default_factory is MISSING)
_DEFAULTS = {name: spec.default for name, spec in Task.__dataclass_fields__.items() if spec.default is not MISSING}


def iso(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


# -- the store --------------------------------------------------------------------------------------


def folder(task_id: int) -> Path:
    return paths.tasks_dir() / str(task_id)


def outbox_dir(task: Task) -> Path:
    """The task's folder in its VM's outbox, shared with the runner. The VM can replace anything in the
    outbox (with a link to a host folder, say), so the host reaches it only through _box: folder by
    folder, never following a link."""
    return paths.vm_outbox(task.vm) / "tasks" / str(task.id)


@contextlib.contextmanager
def _box(task: Task, *, fresh: bool = False) -> Iterator[int | None]:
    """A descriptor of the task's outbox folder (None when there is none, or a link stands there). fresh:
    make it anew, whatever the VM put in its place."""
    outbox = paths.vm_outbox(task.vm)
    with contextlib.ExitStack() as stack:
        box: int | None
        try:
            if fresh:
                with vmread.folder(outbox, "tasks", create=True) as tasks_fd:
                    vmread.remove(tasks_fd, str(task.id))
            box = stack.enter_context(vmread.folder(outbox, "tasks", str(task.id), create=fresh))
        except OSError:
            box = None
        yield box


def prepare_box(task: Task, files: dict[str, bytes]) -> Path:
    """Make the task's outbox folder anew and write the host's files into it; returns its path (for the VM)."""
    with _box(task, fresh=True) as box:
        if box is None:
            raise StateError(f"cannot make {task.label}'s folder in the outbox {paths.vm_outbox(task.vm)}")
        for name, data in files.items():
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=box)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
    return outbox_dir(task)


def _drop_box(task: Task) -> None:
    vmread.remove_folder(paths.vm_outbox(task.vm), outbox_dir(task))


@contextlib.contextmanager
def locked() -> Iterator[None]:
    with fsutil.locked(private_dir(paths.tasks_dir()) / ".lock"):
        yield


class NewTask(NamedTuple):
    """What a new task is made of."""

    vm_name: str
    workspace: Path
    agent: str
    argv: list[str]
    cwd: str
    prompt: bytes
    name: str | None = None
    timeout: int | None = None
    worktree: str | None = None  # the commit a worktree task's branch starts from (None: the live tree)
    worktree_name: str | None = None  # the worktree's name (`run --worktree NAME`), else `task-ID`
    host: str = LOCAL
    isolated: bool = False
    instructions: tuple[str, ...] = ()  # a live task's: the instruction files its end holds


def create(new: NewTask) -> Task:
    """A new Pending task with the next id, its prompt kept beside its record."""
    vm_name, workspace, agent, argv, cwd, prompt, name, timeout, worktree, worktree_name, host, isolated, held = new
    root = private_dir(paths.tasks_dir())
    with locked():
        try:
            number = int((root / "next").read_text())
        except (OSError, ValueError):
            number = max([int(p.name) for p in root.iterdir() if p.name.isdigit()], default=0) + 1
        while folder(number).exists():
            number += 1
        atomic_write(root / "next", f"{number + 1}\n", mode=0o600)
        now = time.time()
        task = Task(id=number, vm=vm_name, workspace=str(workspace), agent=agent, argv=argv, cwd=cwd, name=name,
                    created=now, timeout=timeout, transitions=[{"state": PENDING, "time": now}],
                    summary=_summary(prompt), host=host, isolated=isolated, instructions=list(held))
        if worktree:
            task.base = worktree
            label = worktree_name or f"task-{number}"
            task.branch = f"agentbox/{label}"
            task.worktree = str(workspace / WORKTREES / label)
        private_dir(folder(number))
        atomic_write(folder(number) / PROMPT, prompt, mode=0o600)
        save(task)
    return task


def _summary(prompt: bytes) -> str:
    text = prompt.decode("utf-8", "replace").strip()
    first = text.splitlines()[0] if text else ""
    return first[:77] + "..." if len(first) > 80 or "\n" in text else first


def save(task: Task) -> None:
    atomic_write(folder(task.id) / RECORD, json.dumps(asdict(task), indent=1) + "\n", mode=0o600)


def _load(task_id: int) -> Task | None:
    return _load_record(f"{folder(task_id)}/{RECORD}")


def _load_record(path: str) -> Task | None:
    """One task.json (a string path: a listing reads a thousand of them, and Path objects cost)."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read())
        return Task.from_json(data)
    except (OSError, ValueError, TypeError):
        return None


def get(task_id: int) -> Task | None:
    """The record of one task as it is now (None when there is none)."""
    return _load(task_id)


def all_tasks() -> list[Task]:
    """Every recorded task, by id. A record unchanged since the last listing comes from its cache
    (agentbox.tasks.recordcache); one that cannot be read is left out, and said so by name."""
    root = paths.tasks_dir()  # once per listing, not once per record: it can cost a platformdirs lookup
    try:
        names = [entry for entry in os.listdir(root) if entry.isdigit()]
    except FileNotFoundError:
        return []
    cached = recordcache.read(root)
    seen: recordcache.Entries = {}
    found = []
    for name in names:
        path = f"{root}/{name}/{RECORD}"  # a string: a listing reads a thousand of them, and Path objects cost
        try:
            signature = recordcache.signature(os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            continue  # a task being made (its folder comes first), or one being removed
        except OSError as exc:
            _unreadable(name, path, exc.strerror or str(exc))
            continue
        entry = cached.get(name)
        if entry is not None and entry[0] == signature and entry[1].keys() >= REQUIRED:
            fields = entry[1]
        else:
            read_fields = _read_record(name, path)
            if read_fields is None:
                continue
            signature, fields = read_fields
        seen[name] = (signature, fields)
        found.append(Task.restore(fields))
    if seen.keys() != cached.keys() or any(seen[name][0] != cached[name][0] for name in seen):
        recordcache.write(root, seen)
    return sorted(found, key=lambda task: task.id)


def _read_record(name: str, path: str) -> tuple[recordcache.Signature, dict[str, Any]] | None:
    """One task.json, checked (None, and a warning that names it, when it is not a task record): its signature
    as it was read, and its fields."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _unreadable(name, path, exc.strerror or str(exc))
        return None
    try:
        signature = recordcache.signature(os.fstat(fd))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = json.loads(handle.read())
        Task.from_json(data)
    except ValueError:
        _unreadable(name, path, "it is not valid JSON")
        return None
    except (TypeError, AttributeError):
        _unreadable(name, path, "it is not a task record (a field is missing or of the wrong kind)")
        return None
    except OSError as exc:
        _unreadable(name, path, exc.strerror or str(exc))
        return None
    finally:
        os.close(fd)
    return signature, {key: value for key, value in data.items() if key in Task.__dataclass_fields__}


def _unreadable(name: str, path: str, why: str) -> None:
    warn(f"task {name}'s record {visible(path)} cannot be read: {why}; it is left out of the tasks "
         f"(remove the folder {visible(os.path.dirname(path))} to forget it)")


def lookup(spec: str, candidates: list[Task] | None = None) -> Task:
    """The task a user named, by id or by its --name (when only one task has it)."""
    tasks = candidates if candidates is not None else all_tasks()
    if spec.isdigit():
        for task in tasks:
            if task.id == int(spec):
                return task
    else:
        named = [task for task in tasks if task.name == spec]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise UnknownTask(f"{len(named)} tasks are named {spec!r} (ids {', '.join(str(t.id) for t in named)})",
                              hint="Name the task by its id.")
    raise UnknownTask(f"there is no task {visible(spec)!r}",
                      hint="`agentbox tasks --all` lists the recorded tasks (ids and names).")


def advance(task: Task, new: str, at: float | None = None, **fields: Any) -> None:
    """Move the record to `new` (refused unless taskstate allows it), noting when."""
    transitions.check(task.state, new, task.label)
    stamp = time.time() if at is None else at
    task.state = new
    task.transitions.append({"state": new, "time": stamp})
    if new == RUNNING and task.started is None:
        task.started = stamp
    if new in ENDED:
        task.ended = stamp
    for key, value in fields.items():
        setattr(task, key, value)


# -- what the runner reports --------------------------------------------------------------------------


def _open_file(box: int, name: str) -> int | None:
    """A file the VM wrote, opened for reading: a regular file, never through a link (else None)."""
    try:
        return vmread.open_regular(box, name)[0]
    except vmread.Refused:
        return None


def runner_state(task: Task) -> dict[str, Any] | None:
    """The runner's state file, checked: a known state, numbers as numbers, the reason as text."""
    with _box(task) as box:
        data = vmread.read(box, "state", MAX_STATE_BYTES) if box is not None else None
    return parse_runner_state(data) if data is not None else None


def parse_runner_state(data: bytes) -> dict[str, Any] | None:
    """A runner's state file (what the VM wrote), checked: a known state, numbers as numbers, the reason as text."""
    if len(data) > MAX_STATE_BYTES:
        return None
    fields: dict[str, Any] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition("=")
        if key == "state" and value in RUNNER_STATES:
            fields["state"] = RUNNER_STATES[value]
        elif key == "exit" and value.lstrip("-").isdigit() and len(value) < 6:
            fields[key] = int(value)
        elif key in ("queued_at", "started_at", "ended_at") and _TIME.fullmatch(value):
            fields[key] = float(value)
        elif key == "reason":
            fields["reason"] = value[:300]
    return fields if "state" in fields else None


def heartbeat(task: Task) -> float | None:
    """When the runner last said it was alive (the heartbeat file's time)."""
    with _box(task) as box:
        if box is None:
            return None
        try:
            st = os.stat("heartbeat", dir_fd=box, follow_symlinks=False)
        except OSError:
            return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def apply_runner(task: Task) -> bool:
    """Bring an active record up to the runner's state. Returns whether it changed."""
    seen = runner_state(task)
    return seen is not None and apply_seen(task, seen)


def apply_seen(task: Task, seen: dict[str, Any]) -> bool:
    """Bring an active record up to a runner's state (parse_runner_state's). Returns whether it changed."""
    if seen["state"] == task.state:
        return False
    steps = transitions.path_to(task.state, seen["state"])
    if not steps:
        return False  # the runner says something the record cannot become (an ended task stays ended)
    times = {QUEUED: seen.get("queued_at"), RUNNING: seen.get("started_at")}
    for step in steps:
        at = times.get(step) if step in times else seen.get("ended_at")
        advance(task, step, float(at) if at is not None else None)
    if task.state in ENDED:
        task.exit_code = seen.get("exit")
        task.reason = seen.get("reason") or None
    return True


def vm_statuses(names: Iterable[str]) -> dict[str, str | None]:
    """The Lima status of each VM (None: it does not exist), from one `limactl list`."""
    listed = Lima().instances()
    return {name: (listed[name].status if name in listed else None) for name in names}


def refresh(tasks: list[Task], *, check_vms: bool = True) -> list[Task]:
    """Update every active task from its runner (and, when check_vms, its VM's status: at most one limactl
    call); ended tasks get their outputs moved into the record. Returns the tasks, updated."""
    updated = list(tasks)
    # A Job's record is its keeper's to update (agentbox.tasks.keeper): nothing here reads it.
    pending = [index for index, task in enumerate(updated)
               if not task.job and not task.settled]
    if not pending:
        return updated
    with locked():
        for index in pending:
            fresh = _load(updated[index].id) or updated[index]
            if fresh.active and apply_runner(fresh):
                save(fresh)
            updated[index] = fresh
    still = [task for task in updated if task.active]
    statuses: dict[str, str | None] = {}
    if still and check_vms:
        statuses = vm_statuses({task.vm for task in still})
    now = time.time()
    with locked():
        for index in pending:
            task = _load(updated[index].id) or updated[index]  # another agentbox may have moved it on
            if task.active:
                why = _lost(task, statuses.get(task.vm, "Running") if check_vms else "Running", now)
                if why:
                    end(task, FAILED, why)
            if task.state in ENDED and not task.harvested:
                harvest(task)
            updated[index] = task
    return updated


def _lost(task: Task, vm_status: str | None, now: float) -> str | None:
    """Why an active task can no longer end by itself, or None."""
    if task.state == PENDING:
        if now - task.created > PENDING_STALE and runner_state(task) is None:
            return "it was never handed to the VM (the `agentbox run` that made it stopped)"
        return None
    if vm_status is None:
        return f"its VM {task.vm} no longer exists"
    if vm_status != "Running":
        return f"its VM {task.vm} stopped ({vm_status}) while the task was {task.state.lower()}"
    beat = heartbeat(task)
    if beat is not None and now - beat > HEARTBEAT_STALE:
        return f"its runner in the VM stopped answering {int(now - beat)} s ago (the VM restarted?)"
    return None


def end(task: Task, state: str, reason: str) -> None:
    """End an active task from the host (the runner cannot say it any more), and save it."""
    steps = transitions.path_to(task.state, state)
    for step in steps[:-1]:
        advance(task, step)
    advance(task, state, reason=reason)
    save(task)


def harvest(task: Task) -> None:
    """Move the outputs from the outbox into the record (a rename), then drop the outbox folder. Call locked."""
    target = folder(task.id)
    with _box(task) as box:
        if task.isolated and task.outcome is None:
            _take_changes_from(task, box)
        for name in OUTPUTS:
            moved = False
            if box is not None:
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.stat(name, dir_fd=box, follow_symlinks=False).st_mode):
                        os.replace(name, target / name, src_dir_fd=box)
                        moved = True
                if moved and not stat.S_ISREG(os.lstat(target / name).st_mode):
                    (target / name).unlink()  # the VM swapped it after the look: not an output agentbox keeps
                    moved = False
            if not moved and not os.path.lexists(target / name):
                atomic_write(target / name, b"", mode=0o600)
    _drop_box(task)
    held = _hold_instructions(task)
    task.harvested = True
    save(task)
    report(task, held)


def _hold_instructions(task: Task) -> list[quarantine.Held]:
    """A live task's changes to the instruction files, held as a session's end holds them (the workspace gets the
    approved version back); said as loudly. A worktree task's checkout and an isolated task's copy are not the
    workspace: their changes come back as a branch or a proposal."""
    if task.isolated or task.remote or task.worktree or not task.instructions:
        return []
    outcome = quarantine.end(Path(task.workspace), tuple(task.instructions), None, f"{task.label} in {task.vm}")
    quarantine.report(outcome, task.label)
    return outcome.newly


def report(task: Task, held: Sequence[quarantine.Held] = ()) -> None:
    """The ended task's signed report (agentbox.session.endreport), once its outputs and changes are home."""
    facts = endreport.Facts("task", task.agent, task.vm, task.workspace, task.isolated, None, task=task.id)
    record = endreport.draft(facts, endreport.iso(task.started or task.created) or "", task.exit_code,
                             held_instructions=held)
    record.update(state=task.state, ended=endreport.iso(task.ended) or record["ended"], reason=task.reason)
    record["checkpoints"]["start"] = task.checkpoint
    if task.proposal is not None:
        record["proposal"] = {"id": task.proposal, "files": task.proposal_files}
    endreport.write(record)


def _take_changes_from(task: Task, box: int | None) -> None:
    """An isolated task's changes.patch and summary.md, read from its outbox folder (vmread's rules: no link,
    regular files, capped), made a proposal."""
    patch = summary = None
    problem = None
    if box is not None:
        try:
            patch = vmread.read_at(box, CHANGES, proposals.MAX_PATCH)
            summary = vmread.read_at(box, SUMMARY, proposals.MAX_SUMMARY)
        except vmread.Refused as refused:
            patch, problem = None, refused.message
    take_changes(task, patch, summary, problem)


def take_changes(task: Task, patch: bytes | None, summary: bytes | None, problem: str | None = None) -> None:
    """An ended isolated task's changes, as bytes (from its local outbox folder, or fetched from a remote host):
    a non-empty patch becomes a proposal whose base is the task's; the record notes which (or why there is
    none). Call locked; the caller saves the record."""
    if problem is not None:
        task.outcome = f"its changes were not taken: {problem}"
        return
    if patch is None:
        task.outcome = "no changes (the task left no patch)" if task.state != CANCELLED else "no changes (cancelled)"
        return
    if not patch:
        task.outcome = "no changes"
        return
    if not task.copy_base:
        task.outcome = "its changes were not taken: the task has no recorded base"
        return
    try:
        made = proposals.store_task(Path(task.workspace), task.id, task.agent, task.vm, task.copy_base, patch,
                                    summary)
    except (AgentboxError, OSError) as exc:
        kept = folder(task.id) / CHANGES
        atomic_write(kept, patch, mode=0o600)
        message = exc.message if isinstance(exc, AgentboxError) else str(exc)
        task.outcome = f"its changes could not be made a proposal ({message}); the patch is kept at {kept}"
        return
    task.proposal, task.proposal_files = made.proposal, made.files
    task.outcome = str(made)


def output_path(task: Task, name: str) -> Path:
    """Where the task's stdout or stderr is now: the record once moved there, else the runner's folder."""
    kept = folder(task.id) / name
    return kept if task.harvested or kept.exists() else outbox_dir(task) / name


def open_output(task: Task, name: str) -> int | None:
    """A read descriptor on the output (regular file, no link followed), or None when there is none yet."""
    try:
        with vmread.folder(folder(task.id)) as record:
            fd = _open_file(record, name)
    except OSError:
        fd = None
    if fd is not None:
        return fd
    with _box(task) as box:
        return _open_file(box, name) if box is not None else None


def settle_vm(vm_name: str, reason: str) -> list[Task]:
    """The VM is going away (stop, rm): its tasks take their last state from their runners; those still
    active become Failed with `reason`, and every output is moved into its record."""
    mine = [task for task in all_tasks()
            if task.vm == vm_name and not task.remote and not task.settled]  # a local Job's key is its id
    if not mine:
        return []
    updated = refresh(mine, check_vms=False)
    ended = []
    with locked():
        for task in updated:
            task = _load(task.id) or task
            if task.active:
                end(task, FAILED, reason)
                ended.append(task)
            if not task.harvested:
                harvest(task)
    return ended


def request_cancel(task: Task) -> None:
    """Ask the runner to stop the task (it checks several times a second); a task still Pending on the
    host is simply Cancelled."""
    with locked():
        fresh = _load(task.id) or task
        if fresh.state == PENDING and runner_state(fresh) is None:
            end(fresh, CANCELLED, "cancelled before it reached the VM")
            return
    with _box(task) as box:
        if box is not None:
            with contextlib.suppress(OSError):
                os.close(os.open("cancel", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                 dir_fd=box))


def remove_worktree(task: Task) -> str | None:
    """Remove the task's worktree folder, never through a link and only where agentbox made it; the branch
    stays. Returns what was removed, or None."""
    if not task.worktree:
        return None
    workspace = Path(task.workspace)
    path = Path(task.worktree)
    expected = workspace / WORKTREES / f"task-{task.id}"
    if path != expected or os.path.realpath(path.parent) != str(path.parent):
        return None
    removed = None
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        removed = str(path)
    # git's own note of it, <common>/worktrees/task-ID, stays: agentbox writes nothing under a workspace's
    # git folder (git drops a note whose folder is gone at its next `git worktree prune` or gc).
    return removed


def prune(tasks: list[Task]) -> list[Task]:
    """Drop the records of ended tasks (outputs included) and their worktrees; the branches stay."""
    gone = []
    with locked():
        for task in tasks:
            fresh = _load(task.id) or task
            if fresh.active:
                continue
            remove_worktree(fresh)
            _drop_box(fresh)
            shutil.rmtree(folder(fresh.id), ignore_errors=True)
            gone.append(fresh)
    return gone


def of_workspace(tasks: list[Task], workspace: Path) -> list[Task]:
    return [task for task in tasks if task.workspace == str(workspace)]


def parse_duration(text: str) -> int:
    """`90`, `90s`, `10m`, `1h30m`, `2h` -> seconds (at least 1). ValueError when malformed."""
    spec = text.strip()
    if spec.isdigit():
        seconds = int(spec)
    else:
        match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", spec)
        if not spec or match is None or not any(match.groups()):
            raise ValueError(f"{text!r} is not a duration (examples: 90, 90s, 10m, 1h30m)")
        hours, minutes, secs = (int(part) if part else 0 for part in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds < 1:
        raise ValueError(f"{text!r} is not a duration of at least one second")
    return seconds


def diff_range(config: Config, spec: str) -> tuple[Repo, str, str, list[tuple[str, int]]]:
    """What `agentbox diff --since task:ID` compares: (repository, the task's start tree, the tree now, files
    left out for their size). A worktree task: its branch's start commit against its worktree as it is."""
    task = lookup(spec)
    if task.worktree:
        repo = store.find(Path(task.worktree))
        if repo is None or not task.base:
            raise StateError(f"{task.label}'s worktree {task.worktree} is gone",
                             hint=f"Its work is on the branch {task.branch}: `git diff {task.base} {task.branch}`.")
        try:
            base_tree = migrate.import_commit(repo, task.base)
        except read.GitReadError as exc:
            raise StateError(f"{task.label}'s start commit {task.base} cannot be read from the repository: "
                             f"{exc.message}") from None
        now = snapshot.take(repo, config.checkpoints.max_file_size)
        old_side = [change.old_oid for change in store.changes(repo, base_tree, now.tree)
                    if change.status != "A" and change.old_mode != "160000"]
        try:
            migrate.import_blobs(repo, old_side)
        except read.GitReadError as exc:
            raise StateError(f"{task.label}'s start commit {task.base} cannot be read from the repository: "
                             f"{exc.message}") from None
        return repo, base_tree, now.tree, now.skipped
    workspace = config.require_workspace()
    if task.workspace != str(workspace):
        raise StateError(f"{task.label} ran in another workspace, {task.workspace}",
                         hint=f"Run `agentbox -C {task.workspace} diff --since task:{task.id}`.")
    if task.checkpoint is None:
        raise StateError(f"{task.label} has no start checkpoint (checkpoints were off, or it failed)")
    start = checkpoints.lookup(workspace, str(task.checkpoint))
    now = checkpoints.current(workspace, config.checkpoints)
    skipped = dict(start.skipped)
    skipped.update(now.skipped)
    return checkpoints.repo_of(workspace), start.tree, now.tree, sorted(skipped.items())
