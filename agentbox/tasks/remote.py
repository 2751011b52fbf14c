"""`agentbox run --on HOST`: an isolated task on another machine, through the runtime contract.

The task is an isolated task as on this machine (agentbox.tasks.submit): its start checkpoint goes as a git bundle
of agentbox's store (a delta when the host holds an earlier one), the agent works on a copy in the project's VM
there, and its changes come back as a proposal. What differs is only where the files are:

- This machine keeps a mirror of the remote VM's two shared folders, `<state>/vms/VM.on-HOST/{staging,outbox}`
  (`shadow`): agentbox's staging code writes the launch step, the task's spec and the bundles there, and the job
  sends them. The remote VM mounts the far end's folders at these same paths, so every path the launch step and
  its files name is right there too.
- The remote VM is made on first use from agentbox's own template (vm.render.render_remote): the config's
  resources and provisioning, no mount of the workspace, nothing of this machine's.
- No login goes: the VM gets the credential broker's placeholders and reaches the broker on this machine over an
  ssh reverse forward (agentbox.tasks.hostlogins); an agent whose login would have to be staged there is
  refused before anything is made.
- The hand-over is one `submit` to the far end (one ssh round trip on a warm VM, over the host's multiplexed
  connection). A host that does not answer leaves the task Pending ("waiting for HOST"); the keeper
  (agentbox.tasks.keeper, a detached process per task) hands it over when the host answers, follows it,
  and brings the outputs and the proposal home.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from agentbox import paths, timing
from agentbox.errors import StateError
from agentbox.progress import note
from agentbox.tasks import bundles as taskbundles
from agentbox.tasks import records as tasks
from agentbox.tasks.keeper import JOB_FILE, hand_over, keep_job, shadow
from agentbox.tasks.transitions import CANCELLED, FAILED

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.git.store import Repo
    from agentbox.remote.registry import Host
    from agentbox.runtime.contract import Job
    from agentbox.session.brokersetup import Brokered
    from agentbox.vm import lifecycle as vm


def remote_vm_name(config: Config, vm_name: str) -> str:
    """The project's VM on a host: its name here and the key of the provisioning it is built from (the base key,
    agentbox.vm.golden): a new agentbox or provisioning setting makes a new VM there on first use, never a VM
    provisioned differently from what this machine's VMs get. (The older one stays until deleted there.)"""
    from agentbox.vm import golden

    return f"{vm_name}-{golden.key(config)[:8]}"


def task_key(task: tasks.Task) -> str:
    """The task's name on the host: its id and this machine's, so two laptops sharing a host never collide."""
    machine = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:24].strip("-") or "laptop"
    digest = hashlib.sha256(str(paths.state_dir()).encode()).hexdigest()[:8]
    return f"t{task.id}-{machine}-{digest}"


def submit(session: vm.VmControl, agent_name: str, prompt: bytes, *, name: str | None, timeout: int | None,
           host_name: str, session_argv: list[str] | None = None) -> tasks.Task:
    """Record the task, prepare its job and hand it to the host (or leave it waiting for the host); start its
    keeper. Returns the record. `session_argv`: a session (`agentbox AGENT --on HOST --detach`): the runner there
    runs this program (the agent's interactive form, no prompt) in tmux, for `agentbox attach`."""
    from agentbox.git import store as hostgit
    from agentbox.remote import registry
    from agentbox.session import brokersetup
    from agentbox.session.launch import workdir_for
    from agentbox.tasks import hostlogins
    from agentbox.tasks.submit import task_argv
    from agentbox.vm import workmode

    config = session.config
    workspace = config.require_workspace()
    agent = config.agent(agent_name)
    host = registry.require(host_name)
    repo = hostgit.find(workspace)
    if repo is None:
        raise workmode.not_a_git_work_tree(workspace)
    vm_name = remote_vm_name(config, agent.vm_name)
    mirror = shadow(vm_name, host.name)
    with timing.phase("the broker's placeholder logins"):
        brokering = brokersetup.prepare(config, mirror, agent.name)
    prepared = brokering.prepared if brokering is not None else None
    logins = hostlogins.refused_logins(config, agent, prepared)
    if logins:
        raise hostlogins.refusal(agent, logins, host_name, brokersetup.wanted(config))
    cwd = workdir_for(config.cwd, workspace)
    argv = task_argv(agent) if session_argv is None else session_argv
    task = tasks.create(vm_name, workspace, agent.name, argv, cwd, prompt, name=name,
                        timeout=timeout, worktree=None, host=host_name, isolated=True)
    if session_argv is not None:
        task.session = True
        tasks.save(task)
    lease = None
    try:
        job = _prepare(config, agent, task, prompt, repo, host, brokering)
        with timing.phase("the job kept"):
            keep_job(task, job)
        with timing.phase("this machine's proxy for the host's VM"):
            wanted = {agent.name: agent.endpoints}
            lease = brokersetup.begin_proxy(config, mirror, wanted) if task.forward_port else None
            port = lease.port if lease is not None else None
        handed = hand_over(task, host, port)
    except BaseException as exc:
        with tasks.locked():
            fresh = tasks.get(task.id) or task
            if fresh.active:
                tasks.end(fresh, FAILED, f"it could not be handed to {host_name}: "
                          f"{getattr(exc, 'message', None) or exc}")
        raise
    finally:
        if lease is not None:
            lease.release()  # the keeper holds its own from now on
    if not handed:
        note(f"{task.label} waits for {host_name}, which does not answer; it is handed over when it does "
             "(`agentbox tasks` shows it, `agentbox cancel` drops it)")
    from agentbox.tasks import keeper

    with timing.phase("the task's keeper (started)"):
        keeper.start(task.id)
    return tasks.get(task.id) or task


def _prepare(config: Config, agent: AgentConfig, task: tasks.Task, prompt: bytes, repo: Repo, host: Host,
             brokering: Brokered | None) -> Job:
    """Everything the host needs for the task, as one job: the staging folder's files (the bundles the host
    lacks among them), the task's folder, the launch command, and the VM's lima.yaml."""
    from agentbox.remote.farclient import FAR_ROOT
    from agentbox.runtime.contract import Job
    from agentbox.session import bootstrap, brokersetup, staging
    from agentbox.tasks import hostlogins
    from agentbox.tasks.submit import spec, stage_copy, start_checkpoint
    from agentbox.vm import render

    vm_name = task.vm
    mirror = shadow(vm_name, host.name)
    workspace = config.require_workspace()
    key = task_key(task)
    port = hostlogins.remote_port(key) if (config.network.proxied or brokersetup.wanted(config)) else None
    with tasks.locked():
        latest = tasks.get(task.id) or task
        latest.remote_key = task.remote_key = key
        latest.forward_port = task.forward_port = port
        tasks.save(latest)
    start = start_checkpoint(config, agent, task, repo)
    staged = stage_copy(config, task, repo, start, taskbundles.place_name(host.name, vm_name),
                        paths.staging_dir(mirror) / taskbundles.FOLDER)
    scripts = bootstrap.plan(config, str(paths.staging_dir(mirror)))
    with timing.phase("staging (for the host)"):
        refreshed = staging.refresh(config, mirror, agent, scripts, None, port,
                                    brokering.prepared if brokering is not None else None,
                                    brokering.authority if brokering is not None else None)
        hostlogins.check_staged(list(refreshed.credentials), brokering.prepared if brokering is not None else None,
                                 host.name)
        staging.stage_context(config, mirror, agent, refreshed, None, "isolated", task.checkpoint)
    box = paths.vm_outbox(mirror) / "tasks" / key
    task_spec = spec(task, _slots(config, host.name), None, workspace, None, staged, folders_of=mirror)
    if task.session:
        task_spec += f"session={key}\0".encode()  # task-runner.sh: the program in the tmux session KEY
    command = staging.launch_command(config, workspace, scripts, agent, refreshed.folder, task=box,
                                     isolated_task=True, vm_name=mirror)
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
            if relative.startswith(f"{taskbundles.FOLDER}/") and file_name != (staged.written or ""):
                continue  # the host holds the earlier bundles of the chain
            files[f"staging/{relative}"] = path.read_bytes()
            if path.stat().st_mode & 0o100:
                executables.add(f"staging/{relative}")
    files["task/prompt"] = prompt
    files["task/spec"] = task_spec
    root_there = FAR_ROOT  # Lima expands `~` in a mount's location: no question to the host is needed
    with timing.phase("the VM's lima.yaml for the host"):
        lima_yaml = render.render_remote(
            config, vm_name,
            render.RenderedMount(f"{root_there}/vms/{vm_name}/staging", str(paths.staging_dir(mirror)), False),
            render.RenderedMount(f"{root_there}/vms/{vm_name}/outbox", str(paths.vm_outbox(mirror)), True))
    return Job(vm_name, key, lima_yaml, files, ["/usr/bin/env", "-C", "/", *command, "--", *task.argv],
               max(600, config.startup_wait_sec), sorted(every), frozenset(executables))


def _slots(config: Config, host_name: str) -> int:
    for entry in config.task_hosts:
        if entry.name == host_name:
            return entry.max_concurrent or config.tasks_max_concurrent
    return config.tasks_max_concurrent


def choose(config: Config) -> str:
    """Where `--on any` sends a task: the first host of tasks.hosts (in order; `local` is a host like the others)
    with a free slot by this machine's own records, skipping a host that does not answer now; when every one is
    full, the first that answers (the task waits there, Queued). Says why it passed over a host."""
    from agentbox.remote import registry
    from agentbox.remote.ssh import Transport, Unreachable
    from agentbox.runtime import LOCAL

    entries = config.task_hosts or ()
    active = [task for task in tasks.all_tasks() if task.active]
    answering: list[str] = []
    for entry in entries:
        limit = entry.max_concurrent or config.tasks_max_concurrent
        if entry.name == LOCAL:
            used = sum(1 for task in active if task.host == LOCAL and task.workspace == str(config.workspace))
            answering.append(LOCAL)
        else:
            host = registry.get(entry.name)
            if host is None:
                note(f"tasks.hosts names {entry.name}, which `agentbox hosts add` did not add: passed over")
                continue
            try:
                code = Transport(host.target()).run(["true"], timeout=15).code
            except Unreachable as exc:
                registry.unreachable(host)
                note(f"{entry.name} does not answer ({exc.message}): passed over")
                continue
            if code != 0:
                note(f"{entry.name} answered `true` with exit {code}: passed over")
                continue
            registry.reached(host)
            answering.append(entry.name)
            used = sum(1 for task in active if task.host == entry.name)
        if used < limit:
            return entry.name
        note(f"{entry.name} has no free slot ({used} of {limit} in use)")
    if not answering:
        raise StateError("no host of tasks.hosts can take the task now (see above)",
                         hint="`agentbox hosts ls` shows each host; `--on NAME` makes the task wait for one.")
    note(f"every host is full: the task waits on {answering[0]}")
    return answering[0]


def cancel(task: tasks.Task) -> None:
    """Cancel a remote task: one still waiting for its host is simply Cancelled; else its runner there is asked
    (StateError when the host does not answer: nothing was delivered)."""
    from agentbox.remote import registry
    from agentbox.remote.ssh import Unreachable
    from agentbox.runtime.sshhost import SshRuntime

    with tasks.locked():
        fresh = tasks.get(task.id) or task
        if fresh.active and not fresh.handed:
            tasks.end(fresh, CANCELLED, f"cancelled before {fresh.host} took it")
            fresh.harvested = True
            tasks.save(fresh)
            (tasks.folder(fresh.id) / JOB_FILE).unlink(missing_ok=True)
            return
    host = registry.require(task.host)
    try:
        SshRuntime(host).cancel(task.vm, task.remote_key or "")
    except Unreachable as exc:
        raise StateError(f"{task.label} was not cancelled: {exc.message}",
                         hint=f"It goes on on {task.host}; `agentbox cancel {task.id}` again when the host answers.")\
            from None
