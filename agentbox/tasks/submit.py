"""`agentbox run`: hand a background task to the VM in one `limactl shell`, and return.

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
from pathlib import Path

from agentbox import paths, timing
from agentbox.agents.builtin import agent_argv, flag_subcommands, model_after
from agentbox.config.load import AgentConfig, Config
from agentbox.errors import AgentboxError, StateError
from agentbox.git import store as hostgit
from agentbox.progress import warn
from agentbox.review import checkpoints
from agentbox.session import attention, bootstrap, brokersetup, staging, warm
from agentbox.session import detached as sessions
from agentbox.session.launch import workdir_for
from agentbox.tasks import bundles as taskbundles
from agentbox.tasks import records as tasks
from agentbox.tasks.transitions import CANCELLED, FAILED
from agentbox.vm import lifecycle as vm
from agentbox.vm import state as vmstate
from agentbox.vm import verified, workmode
from agentbox.vm.lima import Instance


def task_argv(agent: AgentConfig) -> list[str]:
    """The agent's non-interactive form, without the prompt (the runner appends it)."""
    task_args = list(agent.task_args)
    subcommands = flag_subcommands(agent.name) if agent.builtin else None
    if task_args and not task_args[0].startswith("-"):
        subcommands = (task_args[0],)
    return agent_argv(agent.binary, list(agent.default_args), task_args, agent.model,
                      model_after(agent.name, agent.default_args), subcommands)


def submit(session: vm.VmControl, agent_name: str, prompt: bytes, *, name: str | None, timeout: int | None,
           worktree: bool, worktree_name: str | None = None, place: str | None = None) -> tasks.Task:
    """Record the task and hand it to the VM. Returns the record (Queued or Running when the VM took it).
    `worktree_name`: the worktree `.agentbox/worktrees/NAME` (made, or used again), else `task-ID`.
    `place`: an isolated task (`run --on local`): the agent works on a copy of the workspace in the VM, and what
    it changed comes back as a proposal; None: the task runs in the live workspace."""
    config = session.config
    workspace = config.require_workspace()
    agent = config.agent(agent_name)
    repo = hostgit.find(workspace)
    if place is not None:
        return _submit_isolated(session, agent, prompt, name=name, timeout=timeout, place=place, repo=repo)
    if worktree and repo is None:
        raise StateError(f"--worktree needs a git work tree, and {workspace} is not one",
                         hint="Run `git init` and commit, or drop --worktree.")
    if worktree and repo is not None:
        from agentbox.session import worktrees

        if worktree_name is not None:
            worktrees.check_name(worktree_name)
        worktrees.refuse_in_linked_worktree(repo)
    base = hostgit.head(repo) if worktree and repo is not None else None
    if worktree and base is None:
        raise StateError("--worktree starts the task's branch at HEAD, and this repository has no commit yet",
                         hint="Commit once, then run the task again.")
    vm_mode = workmode.mode_of_vm(vm.expected_config(agent.vm_name, vmstate.read(agent.vm_name)), workspace)
    if workmode.ISOLATED in (vm_mode, config.session_mode):
        raise StateError(f"background tasks run in the live workspace, and {agent.vm_name} is isolated "
                         "(session.mode: isolated)",
                         hint="`agentbox run --on local` runs it on a copy of its own (isolated); or use a live "
                         "VM, where --worktree gives each task a checkout of its own.")
    cwd = workdir_for(config.cwd, workspace)
    task = tasks.create(agent.vm_name, workspace, agent.name, task_argv(agent), cwd, prompt, name=name,
                        timeout=timeout, worktree=base, worktree_name=worktree_name if worktree else None)
    return _handed(session, agent, task, prompt, base, repo)


def _submit_isolated(session: vm.VmControl, agent: AgentConfig, prompt: bytes, *, name: str | None,
                     timeout: int | None, place: str, repo: hostgit.Repo | None) -> tasks.Task:
    config = session.config
    workspace = config.require_workspace()
    if place != tasks.LOCAL:
        raise StateError(f"there is no host {place!r} to run the task on",
                         hint="`--on local` runs it isolated in this machine's VM.")
    if repo is None:
        raise workmode.not_a_git_work_tree(workspace)
    cwd = workdir_for(config.cwd, workspace)
    task = tasks.create(agent.vm_name, workspace, agent.name, task_argv(agent), cwd, prompt, name=name,
                        timeout=timeout, worktree=None, host=place, isolated=True)
    return _handed(session, agent, task, prompt, None, repo)


def _handed(session: vm.VmControl, agent: AgentConfig, task: tasks.Task, prompt: bytes, base: str | None,
            repo: hostgit.Repo | None) -> tasks.Task:
    try:
        _hand_over(session, agent, task, prompt, base, repo)
    except BaseException as exc:
        with tasks.locked():
            record = tasks.get(task.id) or task
            if record.state == tasks.PENDING and tasks.runner_state(record) is None:
                message = exc.message if isinstance(exc, AgentboxError) else type(exc).__name__
                tasks.end(record, FAILED, f"it could not be handed to the VM: {message}")
        raise
    return tasks.refresh([task], check_vms=False)[0]


def _hand_over(session: vm.VmControl, agent: AgentConfig, task: tasks.Task, prompt: bytes, base: str | None,
               repo: hostgit.Repo | None) -> None:
    config = session.config
    workspace = config.require_workspace()
    start = start_checkpoint(config, agent, task, repo)
    staged = stage_copy(config, task, repo, start, taskbundles.place_name("local", task.vm),
                        paths.staging_dir(task.vm) / taskbundles.FOLDER) if task.isolated else None
    scripts = bootstrap.plan(config, str(paths.staging_dir(agent.vm_name)))
    brokering = brokersetup.prepare(config, agent.vm_name, agent.name)
    cached = warm.usable(config, agent.vm_name, workspace)
    if cached is not None:  # no `limactl list`: the guest proves it is the VM agentbox checked (agentbox.session.warm)
        lease = brokersetup.begin_proxy(config, agent.vm_name, {agent.name: agent.endpoints})
        try:
            if _stage_and_start(session, agent, task, prompt, base, workspace, scripts, cached.instance,
                                lease.port if lease is not None else None, brokering,
                                warm.prove(agent.vm_name, cached.token), staged):
                return
        finally:
            if lease is not None:
                lease.release()
    with timing.phase("VM state (limactl list, start)"):
        instance = vm.ensure_running(session, agent.vm_name)
    token = verified.record(agent.vm_name, instance)
    # The task's marker keeps the VM's proxy (allowlist, offline) once this lease ends with the hand-over.
    lease = brokersetup.begin_proxy(config, agent.vm_name, {agent.name: agent.endpoints})
    try:
        _stage_and_start(session, agent, task, prompt, base, workspace, scripts, instance,
                         lease.port if lease is not None else None, brokering, warm.record(agent.vm_name, token),
                         staged)
    finally:
        if lease is not None:
            lease.release()


def start_checkpoint(config: Config, agent: AgentConfig, task: tasks.Task,
                     repo: hostgit.Repo | None) -> tuple[str, str | None] | None:
    """The task's start checkpoint, recorded in the task; its (tree, HEAD), or None (checkpoints off, not git, or
    it failed: said)."""
    if repo is None or not config.checkpoints.enabled:
        return None
    with timing.phase("start checkpoint"):
        try:
            taken = checkpoints.take(config.require_workspace(), "task", config.checkpoints, agent=agent.name,
                                     session=f"task-{task.id}", message=task.summary)
        except AgentboxError as exc:
            warn(f"{task.label} has no start checkpoint: {exc.message}")
            return None
    task.checkpoint = taken.checkpoint.id
    with tasks.locked():
        latest = tasks.get(task.id) or task
        latest.checkpoint = task.checkpoint
        tasks.save(latest)
    return taken.checkpoint.tree, taken.checkpoint.head


def stage_copy(config: Config, task: tasks.Task, repo: hostgit.Repo | None, start: tuple[str, str | None] | None,
               place: str, folder: Path) -> taskbundles.Staged:
    """An isolated task's base (its start checkpoint's tree, or the workspace's as it is when checkpoints are off)
    as bundles in `folder` (the place's staging folder's bundles/, or this machine's mirror of a remote one);
    recorded as the task's base."""
    from agentbox.git import snapshot

    if repo is None:
        raise workmode.not_a_git_work_tree(config.require_workspace())
    with timing.phase("the task's copy (git bundle)"):
        if start is None:
            snap = snapshot.take(repo, config.checkpoints.max_file_size)
            start = (snap.tree, snap.head)
        tree, head = start
        others = [other for other in tasks.all_tasks() if other.vm == task.vm and other.host == task.host
                  and other.isolated and other.active and other.id != task.id]
        staged = taskbundles.stage(repo, place, tree, folder, tidy=not others)
    with tasks.locked():
        latest = tasks.get(task.id) or task
        latest.copy_base = task.copy_base = {"commit": staged.base, "tree": tree, "head": head}
        tasks.save(latest)
    return staged


def _stage_and_start(session: vm.VmControl, agent: AgentConfig, task: tasks.Task, prompt: bytes, base: str | None,
                     workspace: Path, scripts: bootstrap.Plan, instance: Instance, proxy_port: int | None,
                     brokering: brokersetup.Brokered | None, attempt: warm.Attempt,
                     staged: taskbundles.Staged | None = None) -> bool:
    """Stage the task and hand it to the VM's runner; False when a warm attempt ran nothing (take the slow path)."""
    config = session.config
    with timing.phase("staging (credentials, env, guards, sync)"):
        refreshed = staging.refresh(config, agent.vm_name, agent, scripts, instance, proxy_port,
                                    brokering.prepared if brokering is not None else None,
                                    brokering.authority if brokering is not None else None)
        staging.stage_context(config, agent.vm_name, agent, refreshed, instance,
                              "isolated" if task.isolated else "live", task.checkpoint)
    events = sessions.events_folder(agent.vm_name) if config.notify else None
    task_spec = spec(task, config.tasks_max_concurrent, base, workspace, events, staged)
    box = tasks.prepare_box(task, {"prompt": prompt, "spec": task_spec})
    now = tasks.get(task.id)
    if now is not None and now.state == CANCELLED:
        return True  # cancelled meanwhile (`agentbox cancel` of a Pending task): the VM never gets it
    command = staging.launch_command(config, workspace, scripts, agent, refreshed.folder, task=box,
                                     isolated_task=task.isolated, vm_name=agent.vm_name)
    command += ["--", *task.argv]
    # An isolated task never needs the workspace in the VM (an isolated VM may have no copy of it yet).
    shell = warm.argv(attempt, workspace, "/" if task.isolated else task.cwd, command)
    with timing.phase("in-VM setup + task runner (limactl shell)"):
        if attempt.mode == warm.PROVE:
            code, lima_said = session.lima.shell_unlisted(agent.vm_name, shell, stdin_data=b"")
            if warm.fell_back(attempt, code, lima_said):
                return False
        else:
            code = session.lima.shell(agent.vm_name, shell, workdir="/" if task.isolated else None, stdin_data=b"")
    if code == 0 and events is not None:
        attention.ensure_watcher(agent.vm_name)  # it shows the task's end, and ends itself after
    if code != 0:
        raise StateError(f"the VM did not take {task.label}: the launch step exited {code}",
                         hint="Its messages are above. `agentbox tasks` shows the task as Failed.")
    return True


def spec(task: tasks.Task, max_concurrent: int, base: str | None, workspace: Path, events: Path | None,
         staged: taskbundles.Staged | None = None, folders_of: str | None = None) -> bytes:
    """The task's spec for its runner (provision/task-runner.sh). `folders_of`: the VM whose outbox the runner
    writes its live marker to, when not the task's (a remote task: this machine's mirror of the remote VM's)."""
    values: dict[str, str] = {"id": str(task.id), "max": str(max_concurrent), "timeout": str(task.timeout or 0),
              "grace": str(tasks.GRACE_SECONDS), "cwd": task.cwd, "agent": task.agent}
    if events is not None:
        values["events"] = str(events)
    values["live"] = str(sessions.live_folder(folders_of or task.vm))
    if task.worktree and base:
        values.update(worktree=task.worktree, branch=task.branch or "", base=base, repo=str(workspace))
    records = list(values.items())
    if staged is not None:
        records += isolated_spec(staged, "sha1" if len(staged.base) == 40 else "sha256", workspace, task.cwd)
    return b"".join(f"{key}={value}".encode("utf-8", "surrogateescape") + b"\0" for key, value in records)


def isolated_spec(staged: taskbundles.Staged, object_format: str, workspace: Path, cwd: str) -> list[tuple[str, str]]:
    """An isolated task's records of its spec (task-runner.sh): the bundles to fetch in order, the commit its copy
    starts from, the copy's folder name and the folder the agent starts in, inside it."""
    relative = os.path.relpath(cwd, workspace) if cwd == str(workspace) or cwd.startswith(f"{workspace}/") else "."
    return [("isolated", "1"), ("format", object_format), *(("bundle", name) for name in staged.bundles),
            ("base", staged.base), ("copy", workspace.name or "workspace"), ("subdir", relative)]
