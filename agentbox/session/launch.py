"""One launch: make sure the VM runs, refresh the staging folder, then one `limactl shell` that does the rest.

A warm launch costs exactly one limactl call: `shell`. The launch before it listed the VM and checked it, and
agentbox kept that (agentbox.vm.verified); the guest proves it is still that VM before anything runs, or the
launch takes the slow path: `list`, a start or create when needed, the checks, and the shell
(agentbox.session.warm). Everything the session
needs (env, credentials, guards, bootstrap, the agents' own setup, the sandbox's description) reaches the VM
through the read-only staging mount (agentbox.session.staging describes it, and the command line of
provision/launch.sh); what it hands back (logins refreshed in the VM, an isolated session's changes) comes
through the outbox, read after the shell returns (agentbox.credentials.writeback, agentbox.review.proposals).
A git workspace gets a checkpoint before the session (taken on the host while the shell connects;
launch.sh starts the program once it is recorded) and after it (taken once the launch returned), see
agentbox.session.checkpointing. In isolated mode the start checkpoint is also the base of the agent's copy
(agentbox.review.isolation, agentbox.session.isolated), whose changes become a proposal after the
session. Before and after the session, the VM's ports that Lima could not forward to the host are reported
(agentbox.vm.forwards, from the instance folders of that `list`). A kept session (`--detach`, session.keepAlive) runs
the agent in a tmux session of the VM that outlives the shell (agentbox.session.detached): launch.sh starts it and
leaves it (DETACHED) or attaches to it (ATTACHED); its name, and how an attach ended, come back through the
outbox.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import paths, staginglayout, timing
from agentbox.config.load import AgentConfig, Config
from agentbox.credentials import writeback
from agentbox.errors import StateError, UsageError
from agentbox.progress import note, warn
from agentbox.review import scope, tripwire
from agentbox.session import bootstrap, brokersetup, context, staging, warm
from agentbox.session import detached as sessions
from agentbox.session import isolated as isolatedsession
from agentbox.session.checkpointing import SessionCheckpoints
from agentbox.session.worktrees import Worktree
from agentbox.vm import drift, forwards, verified, workmode
from agentbox.vm import lifecycle as vm
from agentbox.vm import state as vmstate
from agentbox.vm.lima import Instance

if TYPE_CHECKING:
    from agentbox.net import guard as netguard  # a launch without the proxy never imports it

SSH_FAILED = 255  # limactl shell passes ssh's 255 on: the connection failed, or a signal ended the program
DETACHED = "detached"  # the agent runs in a new session of the VM; the launch returns at once
ATTACHED = "attached"  # the same, attached to it: the launch returns when the agent ends or the user detaches


def keeps_alive(config: Config) -> bool:
    """session.keepAlive wraps a launch only on a terminal: a piped one is never wrapped."""
    return config.keep_alive and sys.stdin.isatty() and sys.stdout.isatty()


def run_in_vm(
    session: vm.VmControl,
    name: str,
    argv: list[str],
    interactive_shell: bool = False,
    agent: AgentConfig | None = None,
    running: Instance | None = None,
    login: bool = False,
    worktree: Worktree | None = None,
    keep: str | None = None,
    busy: tripwire.Busy | None = None,
) -> int:
    """Run argv (or a login shell) in the VM `name`, creating or starting it as needed.

    `running` is the Running row of a `limactl list` the caller just made: it is checked, not listed again.
    `login`: argv is the agent's login (`agentbox AGENT login`), whose login may replace the host's.
    `worktree`: the session runs in that git worktree of the workspace (made by launch.sh when missing).
    `keep`: DETACHED or ATTACHED runs the agent in a session that outlives the shell (agentbox.session.detached).
    `busy`: whether anything else of the project ran since a time (agentbox.tasks.activity): the tripwire asks it
    before it takes a changed file for the user's own edit (None: the tripwire assumes something did).
    """
    config = session.config
    workspace = config.require_workspace()
    # A detached isolated session is refused before anything starts (no limactl call, no proxy).
    if keep == DETACHED and agent is not None and workmode.ISOLATED in (
            config.session_mode, workmode.mode_of_vm(vm.expected_config(name), workspace)):
        _kept_session(config, name, agent, keep, workmode.ISOLATED, {})
    # A malformed host login stops the launch here, before anything starts.
    with timing.phase("credential broker (host logins, CA)"):
        brokering = brokersetup.prepare(config, name, agent.name if agent else None)
    # In allowlist and offline mode (or with the broker) the VM's proxy starts now, while Lima is asked.
    with timing.phase("network proxy (lease)"):
        lease = brokersetup.begin_proxy(config, name, {agent.name: agent.endpoints} if agent is not None else {})
    tree, made_in = checkpoint_tree(config, name, workspace, worktree)
    points = SessionCheckpoints(config, tree, agent.name if agent else "shell", session.verbose,
                                paths.staging_dir(name) / staginglayout.GO_MARKERS, made_in)
    try:
        points.start()
        try:
            return _run(session, name, argv, interactive_shell, agent, running, points, login, worktree, keep,
                        lease, brokering, busy)
        finally:
            points.done()  # a launch that failed early still leaves no thread (nor go marker) behind
    finally:
        if lease is not None:
            with timing.phase("network proxy (released)"):
                lease.release()  # the proxy stops unless another session (or a kept one's marker) needs it


def checkpoint_tree(config: Config, name: str, workspace: Path, worktree: Worktree | None) -> tuple[Path, Path | None]:
    """(what the session's checkpoints are of, the workspace launch.sh makes it in when it is a worktree not made
    yet). A live session in an agentbox worktree checkpoints that worktree (agentbox.review.scope); an isolated
    one the workspace, whose copy it works on."""
    if workmode.ISOLATED in (config.session_mode, workmode.mode_of_vm(vm.expected_config(name), workspace)):
        return workspace, None
    if worktree is not None:
        tree = Path(worktree.path)
        return tree, None if scope.ready(tree, workspace) else workspace
    return scope.checkpoint_root(config.cwd, workspace), None


def _note_blocked_mcp_servers(config: Config, folder: Path, agent: AgentConfig | None) -> None:
    """Name the remote MCP servers the VM gets whose hosts the network policy blocks, and how to allow them."""
    from agentbox.agents.builtin import BUILTIN_AGENTS
    from agentbox.net import policy as netpolicy
    from agentbox.safetext import visible
    from agentbox.sync import mcphosts

    agents = [agent.name] if agent is not None else list(BUILTIN_AGENTS)
    endpoints = {agent.name: agent.endpoints} if agent is not None else {}
    allowed = [host for host, _ in netpolicy.allow_list(config.network, endpoints)]
    blocked = mcphosts.blocked(mcphosts.remote_servers(folder, agents), allowed)
    if blocked:
        warn(visible(mcphosts.message(config.network.mode, blocked)))


def _run(
    session: vm.VmControl,
    name: str,
    argv: list[str],
    interactive_shell: bool,
    agent: AgentConfig | None,
    running: Instance | None,
    points: SessionCheckpoints,
    login: bool,
    worktree: Worktree | None = None,
    keep: str | None = None,
    lease: netguard.Lease | None = None,
    brokering: brokersetup.Brokered | None = None,
    busy: tripwire.Busy | None = None,
) -> int:
    config = session.config
    workspace = config.require_workspace()
    scripts = bootstrap.plan(config, str(paths.staging_dir(name)))
    with timing.phase("tripwire fingerprint"):
        tripwire_before, unacknowledged, yours = tripwire.begin_session(workspace, busy,
                                                                        points.session)
    tripwire.report_yours(yours)
    tripwire.remind(unacknowledged)
    said = _Said(tripwire_before, points.session)
    args = (session, name, argv, interactive_shell, agent, points, login, worktree, keep, lease, brokering, scripts,
            said)
    if running is None:
        cached = warm.usable(config, name, workspace)
        if cached is not None:  # no `limactl list`: the guest proves it is the VM agentbox checked
            code = _session(*args, cached.instance, vmstate.read(name), warm.prove(name, cached.token))
            if code is not None:
                return code
            if session.verbose:
                note(f"{name} did not answer as the VM agentbox last checked (or is not running): checking it")
    with timing.phase("VM state (limactl list, start)"):
        instance = (
            vm.ensure_running(session, name, running) if running is not None else vm.ensure_running(session, name)
        )
        state = vmstate.read(name)
        running_before = instance
        instance = vm.settle_in_place(session, instance, state)  # cpus, memory, disk changed while it ran
        if instance is not running_before:  # restarted to apply them
            state = vmstate.read(name)
            if lease is not None:
                lease.resume()  # its proxy stopped with the VM
    token = verified.record(name, instance)  # the next launch needs no `list` while this one stands
    warm.sweep(name)
    code = _session(*args, instance, vmstate.read(name) if token else state, warm.record(name, token))
    assert code is not None  # a recording attempt never falls back
    return code


class _Said:
    """What a launch says or measures once, though a warm attempt that fell back prepares the session twice."""

    def __init__(self, tripwire_before: dict[str, tripwire.Entry], session: str) -> None:
        self.tripwire_before = tripwire_before
        self.session = session
        self.unreachable: set[str] | None = None
        self.notes: set[str] = set()
        self.mcp_noted = False

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.add(text)
            note(text)


def _session(
    session: vm.VmControl,
    name: str,
    argv: list[str],
    interactive_shell: bool,
    agent: AgentConfig | None,
    points: SessionCheckpoints,
    login: bool,
    worktree: Worktree | None,
    keep: str | None,
    lease: netguard.Lease | None,
    brokering: brokersetup.Brokered | None,
    scripts: bootstrap.Plan,
    said: _Said,
    instance: Instance,
    state: dict[str, Any],
    attempt: warm.Attempt,
) -> int | None:
    """Prepare the session on `instance`, run it, finish it; None when the warm attempt ran nothing (take the
    slow path)."""
    config = session.config
    workspace = config.require_workspace()
    degraded = vm.degraded_note(name, state)  # remembered from its start: no limactl call
    if degraded:
        said.note(degraded)
    with timing.phase("network proxy (ready)"):
        proxy_port = lease.port if lease else None  # waits for a proxy this launch started
    with timing.phase("staging (credentials, env, guards, sync)"):
        refreshed = staging.refresh(config, name, agent, scripts, instance, proxy_port,
                                    brokering.prepared if brokering is not None else None,
                                    brokering.authority if brokering is not None else None)
    if config.network.mode != "open" and not said.mcp_noted:
        said.mcp_noted = True
        _note_blocked_mcp_servers(config, refreshed.folder, agent)
    seen = context.vm_facts(instance)
    if state.get("seen") != seen:  # what `agentbox describe` reports without asking Lima
        vmstate.update(name, {"seen": seen})
    vm_mode = workmode.mode_of_vm(vm.expected_config(name, state), workspace)
    mode = workmode.session_mode(config.session_mode, vm_mode, name, workmode.asked_by(config),
                                  aside=workmode.asked_on_command_line(config))
    aside = mode == workmode.ISOLATED and vm_mode == workmode.LIVE  # `--isolated` in a VM created live
    changed = drift.changed_settings(state.get("fingerprint"), config)
    if aside:
        changed = [setting for setting in changed if setting != "mode"]
        said.note(f"{name} was created live: this session works on a copy of the workspace in the VM, and its "
                  "changes come back as a proposal; the VM still mounts your workspace writable, so this keeps "
                  "the agent's edits off your files, not a hostile agent (`agentbox start --recreate --isolated` "
                  "makes a VM that cannot write them)")
    if mode == workmode.ISOLATED and config.session_mode != workmode.ISOLATED:
        changed = [setting for setting in changed if setting != "mode"]
        if not state.get("isolatedNoted"):  # once per VM: `agentbox status` says the mode every time
            note(f"{name} was created isolated, so its sessions work on a copy of the workspace too; "
                 "`agentbox start --recreate` with session.mode: live makes it live (`agentbox status` shows the mode)")
            vmstate.update(name, {"isolatedNoted": True})
    if changed:
        said.note(f"{', '.join(changed)} changed since {name} was created; `agentbox start --recreate` applies it")
    reconnect = bool(state.get("reconnect"))
    kept = _kept_session(config, name, agent, keep, mode, state)
    isolated = None
    workdir = workdir_for(config.cwd, workspace)
    if mode == workmode.ISOLATED:
        points.wait_for_start()  # the start checkpoint is the copy's base
        with timing.phase("isolated mode (base, outbox)"):
            isolated = isolatedsession.begin(config, name, agent.name if agent else "shell", workdir, points,
                                             aside=aside)
        workdir = str(paths.staging_dir(name))  # the copy may not exist yet: launch.sh makes it, then enters it
    # A kept session outlives the shell, so nothing is handed back when it ends; the next launch returns the
    # logins it refreshed (launch.sh keeps what it last installed).
    # With the broker, a brokered login never comes back from the VM (its real tokens are refreshed, and a login
    # made through it saved, on the host: `brokered` tells the write-back which those are), and a staged one only
    # after `agentbox AGENT login`: a plain session cannot make the host's login.
    returned = [item for item in refreshed.credentials if brokering is None
                or (login and not brokering.prepared.replaces(item.host_path))]
    handback = None if kept else writeback.begin(config, name, agent, returned, vm.expected_config(name, state),
                                                 login=login,
                                                 brokered=brokering.prepared.replaces if brokering else None)
    command = staging.launch_command(
        config, workspace, scripts, agent, refreshed.folder, isolated,
        handback.returns if handback is not None else None, session=kept, worktree=worktree, vm_name=name,
    )
    command += points.go_options()  # launch.sh starts the program once the start checkpoint is recorded
    command += ["--", *argv] if not interactive_shell else []
    with timing.phase("port clashes (Lima's logs)"):
        unreachable = forwards.warn_clashes(instance, session.lima.listed or {name: instance}, known=said.unreachable)
        said.unreachable = (said.unreachable or set()) | unreachable
    points.report_if_done()
    start = points.taken if isolated is not None else None  # a live session's program gets it from the go marker
    with timing.phase("sandbox description"):
        staging.stage_context(config, name, agent, refreshed, instance, mode,
                              start.checkpoint.id if start is not None else None)
    if kept is not None and kept.events is not None:
        from agentbox.session import attention

        attention.ensure_watcher(name)  # before the shell: a closed terminal ends agentbox with it
    shell_argv = warm.argv(attempt, workspace, workdir, command)
    fell_back = False
    try:
        with timing.phase("in-VM setup + agent (limactl shell)"):
            if attempt.mode == warm.PROVE:
                code, lima_said = session.lima.shell_unlisted(name, shell_argv, reconnect=reconnect)
                fell_back = warm.fell_back(attempt, code, lima_said)
                if fell_back:
                    return None
            else:
                # Lima enters the host's folder first (`cd` to it, or the host home, before the command): in an
                # isolated VM the copy there may not exist yet, so it enters the staging folder, which always does.
                code = session.lima.shell(name, shell_argv, workdir=workdir if isolated is not None else None,
                                          reconnect=reconnect)
    finally:
        if not fell_back:  # a fallback's shell runs again: launch.sh may still make the worktree
            points.shell_ended()
        if fell_back:  # nothing ran in the VM: what was prepared for the session goes
            if kept is not None:
                sessions.take_reply(name, kept.reply)
            if handback is not None:
                writeback.discard(handback)
        elif kept is not None and not kept.attach:
            points.wait_for_start()  # the session goes on: its end is not this launch's
        else:
            points.end(later=isolated is None)  # a live session's end checkpoint is taken after this returns
        if not fell_back and handback is not None:
            with timing.phase("credential write-back"):
                try:
                    writeback.finish(handback)
                except OSError as exc:
                    warn(f"the session's logins were not copied back to the host: {exc}")
    with timing.phase("tripwire check"):
        changed_files = tripwire.end_session(workspace, said.tripwire_before, said.session,
                                             name if kept is not None else None)
    try:
        with timing.phase("port clashes after the session"):
            forwards.warn_clashes(instance, session.lima.listed or {name: instance}, known=said.unreachable,
                                  during=True)
        if isolated is not None:
            with timing.phase("isolated mode (proposal)"):
                isolatedsession.finish(config, name, isolated, code)
        if reconnect:
            vmstate.update(name, {"reconnect": False})
        after = session.instance(name) if code in (1, SSH_FAILED) else instance
        if after is None:
            raise StateError(
                f"the VM {name} disappeared " + ("during the session" if code == SSH_FAILED
                                                 else "while agentbox was starting the session"),
                hint="Another process deleted it. Run the command again to create it anew.",
            )
        if kept is not None:
            code = _session_outcome(name, kept, code)
        if code == SSH_FAILED:
            note(_ssh_failed(name, instance, after))
        return code
    finally:
        # Last: whatever else the session's end prints comes before, so nothing pushes the warning away.
        tripwire.report_session(*changed_files)


def _ssh_failed(name: str, instance: Instance, after: Instance) -> str:
    """What an exit 255 of `limactl shell` means: the VM stopped under the session (Lima reports a crashed VM Stopped
    too), or, while it runs, a signal ended the program or ssh failed."""
    logs = f"Lima's logs are in {instance.dir} ({os.path.join(instance.dir, 'ha.stderr.log')})"
    if after.status != "Running":
        return (f"{name} stopped during the session (its status is now {after.status or 'unknown'}), so ssh lost "
                f"its connection (exit {SSH_FAILED}); the next launch starts it again. {logs}.")
    # ssh gives 255 for a program a signal ended in the VM too (sshd's `exit-signal` carries no status): an agent the
    # kernel killed for memory, or `kill -9`, reads exactly like a lost connection, so neither is claimed.
    return (f"{name} is still running, but the session ended without an exit status (exit {SSH_FAILED}): ssh reports "
            f"that when the program in the VM was killed by a signal (the kernel's out-of-memory killer, `kill -9`), "
            f"when it could not reach {name} or lost its connection, or when the program exited {SSH_FAILED} itself. "
            f"`agentbox shell -- sudo dmesg` shows whether the kernel killed it for memory; `agentbox restart` "
            f"restarts the VM; {logs}.")


def _kept_session(
    config: Config, name: str, agent: AgentConfig | None, keep: str | None, mode: str, state: dict[str, object]
) -> staginglayout.SessionLaunch | None:
    """launch.sh's session options for a kept launch; None for a plain one."""
    if keep is None or agent is None:
        return None
    if mode == workmode.ISOLATED:
        if keep == ATTACHED:
            return None  # session.keepAlive leaves isolated sessions as they are
        raise UsageError(
            f"an isolated session cannot be detached ({name} is isolated): its changes are collected when the agent "
            "exits in the launch that started it; nothing was started",
            hint=f"Run `agentbox {agent.name}` without --detach (a terminal multiplexer on the host keeps it), or "
            "detach a live session (session.mode: live and `agentbox start --recreate`).",
        )
    if not writeback.has_outbox(vm.expected_config(name, state), name):
        raise StateError(
            f"{name} was created before agentbox could keep sessions (it has no outbox)",
            hint="`agentbox start --recreate` applies it.",
        )
    events = sessions.events_folder(name) if config.notify else None
    return staginglayout.SessionLaunch(sessions.base_name(agent.name), keep == ATTACHED, sessions.new_reply(name),
                                       events, sessions.live_folder(name))


def _session_outcome(name: str, kept: staginglayout.SessionLaunch, code: int) -> int:
    """What the VM said of the session: its name (stdout) when detached; the agent's code when it ended attached."""
    import click

    from agentbox.safetext import visible_text

    reply = sessions.take_reply(name, kept.reply)
    if reply is None or reply.name is None:
        if code == 0:
            warn(f"{name} did not say which session it started; `agentbox sessions` lists them")
            return 1
        return code  # launch.sh stopped before the session (it said why)
    agent = reply.agent or "the agent"
    if reply.outcome == "started":
        click.echo(reply.name)
        note(f"{agent} runs in the session {reply.name} in {name}: `agentbox attach {reply.name}` to see it, "
             "`agentbox sessions` lists them")
        return 0
    if reply.outcome == "ended":
        if reply.last_output:
            click.echo(visible_text(screen_tail(reply.last_output)))
        return reply.code if reply.code is not None else code
    note(f"detached from the session {reply.name}: {agent} goes on in {name}; `agentbox attach {reply.name}` "
         "returns to it")
    return 0


def screen_tail(text: str) -> str:
    """The end of a session's last screen, as much as the terminal shows, without its trailing blank lines."""
    import shutil

    lines = text.rstrip("\n").split("\n")
    return "\n".join(lines[-max(shutil.get_terminal_size().lines - 1, 5):])


def workdir_for(cwd: Path, workspace: Path) -> str:
    """The user's folder when it lies inside the workspace, else the workspace root."""
    resolved = Path(os.path.realpath(cwd))
    return str(resolved) if resolved == workspace or workspace in resolved.parents else str(workspace)
