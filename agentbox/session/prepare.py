"""Everything one launch decides, decided once: the Launch record and prepare(), which makes it.

An interactive launch (agentbox.session.launch), a background task in this machine's VM and an isolated task on
any place (agentbox.tasks.submit) all start here: the config and the VM, the agent, the workspace and the folder
the agent starts in, the bootstrap scripts, the credential broker's placeholders, the VM's mode, a kept session,
the worktree, the login, the VM's recorded state and what agentbox rendered for it. What a kind of launch does
beyond its shell is a named field of `Steps`: a task skips the session's checkpoints, the tripwire, the in-place
settling and the notes by saying so, not by leaving a call out.

Reaching the VM makes a second record from the first (`reached`, `warm_reached`): the VM's row, its state as it
is now (a VM just created or restarted has a new one) and the mode and kept session decided from it. The proxy's
lease joins the record where each flow wants it (`proxied`): a launch at once, a task around its hand-over.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import paths, staginglayout, timing
from agentbox.config.load import AgentConfig, Config
from agentbox.credentials import writeback
from agentbox.errors import StateError, UsageError
from agentbox.review import scope, tripwire
from agentbox.session import bootstrap, brokersetup, detached, warm
from agentbox.session.worktrees import Worktree
from agentbox.vm import lifecycle, statefile, verified, workmode
from agentbox.vm.lima import Instance

if TYPE_CHECKING:
    from agentbox.net.guard import Lease  # a launch without the proxy never imports it

DETACHED = "detached"  # the agent runs in a new session of the VM; the launch returns at once
ATTACHED = "attached"  # the same, attached to it: the launch returns when the agent ends or the user detaches


class Steps(NamedTuple):
    """What a kind of launch does around its shell. A task skips what is False here, by name."""

    session_checkpoints: bool  # start and end checkpoints of the session (a task takes its own start one)
    tripwire: bool  # the workspace's fingerprint before the session and the check after it
    settle_in_place: bool  # cpus, memory or disk changed while the VM ran: restart it now, or say when they apply
    notes: bool  # what changed since the VM was made, a degraded start, the VM's mode, MCP servers the policy blocks
    port_warnings: bool  # the VM's ports Lima could not forward, before and after the session
    reaches_vm: bool  # this machine's VM (warm proof, or list and start); False: a Job for another place


SESSION = Steps(True, True, True, True, True, True)
TASK = Steps(False, False, False, False, False, True)
JOB = Steps(False, False, False, False, False, False)


class Ask(NamedTuple):
    """What the caller asks for. `agent` None: a shell."""

    agent: AgentConfig | None
    steps: Steps = SESSION
    login: bool = False  # the agent's own login (`agentbox AGENT login`), whose login may replace the host's
    worktree: Worktree | None = None  # the session runs in that git worktree (launch.sh makes it when missing)
    keep: str | None = None  # DETACHED or ATTACHED: a session that outlives the shell (agentbox.session.detached)
    busy: tripwire.Busy | None = None  # what else of the project ran (agentbox.tasks.activity), for the tripwire
    copy: bool = False  # an isolated task: the agent works on a copy of the workspace, whatever the VM's mode
    vm_name: str | None = None  # the VM, when not the agent's (or the config's, for a shell)
    folders: str | None = None  # whose staging folder and outbox here, when not the VM's (a remote VM's mirror)


class Launch(NamedTuple):
    """What one launch decided (a NamedTuple: frozen, and no dataclasses module on a launch's path)."""

    control: lifecycle.VmControl
    config: Config
    vm_name: str
    folders: str  # the VM whose staging folder and outbox on this machine the launch writes
    agent: AgentConfig | None
    workspace: Path
    workdir: str  # the folder the agent starts in: the user's, inside the workspace, else the workspace
    scripts: bootstrap.Plan
    brokering: brokersetup.Brokered | None
    ask: Ask
    state: dict[str, Any]  # the VM's recorded state (agentbox.vm.statefile)
    expected: dict[str, Any] | None  # what agentbox rendered for the VM, from that state
    mode: str  # this launch's mode: workmode.LIVE or workmode.ISOLATED
    aside: bool  # an isolated session in a VM created live (`--isolated`): the copy goes aside
    kept: staginglayout.SessionLaunch | None  # launch.sh's options for a kept session
    lease: Lease | None = None  # the VM's proxy, while the launch holds it (`proxied`)
    instance: Instance | None = None  # the VM's row, once reached
    attempt: warm.Attempt | None = None  # how the shell proves (or records) the VM, once reached

    @property
    def steps(self) -> Steps:
        return self.ask.steps

    @property
    def agent_name(self) -> str:
        return self.agent.name if self.agent is not None else "shell"

    @property
    def isolated(self) -> bool:
        return self.mode == workmode.ISOLATED


def prepare(control: lifecycle.VmControl, ask: Ask) -> Launch:
    """Decide the launch. Refuses, before anything starts, a detached isolated session and a malformed host login
    (the broker's)."""
    config = control.config
    workspace = config.require_workspace()
    agent = ask.agent
    vm_name = ask.vm_name or (agent.vm_name if agent is not None else config.vm_name)
    folders = ask.folders or vm_name
    state = statefile.read(vm_name) if ask.steps.reaches_vm else {}
    decided = _mode(config, vm_name, state, ask)
    with timing.phase("credential broker (host logins, CA)"):
        brokering = brokersetup.prepare(config, folders, agent.name if agent is not None else None)
    return Launch(control, config, vm_name, folders, agent, workspace, workdir_for(config.cwd, workspace),
                  bootstrap.plan(config, str(paths.staging_dir(folders))), brokering, ask, state, *decided)


def _mode(config: Config, vm_name: str, state: dict[str, Any], ask: Ask
          ) -> tuple[dict[str, Any] | None, str, bool, staginglayout.SessionLaunch | None]:
    """(expected config, mode, aside, kept session) from the VM's state as it is now."""
    expected = lifecycle.expected_config(vm_name, state) if ask.steps.reaches_vm else None
    workspace = config.require_workspace()
    vm_mode = workmode.mode_of_vm(expected, workspace)
    if not ask.steps.reaches_vm:
        return expected, workmode.ISOLATED, False, None
    if not ask.steps.session_checkpoints:  # a task: its own mode (agentbox.tasks.submit)
        isolated = ask.copy or workmode.ISOLATED in (vm_mode, config.session_mode)
        return expected, workmode.ISOLATED if isolated else workmode.LIVE, False, None
    if ask.keep == DETACHED and workmode.ISOLATED in (config.session_mode, vm_mode):
        _kept_session(config, vm_name, ask, workmode.ISOLATED, expected)  # refused before anything starts
    if vm_mode is None:  # not made yet: what the launch asks for is what it gets, its session once it is made
        mode = workmode.ISOLATED if config.session_mode == workmode.ISOLATED else workmode.LIVE
        return expected, mode, False, None
    mode = workmode.session_mode(config.session_mode, vm_mode, vm_name, workmode.asked_by(config),
                                 aside=workmode.asked_on_command_line(config))
    aside = mode == workmode.ISOLATED and vm_mode == workmode.LIVE  # `--isolated` in a VM created live
    return expected, mode, aside, _kept_session(config, vm_name, ask, mode, expected)


def reached(launch: Launch, instance: Instance, attempt: warm.Attempt) -> Launch:
    """The launch on `instance`: its state, mode and kept session decided again from the VM as it is now."""
    state = statefile.read(launch.vm_name)
    expected, mode, aside, kept = _mode(launch.config, launch.vm_name, state, launch.ask)
    return launch._replace(state=state, expected=expected, mode=mode, aside=aside, kept=kept,
                               instance=instance, attempt=attempt)


def warm_reached(launch: Launch) -> Launch | None:
    """The launch on the VM agentbox checked last, without `limactl list`: its shell proves it is still that VM
    (agentbox.session.warm). None when there is no such record."""
    cached = warm.usable(launch.config, launch.vm_name, launch.workspace)
    if cached is None:
        return None
    return reached(launch, cached.instance, warm.prove(launch.vm_name, cached.token))


def listed_reached(launch: Launch, running: Instance | None = None) -> Launch:
    """The slow path: `list` (unless `running` is the Running row the caller just listed), a start or create as
    needed, and the checks; the VM recorded as checked, so that the next launch needs no `list`."""
    control, vm_name = launch.control, launch.vm_name
    with timing.phase("VM state (limactl list, start)"):
        instance = lifecycle.ensure_running(control, vm_name, running) if running is not None else \
            lifecycle.ensure_running(control, vm_name)
        if launch.steps.settle_in_place:
            before = instance
            instance = lifecycle.settle_in_place(control, instance, statefile.read(vm_name))
            if instance is not before and launch.lease is not None:
                launch.lease.resume()  # restarted to apply them: its proxy stopped with the VM
    token = verified.record(vm_name, instance)
    warm.sweep(vm_name)
    return reached(launch, instance, warm.record(vm_name, token))


@contextmanager
def proxied(launch: Launch, agents: dict[str, tuple[str, ...]] | None = None) -> Iterator[Launch]:
    """The launch holding its VM's proxy (allowlist and offline mode, or the broker); released after, when no
    other session (or a kept one's marker) needs it. Without either, no proxy and no cost. `agents`: whose
    endpoints the policy allows (default: the launch's agent's)."""
    if agents is None:
        agents = {launch.agent.name: launch.agent.endpoints} if launch.agent is not None else {}
    with timing.phase("network proxy (lease)"):
        lease = brokersetup.begin_proxy(launch.config, launch.folders, agents)
    try:
        yield launch._replace(lease=lease)
    finally:
        if lease is not None:
            with timing.phase("network proxy (released)"):
                lease.release()


def keeps_alive(config: Config) -> bool:
    """session.keepAlive wraps a launch only on a terminal: a piped one is never wrapped."""
    return config.keep_alive and sys.stdin.isatty() and sys.stdout.isatty()


def _kept_session(config: Config, vm_name: str, ask: Ask, mode: str, expected: dict[str, Any] | None
                  ) -> staginglayout.SessionLaunch | None:
    """launch.sh's session options for a kept launch; None for a plain one."""
    agent = ask.agent
    if ask.keep is None or agent is None:
        return None
    if mode == workmode.ISOLATED:
        if ask.keep == ATTACHED:
            return None  # session.keepAlive leaves isolated sessions as they are
        raise UsageError(
            f"an isolated session cannot be detached ({vm_name} is isolated): its changes are collected when the "
            "agent exits in the launch that started it; nothing was started",
            hint=f"Run `agentbox {agent.name}` without --detach (a terminal multiplexer on the host keeps it), or "
            "detach a live session (session.mode: live and `agentbox start --recreate`).",
        )
    if not writeback.has_outbox(expected, vm_name):
        raise StateError(
            f"{vm_name} was created before agentbox could keep sessions (it has no outbox)",
            hint="`agentbox start --recreate` applies it.",
        )
    events = detached.events_folder(vm_name) if config.notify else None
    return staginglayout.SessionLaunch(detached.base_name(agent.name), ask.keep == ATTACHED,
                                       detached.new_reply(vm_name), events, detached.live_folder(vm_name))


def checkpoint_tree(launch: Launch) -> tuple[Path, Path | None]:
    """(what the session's checkpoints are of, the workspace launch.sh makes it in when it is a worktree not made
    yet). A live session in an agentbox worktree checkpoints that worktree (agentbox.review.scope); an isolated
    one the workspace, whose copy it works on."""
    worktree, workspace = launch.ask.worktree, launch.workspace
    if launch.isolated:
        return workspace, None
    if worktree is not None:
        tree = Path(worktree.path)
        return tree, None if scope.ready(tree, workspace) else workspace
    return scope.checkpoint_root(launch.config.cwd, workspace), None


def workdir_for(cwd: Path, workspace: Path) -> str:
    """The user's folder when it lies inside the workspace, else the workspace root."""
    resolved = Path(os.path.realpath(cwd))
    return str(resolved) if resolved == workspace or workspace in resolved.parents else str(workspace)
