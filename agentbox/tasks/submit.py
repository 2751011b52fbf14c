"""`agentbox run`: hand a background task to the VM in one `limactl shell`, and return.

Every task starts as a launch does (agentbox.session.prepare: the config, the VM, the agent, the broker's
placeholders, decided once), with the steps a task skips named (`prepare.TASK`). A task in the live workspace
(`agentbox run`) goes to this machine's VM here; an isolated one (`--on local`, `--on HOST`) is a runtime Job
(agentbox.tasks.jobs) whatever the place.

The host records the task (Pending), takes its start checkpoint, writes its spec and prompt into the
task's folder in the VM's outbox, refreshes the staging folder like any launch, then runs launch.sh with
`--task DIR`: launch.sh prepares the session as usual and, instead of running the agent, starts
provision/task-runner.sh detached with the agent's non-interactive form (agents.py task_args, or
agents.NAME.taskArgs) and returns once the runner took the task. A warm VM costs that one `limactl shell` (no
`list`: the guest proves it is the VM the last launch checked, agentbox.session.warm; else `list` first).

The runner waits for a slot (tasks.maxConcurrent per VM; a task in the live tree also waits for any other
live-tree task), runs the agent in a session of its own with the prompt as its last argument, and maps a
timeout and `agentbox cancel` to TERM to its process group, then KILL after tasks.GRACE_SECONDS. A
`--worktree` task runs in a git worktree of its own (`.agentbox/worktrees/task-ID` in the workspace, ignored
through .git/info/exclude) on the branch `agentbox/task-ID`, made by the runner from the commit HEAD named
when the task was submitted; what it leaves uncommitted is committed on that branch when it ends. With
`--worktree NAME` it is `.agentbox/worktrees/NAME` on `agentbox/NAME`, used again when it exists (as
`agentbox AGENT --worktree NAME` does); tasks of one worktree never run side by side.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from agentbox import timing
from agentbox.agents.argv import agent_argv
from agentbox.agents.builtin import flag_subcommands, model_after
from agentbox.config.load import AgentConfig, Config
from agentbox.errors import AgentboxError, StateError
from agentbox.git import store
from agentbox.progress import warn
from agentbox.review import checkpoints, instructionfiles, quarantine
from agentbox.session import attention, canaries, detached, prepare, staging, warm, worktrees
from agentbox.tasks import activity, bundles, records
from agentbox.tasks.transitions import CANCELLED, FAILED, PENDING
from agentbox.vm import lifecycle


class TaskAsk(NamedTuple):
    """What `agentbox run` (or a session on a host) asks for."""

    agent: str
    prompt: bytes
    name: str | None = None
    timeout: int | None = None
    worktree: bool = False  # a live task in a git worktree of its own
    worktree_name: str | None = None  # `.agentbox/worktrees/NAME` (made, or used again); else `task-ID`
    session_argv: list[str] | None = None  # a session on a host: the agent's interactive form, run in tmux there


class Runner(NamedTuple):
    """What a task's runner (provision/task-runner.sh) is told beside the task itself."""

    slots: int  # tasks.maxConcurrent there
    workspace: Path
    base: str | None = None  # a worktree task's start commit
    events: Path | None = None  # where it leaves the task's end for this machine's watcher
    staged: bundles.Staged | None = None  # an isolated task's copy
    folders: str | None = None  # the VM whose outbox the runner writes its live marker to, when not the task's


def submit(control: lifecycle.VmControl, ask: TaskAsk) -> records.Task:
    """Record a task in the live workspace of this machine's VM and hand it over. Returns the record (Queued or
    Running when the VM took it). An isolated task is agentbox.tasks.jobs's."""
    agent = control.config.agent(ask.agent)
    launch = prepare.prepare(control, prepare.Ask(agent, steps=prepare.TASK))
    repo = store.find(launch.workspace)
    base = _worktree_base(ask, repo, launch.workspace)
    if launch.isolated:
        raise StateError(f"background tasks run in the live workspace, and {launch.vm_name} is isolated "
                         "(session.mode: isolated)",
                         hint="`agentbox run --on local` runs it on a copy of its own (isolated); or use a live "
                         "VM, where --worktree gives each task a checkout of its own.")
    instructions = instructionfiles.quarantined(control.config) if base is None else ()
    if instructions:  # as a launch does: what changed since the last check is yours or held, before the task runs
        quarantine.start(launch.workspace, instructions, activity.ProjectActivity.of(control.config), None)
    new = records.NewTask(launch.vm_name, launch.workspace, agent.name, task_argv(agent), launch.workdir, ask.prompt,
                          name=ask.name, timeout=ask.timeout, worktree=base,
                          worktree_name=ask.worktree_name if ask.worktree else None, instructions=instructions)
    task = records.create(new)
    handed(task, "the VM", lambda: _hand_over(launch, task, ask.prompt, base, repo))
    return records.refresh([task], check_vms=False)[0]


def _worktree_base(ask: TaskAsk, repo: store.Repo | None, workspace: Path) -> str | None:
    """The commit a `--worktree` task's branch starts from (HEAD); None without --worktree."""
    if not ask.worktree:
        return None
    if repo is None:
        raise StateError(f"--worktree needs a git work tree, and {workspace} is not one",
                         hint="Run `git init` and commit, or drop --worktree.")
    if ask.worktree_name is not None:
        worktrees.check_name(ask.worktree_name)
    worktrees.refuse_in_linked_worktree(repo)
    base = store.head(repo)
    if base is None:
        raise StateError("--worktree starts the task's branch at HEAD, and this repository has no commit yet",
                         hint="Commit once, then run the task again.")
    return base


def handed(task: records.Task, where: str, hand_over: Callable[[], object]) -> None:
    """Run the hand-over; a task it could not hand over to `where` ends Failed, with why."""
    try:
        hand_over()
    except BaseException as exc:
        with records.locked():
            record = records.get(task.id) or task
            if record.active and (record.remote_key is not None or (
                    record.state == PENDING and records.runner_state(record) is None)):
                message = exc.message if isinstance(exc, AgentboxError) else type(exc).__name__
                records.end(record, FAILED, f"it could not be handed to {where}: {message}")
        raise


def _hand_over(launch: prepare.Launch, task: records.Task, prompt: bytes, base: str | None,
               repo: store.Repo | None) -> None:
    start_checkpoint(launch, task, repo)
    # The task's marker keeps the VM's proxy (allowlist, offline) once this lease ends with the hand-over.
    with prepare.proxied(launch) as launch:
        reached = prepare.warm_reached(launch)
        if reached is None or not _stage_and_start(reached, task, prompt, base):
            _stage_and_start(prepare.listed_reached(launch), task, prompt, base)


def _stage_and_start(launch: prepare.Launch, task: records.Task, prompt: bytes, base: str | None) -> bool:
    """Stage the task and hand it to the VM's runner; False when a warm attempt ran nothing (take the slow path)."""
    config, vm_name, attempt = launch.config, launch.vm_name, launch.attempt
    assert attempt is not None
    with timing.phase("staging (credentials, env, guards, sync)"):
        refreshed = staging.refresh(launch, launch.instance, launch.lease.port if launch.lease else None)
        staging.stage_context(launch, refreshed, launch.instance, task.checkpoint)
    events = detached.events_folder(vm_name) if config.notify else None
    task_spec = spec(task, Runner(config.tasks_max_concurrent, launch.workspace, base, events))
    box = records.prepare_box(task, {"prompt": prompt, "spec": task_spec})
    now = records.get(task.id)
    if now is not None and now.state == CANCELLED:
        return True  # cancelled meanwhile (`agentbox cancel` of a Pending task): the VM never gets it
    command = staging.launch_command(launch, refreshed.folder, staging.LaunchOptions(task=box))
    planted = canaries.plant(vm_name, canaries.session_id(attempt.nonce))  # the task is a session of its own
    command += canaries.options(planted)
    shell = warm.argv(attempt, launch.workspace, task.cwd, [*command, "--", *task.argv])
    with timing.phase("in-VM setup + task runner (limactl shell)"):
        try:
            if attempt.mode == warm.PROVE:
                code, lima_said = launch.control.lima.shell_unlisted(vm_name, shell, stdin_data=b"")
                if warm.fell_back(attempt, code, lima_said):
                    return False
            else:
                code = launch.control.lima.shell(vm_name, shell, stdin_data=b"")
        finally:
            canaries.done(planted)  # placed by the launch step before it handed the task to its runner
    if code == 0 and events is not None:
        attention.ensure_watcher(vm_name)  # it shows the task's end, and ends itself after
    if code != 0:
        raise StateError(f"the VM did not take {task.label}: the launch step exited {code}",
                         hint="Its messages are above. `agentbox tasks` shows the task as Failed.")
    return True


def task_argv(agent: AgentConfig) -> list[str]:
    """The agent's non-interactive form, without the prompt (the runner appends it)."""
    task_args = list(agent.task_args)
    subcommands = flag_subcommands(agent.name) if agent.builtin else None
    if task_args and not task_args[0].startswith("-"):
        subcommands = (task_args[0],)
    return agent_argv(agent.binary, list(agent.default_args), task_args, agent.model,
                      model_after(agent.name, agent.default_args), subcommands)


def start_checkpoint(launch: prepare.Launch, task: records.Task, repo: store.Repo | None
                     ) -> tuple[str, str | None] | None:
    """The task's start checkpoint, recorded in the task; its (tree, HEAD), or None (checkpoints off, not git, or
    it failed: said)."""
    config: Config = launch.config
    if repo is None or not config.checkpoints.enabled:
        return None
    with timing.phase("start checkpoint"):
        try:
            taken = checkpoints.take(launch.workspace, "task", config.checkpoints, agent=task.agent,
                                     session=f"task-{task.id}", message=task.summary)
        except AgentboxError as exc:
            warn(f"{task.label} has no start checkpoint: {exc.message}")
            return None
    task.checkpoint = taken.checkpoint.id
    with records.locked():
        latest = records.get(task.id) or task
        latest.checkpoint = task.checkpoint
        records.save(latest)
    return taken.checkpoint.tree, taken.checkpoint.head


def spec(task: records.Task, runner: Runner) -> bytes:
    """The task's spec for its runner (provision/task-runner.sh)."""
    values: dict[str, str] = {"id": str(task.id), "max": str(runner.slots), "timeout": str(task.timeout or 0),
                              "grace": str(records.GRACE_SECONDS), "cwd": task.cwd, "agent": task.agent}
    if runner.events is not None:
        values["events"] = str(runner.events)
    values["live"] = str(detached.live_folder(runner.folders or task.vm))
    if task.worktree and runner.base:
        values.update(worktree=task.worktree, branch=task.branch or "", base=runner.base,
                      repo=str(runner.workspace))
    items = list(values.items())
    if runner.staged is not None:
        staged = runner.staged
        items += isolated_spec(staged, "sha1" if len(staged.base) == 40 else "sha256", runner.workspace, task.cwd)
    return b"".join(f"{key}={value}".encode("utf-8", "surrogateescape") + b"\0" for key, value in items)


def isolated_spec(staged: bundles.Staged, object_format: str, workspace: Path, cwd: str) -> list[tuple[str, str]]:
    """An isolated task's records of its spec (task-runner.sh): the bundles to fetch in order, the commit its copy
    starts from, the copy's folder name and the folder the agent starts in, inside it."""
    relative = os.path.relpath(cwd, workspace) if cwd == str(workspace) or cwd.startswith(f"{workspace}/") else "."
    return [("isolated", "1"), ("format", object_format), *(("bundle", name) for name in staged.bundles),
            ("base", staged.base), ("copy", workspace.name or "workspace"), ("subdir", relative)]
