"""An isolated task (`agentbox run --on PLACE`, a session `--on HOST --detach`): a runtime Job, whatever the place.

The place is a runtime (agentbox.runtime.place): `local` is this machine's VM, any other name a host added with
`agentbox hosts add`. The task is the same everywhere: its start checkpoint goes as git bundles of agentbox's
store (a delta when the place holds an earlier one, agentbox.tasks.bundles), the agent works on a copy in the
project's VM there, and its changes come back as a proposal. What differs is only what the runtime says:

- which VM: this machine's project VM, or one on the host named for the provisioning it is built from;
- where the job's files are written first (`mirror`): the VM's own staging folder and outbox here, or this
  machine's mirror of the remote VM's, `<state>/vms/VM.on-HOST/{staging,outbox}`, whose files the job carries;
- what the VM may be given: a host's VM gets only the credential broker's placeholders and reaches the broker on
  this machine over an ssh reverse forward (agentbox.tasks.hostlogins); an agent whose login would have to be
  staged there is refused before anything is made;
- how a missing VM is made: agentbox's lifecycle here (reached as a launch is: a warm proof, or `list` and a
  start), its own template there (vm.render.render_remote).

The hand-over is one `submit` of the job (one `limactl shell` here on a warm VM; one ssh round trip to a host).
A host that does not answer leaves the task Pending ("waiting for HOST"). Either way the task's keeper
(agentbox.tasks.keeper, a detached process per task) follows it from then on, and brings the outputs and the
proposal home.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox import paths, runtime, timing
from agentbox.config.load import Config
from agentbox.git import snapshot, store
from agentbox.progress import note
from agentbox.runtime.contract import Job, Runtime
from agentbox.session import attention, brokersetup, detached, prepare, staging, warm
from agentbox.tasks import bundles, hostlogins, keeper, records
from agentbox.tasks.submit import Runner, TaskAsk, handed, spec, start_checkpoint, task_argv
from agentbox.vm import lifecycle, workmode


def submit(control: lifecycle.VmControl, ask: TaskAsk, place: str) -> records.Task:
    """Record the isolated task, make its job and hand it to the place (or leave it waiting for a host that does
    not answer); start its keeper. Returns the record."""
    config = control.config
    where = runtime.place(place)
    agent = config.agent(ask.agent)
    vm_name = where.vm_for(config, agent.vm_name)
    steps = prepare.TASK if where.name == runtime.LOCAL else prepare.JOB  # this machine's VM is reached here
    launch = prepare.prepare(control, prepare.Ask(agent, steps=steps, copy=True, vm_name=vm_name,
                                                  folders=where.mirror(vm_name)))
    repo = store.find(launch.workspace)
    if repo is None:
        raise workmode.not_a_git_work_tree(launch.workspace)
    prepared = launch.brokering.prepared if launch.brokering is not None else None
    logins = [] if where.takes_logins else hostlogins.refused_logins(config, agent, prepared)
    if logins:
        raise hostlogins.refusal(agent, logins, where.name, brokersetup.wanted(config))
    new = records.NewTask(vm_name, launch.workspace, agent.name, ask.session_argv or task_argv(agent), launch.workdir,
                          ask.prompt, name=ask.name, timeout=ask.timeout, host=where.name, isolated=True)
    task = records.create(new)
    if ask.session_argv is not None:
        task.session = True
        records.save(task)
    taken: list[bool] = []
    handed(task, "the VM" if steps.reaches_vm else where.name,
           lambda: taken.append(_hand_over(launch, task, ask.prompt, repo, where)))
    if taken and not taken[0]:
        note(f"{task.label} waits for {where.name}, which does not answer; it is handed over when it does "
             "(`agentbox tasks` shows it, `agentbox cancel` drops it)")
    with timing.phase("the task's keeper (started)"):
        keeper.start(task.id)
    return records.get(task.id) or task


def _hand_over(launch: prepare.Launch, task: records.Task, prompt: bytes, repo: store.Repo, where: Runtime) -> bool:
    """The task's key, its copy, its job kept beside the record, then the hand-over; False: the host does not
    answer (its keeper hands it over when it does)."""
    forward = not launch.steps.reaches_vm and (launch.config.network.proxied or brokersetup.wanted(launch.config))
    key = where.key(task.id)
    with records.locked():
        latest = records.get(task.id) or task
        latest.remote_key = task.remote_key = key
        latest.forward_port = task.forward_port = hostlogins.remote_port(key) if forward else None
        records.save(latest)
    staged = stage_copy(launch, task, repo, start_checkpoint(launch, task, repo))
    with prepare.proxied(launch) as launch:  # a host's keeper holds its own from now on
        if not launch.steps.reaches_vm:
            keeper.keep_job(task, build(launch, task, prompt, staged, where))
            return keeper.hand_over(task, where, launch.lease.port if launch.lease else None)
        here = prepare.warm_reached(launch)
        if here is None or not _handed_here(here, task, build(here, task, prompt, staged, where), where):
            here = prepare.listed_reached(launch)
            _handed_here(here, task, build(here, task, prompt, staged, where), where)
        if launch.config.notify:
            attention.ensure_watcher(launch.vm_name)  # it shows the task's end, and ends itself after
    return True


def _handed_here(launch: prepare.Launch, task: records.Task, job: Job, where: Runtime) -> bool:
    """This machine's VM, reached: the job's launch step runs through the warm stub, which proves (or records) the
    VM first; False when a warm attempt ran nothing (take the slow path)."""
    assert launch.attempt is not None
    keeper.keep_job(task, job)
    job = job._replace(argv=warm.argv(launch.attempt, launch.workspace, "/", list(job.argv)))
    handed = keeper.deliver(task, where, job)
    if warm.fell_back(launch.attempt, handed.code, None):
        return False
    keeper.took(task, job, handed, "the VM")
    return True


def stage_copy(launch: prepare.Launch, task: records.Task, repo: store.Repo,
               start: tuple[str, str | None] | None) -> bundles.Staged:
    """The task's base (its start checkpoint's tree, or the workspace's as it is when checkpoints are off) as
    bundles in the place's staging folder (this machine's mirror of it), recorded as the task's base."""
    config = launch.config
    with timing.phase("the task's copy (git bundle)"):
        if start is None:
            snap = snapshot.take(repo, config.checkpoints.max_file_size)
            start = (snap.tree, snap.head)
        tree, head = start
        others = [other for other in records.all_tasks() if other.vm == task.vm and other.host == task.host
                  and other.isolated and other.active and other.id != task.id]
        staged = bundles.stage(repo, bundles.place_name(task.host, task.vm), tree,
                               paths.staging_dir(launch.folders) / bundles.FOLDER, tidy=not others)
    with records.locked():
        latest = records.get(task.id) or task
        latest.copy_base = task.copy_base = {"commit": staged.base, "tree": tree, "head": head}
        records.save(latest)
    return staged


def build(launch: prepare.Launch, task: records.Task, prompt: bytes, staged: bundles.Staged, where: Runtime) -> Job:
    """Everything the place needs for the task, as one job: the staging folder's files when they are a mirror's
    (the bundles the place lacks among them), the task's folder, the launch step, and the VM's lima.yaml."""
    config, mirror, key = launch.config, launch.folders, task.remote_key or where.key(task.id)
    port = launch.lease.port if launch.steps.reaches_vm and launch.lease else task.forward_port
    with timing.phase("staging"):
        refreshed = staging.refresh(launch, launch.instance, port)
        if not where.takes_logins:
            hostlogins.check_staged(list(refreshed.credentials),
                                    launch.brokering.prepared if launch.brokering is not None else None, where.name)
        staging.stage_context(launch, refreshed, launch.instance, task.checkpoint)
    events = detached.events_folder(launch.vm_name) if config.notify and launch.steps.reaches_vm else None
    task_spec = spec(task, Runner(_slots(config, where.name), launch.workspace, None, events, staged, mirror))
    if task.session:
        task_spec += f"session={key}\0".encode()  # task-runner.sh: the program in the tmux session KEY
    options = staging.LaunchOptions(task=paths.vm_outbox(mirror) / "tasks" / key, isolated_task=True)
    command = staging.launch_command(launch, refreshed.folder, options)
    files, every, executables = _mirrored(mirror, staged) if mirror != launch.vm_name else ({}, None, set())
    files.update({"task/prompt": prompt, "task/spec": task_spec})
    with timing.phase("the VM's lima.yaml"):
        template = where.template(config, launch.vm_name)
    return Job(launch.vm_name, key, template, files, ["/usr/bin/env", "-C", "/", *command, "--", *task.argv],
               max(600, config.startup_wait_sec), every, frozenset(executables))


def _mirrored(mirror: str, staged: bundles.Staged) -> tuple[dict[str, bytes], list[str], set[str]]:
    """A mirror's staging folder as the job's files (the place holds the earlier bundles of the chain), every file
    it holds now, and which are programs."""
    files: dict[str, bytes] = {}
    every: list[str] = []
    executables: set[str] = set()
    root = paths.staging_dir(mirror)
    for folder, _, names in os.walk(root):
        for file_name in names:
            path = Path(folder) / file_name
            relative = path.relative_to(root).as_posix()
            if file_name.startswith(".") and file_name.endswith((".tmp", ".partial")):
                continue  # a file being written (fsutil.atomic_write's, the bundles')
            every.append(relative)
            if relative.startswith(f"{bundles.FOLDER}/") and file_name != (staged.written or ""):
                continue
            files[f"staging/{relative}"] = path.read_bytes()
            if path.stat().st_mode & 0o100:
                executables.add(f"staging/{relative}")
    return files, sorted(every), executables


def _slots(config: Config, place: str) -> int:
    for entry in config.task_hosts:
        if entry.name == place:
            return entry.max_concurrent or config.tasks_max_concurrent
    return config.tasks_max_concurrent
