"""One launch: make sure the VM runs, refresh the staging folder, then one `limactl shell` that does the rest.

What the launch is (its VM, agent, mode, kept session, ...) is decided once, in agentbox.session.prepare; this
module runs it.

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
import shutil
import time
from pathlib import Path
from typing import NamedTuple

from agentbox import paths, staginglayout, timing
from agentbox.agents.builtin import BUILTIN_AGENTS  # deferred: start-up (only in allowlist or offline mode)
from agentbox.credentials import writeback
from agentbox.errors import StateError
from agentbox.progress import note, warn
from agentbox.review import instructionfiles, quarantine, tripwire
from agentbox.safetext import visible, visible_text
from agentbox.session import (
    canaries,
    context,
    detached,
    endreport,
    isolated,
    plan,
    planrecorder,
    privatefiles,
    staging,
    warm,
)
from agentbox.session.checkpointing import SessionCheckpoints
from agentbox.session.prepare import Ask, Launch, checkpoint_tree, listed_reached, prepare, proxied, warm_reached
from agentbox.vm import drift, forwards, lifecycle, statefile, workmode
from agentbox.vm.lima import Instance

SSH_FAILED = 255  # limactl shell passes ssh's 255 on: the connection failed, or a signal ended the program


class Command(NamedTuple):
    argv: list[str]
    interactive_shell: bool = False  # a login shell: argv is not passed


def run(control: lifecycle.VmControl, ask: Ask, command: Command, running: Instance | None = None) -> int:
    """Run the command (the agent, or a shell) in the VM, creating or starting it as needed.

    `running` is the Running row of a `limactl list` the caller just made: it is checked, not listed again."""
    launch = prepare(control, ask)
    with proxied(launch) as launch:  # in allowlist and offline mode (or with the broker) it starts while Lima is asked
        tree, made_in = checkpoint_tree(launch)
        points = SessionCheckpoints(launch.config, tree, launch.agent_name, control.verbose,
                                    paths.staging_dir(launch.vm_name) / staginglayout.GO_MARKERS, made_in)
        try:
            with planrecorder.unrecorded():  # a launch from a plan starts its own (agentbox.session.planned)
                points.start()
            return _run(launch, command, points, running)
        finally:
            points.done()  # a launch that failed early still leaves no thread (nor go marker) behind


def _run(launch: Launch, command: Command, points: SessionCheckpoints, running: Instance | None) -> int:
    with timing.phase("tripwire fingerprint"), planrecorder.unrecorded():
        before, unacknowledged, yours = tripwire.begin_session(launch.workspace, launch.ask.busy, points.session)
    tripwire.report_yours(yours)
    tripwire.remind(unacknowledged)
    said = _Said(command, points, before, instructionfiles.quarantined(launch.config))
    if said.instructions:
        with timing.phase("instructions check"), planrecorder.unrecorded():
            quarantine.start(launch.workspace, said.instructions, launch.ask.busy, points.session)
    if running is None:
        warm_launch = warm_reached(launch)
        if warm_launch is not None:  # no `limactl list`: the guest proves it is the VM agentbox checked
            code = _session(warm_launch, said)
            if code is not None:
                return code
            if launch.control.verbose:
                note(f"{launch.vm_name} did not answer as the VM agentbox last checked (or is not running): "
                     "checking it")
    code = _session(listed_reached(launch, running), said)
    assert code is not None  # a recording attempt never falls back
    return code


class _Said:
    """What a launch says or measures once, though a warm attempt that fell back prepares the session twice."""

    def __init__(self, command: Command, points: SessionCheckpoints, tripwire_before: dict[str, tripwire.Entry],
                 instructions: tuple[str, ...]) -> None:
        self.command = command
        self.points = points
        self.tripwire_before = tripwire_before
        self.instructions = instructions  # the instruction files held at the session's end; () when off
        self.unreachable: set[str] | None = None
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the report's start
        self.running = False  # a kept session the launch left running
        self.proposal: dict[str, int] | None = None
        self.held: quarantine.Outcome | None = None  # what the session's end held of the instruction files
        self.changed_files: tuple[list[tripwire.Change], int] = ([], 0)  # the tripwire's check after the shell
        self.notes: set[str] = set()
        self.mcp_noted = False

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.add(text)
            note(text)


class _Prepared(NamedTuple):
    """One attempt's session, ready for its shell."""

    refreshed: staging.Refreshed
    isolated: isolated.IsolatedLaunch | None
    handback: writeback.Plan | None
    argv: list[str]
    workdir: str
    planted: canaries.Planted


def _session(launch: Launch, said: _Said) -> int | None:
    """Prepare the session on the VM the launch reached, run it, finish it; None when the warm attempt ran nothing
    (take the slow path)."""
    ready = _prepare_session(launch, said)
    code = _shell(launch, said, ready)
    if code is None:
        canaries.done(ready.planted)
        return None
    canaries.report(ready.planted)
    changed_files = said.changed_files
    try:
        code = _finish(launch, said, ready, code)
        _report(launch, said, code, changed_files)
        return code
    finally:
        # Last: whatever else the session's end prints comes before, so nothing pushes the warning away.
        if said.held is not None:
            quarantine.report(said.held)
        tripwire.report_session(*changed_files)


def _report(launch: Launch, said: _Said, code: int, changed: tuple[list[tripwire.Change], int]) -> None:
    """The session's signed report (agentbox.session.endreport); a live session's end checkpoint completes it."""
    facts = endreport.Facts("session", launch.agent_name, launch.vm_name, str(launch.workspace), launch.isolated,
                            launch.config.network.mode, kept=launch.kept is not None)
    record = endreport.draft(facts, said.started, code, running=said.running,
                             held_instructions=said.held.newly if said.held is not None else ())
    taken = said.points.taken
    record["checkpoints"]["start"] = taken.checkpoint.id if taken is not None else None
    record["proposal"] = said.proposal
    record["tripwire"] = endreport.tripwire_part(*changed)
    if said.points.ending:
        endreport.finish_later(record, said.points.session)
    else:
        endreport.write(record)


def _prepare_session(launch: Launch, said: _Said) -> _Prepared:
    """Staging, the notes, the isolated copy's base, the logins' way back and launch.sh's command line."""
    config, vm_name, instance = launch.config, launch.vm_name, launch.instance
    assert instance is not None and launch.attempt is not None
    with timing.phase("network proxy (ready)"):
        proxy_port = launch.lease.port if launch.lease else None  # waits for a proxy this launch started
    with timing.phase("staging (credentials, env, guards, sync)"):
        refreshed = staging.refresh(launch, instance, proxy_port)
    _notes(launch, said, refreshed)
    seen = context.vm_facts(instance)
    if launch.state.get("seen") != seen:  # what `agentbox describe` reports without asking Lima
        statefile.update(vm_name, {"seen": seen})
    points, workdir, copy = said.points, launch.workdir, None
    if launch.isolated:
        points.wait_for_start()  # the start checkpoint is the copy's base
        with timing.phase("isolated mode (base, outbox)"):
            copy = isolated.begin(config, vm_name, launch.agent_name, workdir, points, aside=launch.aside)
        workdir = str(paths.staging_dir(vm_name))  # the copy may not exist yet: launch.sh makes it, then enters it
    handback = _handback(launch, refreshed)
    options = staging.LaunchOptions(isolated=copy, returns=handback.returns if handback is not None else None,
                                    session=launch.kept, worktree=launch.ask.worktree)
    argv = staging.launch_command(launch, refreshed.folder, options)
    argv += points.go_options()  # launch.sh starts the program once the start checkpoint is recorded
    with timing.phase("private files (fingerprints)"):
        privatefiles.refresh(config, vm_name, launch.workspace)
    with planrecorder.unrecorded():  # new every launch: a launch from a plan makes its own
        planted = canaries.plant(vm_name, canaries.session_id(launch.attempt.nonce))
    argv += canaries.options(planted)
    argv += ["--", *said.command.argv] if not said.command.interactive_shell else []
    with timing.phase("port clashes (Lima's logs)"):
        unreachable = forwards.warn_clashes(instance, launch.control.lima.listed or {vm_name: instance},
                                            known=said.unreachable)
        said.unreachable = (said.unreachable or set()) | unreachable
    points.report_if_done()
    start = points.taken if copy is not None else None  # a live session's program gets it from the go marker
    with timing.phase("sandbox description"):
        staging.stage_context(launch, refreshed, instance, start.checkpoint.id if start is not None else None)
    if launch.kept is not None and launch.kept.events is not None:
        # deferred: start-up (session.attention: only a kept session watches for events)
        from agentbox.session import attention

        attention.ensure_watcher(vm_name)  # before the shell: a closed terminal ends agentbox with it
    return _Prepared(refreshed, copy, handback, argv, workdir, planted)


def _handback(launch: Launch, refreshed: staging.Refreshed) -> writeback.Plan | None:
    """The logins the VM hands back after the session. A kept session outlives the shell, so nothing is handed
    back when it ends; the next launch returns the logins it refreshed (launch.sh keeps what it last installed).
    With the broker, a brokered login never comes back from the VM (its real tokens are refreshed, and a login
    made through it saved, on the host: `brokered` tells the write-back which those are), and a staged one only
    after `agentbox AGENT login`: a plain session cannot make the host's login."""
    if launch.kept is not None:
        return None
    brokering, login = launch.brokering, launch.ask.login
    returned = [item for item in refreshed.credentials if brokering is None
                or (login and not brokering.prepared.replaces(item.host_path))]
    handed = writeback.Returned(returned, login, brokering.prepared.replaces if brokering else None)
    # Its only read is the outbox's housekeeping as it makes this session's folder: a launch from a plan makes its own.
    with planrecorder.unrecorded():
        return writeback.begin(launch.config, launch.vm_name, launch.agent, handed, launch.expected)


def _notes(launch: Launch, said: _Said, refreshed: staging.Refreshed) -> None:
    """What the launch says of the VM before the session: a degraded start, MCP servers the policy blocks, what
    changed since it was made, and its mode when that is not what the config asks for."""
    config, vm_name = launch.config, launch.vm_name
    degraded = lifecycle.degraded_note(vm_name, launch.state)  # remembered from its start: no limactl call
    if degraded:
        said.note(degraded)
    if config.network.mode != "open" and not said.mcp_noted:
        said.mcp_noted = True
        _note_blocked_mcp_servers(launch, refreshed.folder)
    changed = drift.changed_settings(launch.state.get("fingerprint"), config)
    if launch.aside or (launch.isolated and config.session_mode != workmode.ISOLATED):
        changed = [setting for setting in changed if setting != "mode"]
    if launch.aside:
        said.note(f"{vm_name} was created live: this session works on a copy of the workspace in the VM, and its "
                  "changes come back as a proposal; the VM still mounts your workspace writable, so this keeps "
                  "the agent's edits off your files, not a hostile agent (`agentbox start --recreate --isolated` "
                  "makes a VM that cannot write them)")
    if launch.isolated and config.session_mode != workmode.ISOLATED and not launch.state.get("isolatedNoted"):
        # once per VM: `agentbox status` says the mode every time
        note(f"{vm_name} was created isolated, so its sessions work on a copy of the workspace too; "
             "`agentbox start --recreate` with session.mode: live makes it live (`agentbox status` shows the mode)")
        statefile.update(vm_name, {"isolatedNoted": True})
    if changed:
        said.note(f"{', '.join(changed)} changed since {vm_name} was created; `agentbox start --recreate` applies it")


def _note_blocked_mcp_servers(launch: Launch, folder: Path) -> None:
    """Name the remote MCP servers the VM gets whose hosts the network policy blocks, and how to allow them."""
    # deferred: start-up (net.policy, sync.mcphosts: only in allowlist or offline mode)
    from agentbox.net import policy
    from agentbox.sync import mcphosts

    agent = launch.agent
    agents = [agent.name] if agent is not None else list(BUILTIN_AGENTS)
    endpoints = {agent.name: agent.endpoints} if agent is not None else {}
    allowed = [host for host, _ in policy.allow_list(launch.config.network, endpoints)]
    blocked = mcphosts.blocked(mcphosts.remote_servers(folder, agents), allowed)
    if blocked:
        warn(visible(mcphosts.message(launch.config.network.mode, blocked)))


def _shell(launch: Launch, said: _Said, ready: _Prepared) -> int | None:
    """The one `limactl shell`; None when a warm attempt ran nothing (what was prepared for it is dropped)."""
    assert launch.attempt is not None
    vm_name, lima, points = launch.vm_name, launch.control.lima, said.points
    shell_argv = warm.argv(launch.attempt, launch.workspace, ready.workdir, ready.argv)
    reconnect = bool(launch.state.get("reconnect"))
    fell_back = False
    recorder = planrecorder.current()
    if recorder is not None:  # what this launch read ends here: the rest is the session's
        planrecorder.stop()
        # deferred: start-up (session.planwrite: only a launch that recorded what it read)
        from agentbox.session import planwrite

        planwrite.offer(recorder, launch, points, shell_argv, said.command.argv, ready.handback)
    try:
        with timing.phase("in-VM setup + agent (limactl shell)"):
            if launch.attempt.mode == warm.PROVE:
                code, lima_said = lima.shell_unlisted(vm_name, shell_argv, reconnect=reconnect)
                fell_back = warm.fell_back(launch.attempt, code, lima_said)
                if fell_back:
                    if recorder is not None:  # the plan's VM did not prove itself: no plan stands for it
                        plan.forget(recorder.key)
                    return None
            else:
                # Lima enters the host's folder first (`cd` to it, or the host home, before the command): in an
                # isolated VM the copy there may not exist yet, so it enters the staging folder, which always does.
                code = lima.shell(vm_name, shell_argv, workdir=ready.workdir if ready.isolated is not None else None,
                                  reconnect=reconnect)
    finally:
        _after_shell(launch, said, ready, fell_back)
    return code


def _after_shell(launch: Launch, said: _Said, ready: _Prepared, fell_back: bool) -> None:
    points = said.points
    if fell_back:  # nothing ran in the VM: what was prepared for the session goes
        if launch.kept is not None:
            detached.take_reply(launch.vm_name, launch.kept.reply)
        if ready.handback is not None:
            writeback.discard(ready.handback)
        return
    points.shell_ended()  # not after a fallback: its shell runs again, and launch.sh may still make the worktree
    kept_in = launch.vm_name if launch.kept is not None else None
    with timing.phase("tripwire check"):  # the files as the session left them, before any is put back
        said.changed_files = tripwire.end_session(launch.workspace, said.tripwire_before, points.session, kept_in)
    if said.instructions:  # before the end checkpoint: it records the workspace as agents will read it
        with timing.phase("instructions check"):
            said.held = quarantine.end(launch.workspace, said.instructions, points.session,
                                       f"{launch.agent_name} session in {launch.vm_name}", kept_in)
        said.changed_files = quarantine.noted(said.changed_files, said.held)
    if launch.kept is not None and not launch.kept.attach:
        points.wait_for_start()  # the session goes on: its end is not this launch's
    else:
        points.end()  # taken after this returns, by a process of its own
    if ready.handback is not None:
        with timing.phase("credential write-back"):
            try:
                writeback.finish(ready.handback)
            except OSError as exc:
                warn(f"the session's logins were not copied back to the host: {exc}")


def _finish(launch: Launch, said: _Said, ready: _Prepared, code: int) -> int:
    """After the session: ports, the isolated session's proposal, whether the VM is still there, the kept
    session's outcome."""
    vm_name, instance = launch.vm_name, launch.instance
    assert instance is not None
    with timing.phase("port clashes after the session"):
        forwards.warn_clashes(instance, launch.control.lima.listed or {vm_name: instance}, known=said.unreachable,
                              during=True)
    if ready.isolated is not None:
        with timing.phase("isolated mode (proposal)"):
            said.proposal = isolated.finish(launch.config, vm_name, ready.isolated, code)
    if launch.state.get("reconnect"):
        statefile.update(vm_name, {"reconnect": False})
    after = launch.control.instance(vm_name) if code in (1, SSH_FAILED) else instance
    if after is None:
        raise vanished(vm_name, code)
    if launch.kept is not None:
        code = _session_outcome(vm_name, launch.kept, code, said)
    if code == SSH_FAILED:
        note(ssh_failed_note(vm_name, instance, after))
    return code


def vanished(vm_name: str, code: int) -> StateError:
    """The VM is gone after a session that ended in exit 1 or 255."""
    return StateError(
        f"the VM {vm_name} disappeared " + ("during the session" if code == SSH_FAILED
                                         else "while agentbox was starting the session"),
        hint="Another process deleted it. Run the command again to create it anew.",
    )


def ssh_failed_note(vm_name: str, instance: Instance, after: Instance) -> str:
    """What an exit 255 of `limactl shell` means: the VM stopped under the session (Lima reports a crashed VM Stopped
    too), or, while it runs, a signal ended the program or ssh failed."""
    logs = f"Lima's logs are in {instance.dir} ({os.path.join(instance.dir, 'ha.stderr.log')})"
    if after.status != "Running":
        return (f"{vm_name} stopped during the session (its status is now {after.status or 'unknown'}), so ssh lost "
                f"its connection (exit {SSH_FAILED}); the next launch starts it again. {logs}.")
    # ssh gives 255 for a program a signal ended in the VM too (sshd's `exit-signal` carries no status): an agent the
    # kernel killed for memory, or `kill -9`, reads exactly like a lost connection, so neither is claimed.
    return (f"{vm_name} is still running, but the session ended without an exit status (exit {SSH_FAILED}): ssh "
            f"reports that when the program in the VM was killed by a signal (the kernel's out-of-memory killer, "
            f"`kill -9`), when it could not reach {vm_name} or lost its connection, or when the program exited "
            f"{SSH_FAILED} itself. "
            f"`agentbox shell -- sudo dmesg` shows whether the kernel killed it for memory; `agentbox restart` "
            f"restarts the VM; {logs}.")


def _session_outcome(vm_name: str, kept: staginglayout.SessionLaunch, code: int, said: _Said) -> int:
    """What the VM said of the session: its name (stdout) when detached; the agent's code when it ended attached."""
    # deferred: start-up (click: a launch never loads it; only a kept session's outcome echoes)
    import click

    reply = detached.take_reply(vm_name, kept.reply)
    if reply is None or reply.name is None:
        if code == 0:
            warn(f"{vm_name} did not say which session it started; `agentbox sessions` lists them")
            return 1
        return code  # launch.sh stopped before the session (it said why)
    agent = reply.agent or "the agent"
    said.running = reply.outcome != "ended"
    if reply.outcome == "started":
        click.echo(reply.name)
        note(f"{agent} runs in the session {reply.name} in {vm_name}: `agentbox attach {reply.name}` to see it, "
             "`agentbox sessions` lists them")
        return 0
    if reply.outcome == "ended":
        if reply.last_output:
            click.echo(visible_text(screen_tail(reply.last_output)))
        return reply.code if reply.code is not None else code
    note(f"detached from the session {reply.name}: {agent} goes on in {vm_name}; `agentbox attach {reply.name}` "
         "returns to it")
    return 0


def screen_tail(text: str) -> str:
    """The end of a session's last screen, as much as the terminal shows, without its trailing blank lines."""
    lines = text.rstrip("\n").split("\n")
    return "\n".join(lines[-max(shutil.get_terminal_size().lines - 1, 5):])


