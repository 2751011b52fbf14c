"""`agentbox attach [NAME]` and `agentbox sessions [--json]`: the detachable sessions of the project's VM, and
of the VMs of agents that have their own (agentbox.session.detached). Each costs `limactl list` and one `limactl shell`
per running VM of the project."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from agentbox import tables
from agentbox.cli.commands.common import vm_control
from agentbox.errors import LimaError, StateError, UsageError
from agentbox.progress import note
from agentbox.safetext import visible, visible_text
from agentbox.session import detached
from agentbox.vm import lifecycle
from agentbox.vm.lima import RUNNING

if TYPE_CHECKING:
    from agentbox.tasks.records import Task
    from agentbox.vm.lifecycle import VmControl
    from agentbox.vm.lima import Instance


@click.command("attach")
@click.argument("name", required=False)
@click.pass_context
def attach_command(ctx: click.Context, name: str | None) -> None:
    """Attach to a session started with `agentbox AGENT --detach` (or kept by session.keepAlive), or, by its
    task's id or name, to one on another machine (`agentbox AGENT --on HOST --detach`), over ssh.

    Without NAME: the session that runs, when only one does, else the one that ended last. Detach again
    with Ctrl-b d; the session goes on. When the agent ends while you are attached, agentbox exits with its
    exit code. A session whose agent has exited shows its last screen and how to resume the conversation
    (exit status: the agent's).
    """
    # deferred: start-up (attention, launch: only the commands here that use it)
    from agentbox.session import attention, launch

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("`agentbox attach` needs a terminal (its stdin and stdout)",
                         hint="`agentbox sessions --json` tells a script what runs.")
    if name is not None:
        # deferred: start-up (hostsession: only the commands here that use it)
        from agentbox.tasks import hostsession

        remote = hostsession.find(name)
        if remote is not None:
            _attach_remote(ctx, remote)
    if name is not None and not detached.NAME_PATTERN.match(name):
        raise UsageError(f"{visible(name)!s} is not a session name",
                         hint="`agentbox sessions` lists the sessions of this project's VM.")
    control = vm_control(ctx)
    vm_name = _vm_to_attach(control, name)
    reply_folder = detached.new_reply(vm_name)
    argv = detached.script("attach", "--reply", str(reply_folder), *([name] if name else []))
    code = control.lima.shell(vm_name, argv)
    reply = detached.take_reply(vm_name, reply_folder)
    if reply is None:
        ctx.exit(code)
    assert reply is not None
    if reply.outcome == "none":
        raise StateError(f"{vm_name} has no sessions", hint="`agentbox AGENT --detach` starts one.")
    if reply.outcome == "unknown":
        raise UsageError(f"{vm_name} has no session {visible(name or '')}",
                         hint="`agentbox sessions` lists the sessions of this project's VM.")
    if reply.outcome == "ambiguous":
        raise UsageError(f"several sessions run in {vm_name}: {', '.join(reply.names)}",
                         hint=f"Name one: `agentbox attach {reply.names[0] if reply.names else 'NAME'}`.")
    shown = reply.name or "?"
    agent = reply.agent or "the agent"
    if reply.outcome == "detached":
        if control.config.notify:
            attention.ensure_watcher(vm_name)
        note(f"detached from the session {shown}: {agent} goes on in {vm_name}; `agentbox attach {shown}` returns")
        ctx.exit(0)
    if reply.outcome == "ended":
        if reply.last_output:
            click.echo(visible_text(launch.screen_tail(reply.last_output)))
        ctx.exit(reply.code if reply.code is not None else 0)
    # exited before this attach: its last screen, and how to go on
    if reply.last_output:
        click.echo(visible_text(launch.screen_tail(reply.last_output)))
    ended = f" at {detached.local_time(reply.ended)}" if reply.ended else ""
    how = f"exited with code {reply.code}" if reply.code is not None else "ended (its VM restarted)"
    resume = detached.resume_command(control.config, reply.agent)
    again = (f"`{resume}` resumes its conversation" if resume
             else f"`agentbox {reply.agent} --detach` starts it again" if reply.agent else "")
    note(f"the session {shown}: {agent} {how}{ended}" + (f"; {again}" if again else ""))
    ctx.exit(reply.code if reply.code is not None else 1)


def _attach_remote(ctx: click.Context, task: Task) -> None:
    """Join a session on another machine; say how it went (the user detached, or it ended and came home)."""
    # deferred: start-up (cli.commands.taskfollow, runtime.sshhost, hostsession: only the commands here that use it)
    from agentbox.cli.commands.taskfollow import _report_end
    from agentbox.runtime.sshhost import SESSION_ENDED
    from agentbox.tasks import hostsession

    code, task = hostsession.attach(task)
    if code == 0:
        note(f"detached from {task.label}: {task.agent} goes on on {task.host}; `agentbox attach {task.id}` returns")
        ctx.exit(0)
    if code != SESSION_ENDED:
        raise StateError(f"could not attach to {task.label} on {task.host} (exit status {code})",
                         hint="`agentbox tasks --refresh` shows whether it still runs.")
    if not task.settled:
        note(f"the session of {task.label} ended; its task is {task.state} on {task.host}: `agentbox wait "
             f"{task.id}` reports how it ended")
        ctx.exit(0)
    ctx.exit(_report_end(task))


JSON_HELP = ("One JSON array: name, agent, vm, started, attached, state (running, exited, or stopped: with its VM, "
             "its record goes when the next session starts), exitCode, ended.")


@click.group("sessions", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def sessions_command(ctx: click.Context, as_json: bool) -> None:
    """List the detachable sessions of the project's VM: running ones, and the last ones that ended."""
    if ctx.invoked_subcommand is None:
        _list_sessions(ctx, as_json)


@sessions_command.command("ls")
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.pass_context
def sessions_ls_command(ctx: click.Context, as_json: bool) -> None:
    """List the sessions: the same as `agentbox sessions`."""
    _list_sessions(ctx, as_json or bool(ctx.parent and ctx.parent.params.get("as_json")))


def _list_sessions(ctx: click.Context, as_json: bool) -> None:
    control = vm_control(ctx, acts=False)
    control.config.require_workspace()
    running = _running_vms(control)
    rows = [(vm_name, row) for vm_name in running for row in _list(control, vm_name)]
    if as_json:
        click.echo(json.dumps([row.to_json(vm_name) for vm_name, row in rows], indent=2))
        return
    vm_name = control.config.vm_name
    if not running:
        note(f"{vm_name} is not running, so no session is: they end when their VM stops")
        return
    if not rows:
        note(f"no sessions in {', '.join(running)}; `agentbox AGENT --detach` starts one")
        return
    several = len(running) > 1
    table = [("NAME", "AGENT", "STARTED", "STATE", "ATTACHED", *(("VM",) if several else ()))]
    for vm_name, row in rows:
        state = row.state if row.state == detached.RUNNING else "stopped with its VM" if (
            row.state == detached.STOPPED) else f"exited ({row.exit_code})" if row.exit_code is not None else "exited"
        table.append((row.name, row.agent, tables.local_time(row.started), state,
                      "yes" if row.attached else "no", *((vm_name,) if several else ())))
    tables.echo(table, flexible=(0,))


def _project_vms(control: VmControl) -> list[str]:
    """The project's VM, then the VMs of agents that have their own (agents.NAME.vmName)."""
    names = [control.config.vm_name]
    for agent in control.config.agents.values():
        if agent.vm_name not in names:
            names.append(agent.vm_name)
    return names


def _running_vms(control: VmControl) -> list[str]:
    """Which of the project's VMs run (one `limactl list`); each is checked to be this workspace's."""
    listed = control.lima.instances()
    running = []
    for vm_name in _project_vms(control):
        instance = listed.get(vm_name)
        if instance is not None:
            lifecycle.check_ownership(instance, control.config)
            if instance.status == RUNNING:
                running.append(vm_name)
    return running


def _list(control: VmControl, vm_name: str) -> list[detached.Row]:
    code, output, stderr = control.lima.shell_bytes(vm_name, detached.script("list"), detached.LIST_LIMIT)
    if code != 0:
        raise LimaError(f"could not list the sessions of {vm_name} (exit {code})",
                        hint=detached.shown(stderr.strip()[-300:]) or None)
    return detached.parse_list(output)


def _vm_to_attach(control: VmControl, name: str | None) -> str:
    """The VM whose session `attach` takes: the project's VM, unless agents of the project have VMs of their
    own, then the one that has the session (asked of each running VM; one shell each)."""
    if len(_project_vms(control)) == 1:
        vm_name = control.config.vm_name
        _running(control, vm_name)
        return vm_name
    running = _running_vms(control)
    if len(running) <= 1:
        vm_name = running[0] if running else control.config.vm_name
        _running(control, vm_name)
        return vm_name
    found = {vm_name: _list(control, vm_name) for vm_name in running}
    if name is not None:
        return next((vm_name for vm_name, rows in found.items() if any(row.name == name for row in rows)),
                    running[0])  # none has it: the project's VM answers that it has no such session
    live = [(vm_name, row.name) for vm_name, rows in found.items() for row in rows if row.state == detached.RUNNING]
    if len(live) > 1:
        raise UsageError(f"several sessions run: {', '.join(f'{row} (in {vm_name})' for vm_name, row in live)}",
                         hint=f"Name one: `agentbox attach {live[0][1]}`.")
    if live:
        return live[0][0]
    ended = [(row.ended or 0, vm_name) for vm_name, rows in found.items() for row in rows]
    return max(ended)[1] if ended else running[0]


def _running(control: VmControl, vm_name: str) -> Instance:
    control.config.require_workspace()
    instance = control.instance(vm_name)
    if instance is None:
        raise StateError(f"{vm_name} does not exist, so it has no sessions",
                         hint="`agentbox AGENT --detach` creates it and starts one.")
    lifecycle.check_ownership(instance, control.config)
    if instance.status != RUNNING:
        raise StateError(f"{vm_name} is {instance.status.lower() or 'not running'}: its sessions ended when it stopped",
                         hint="`agentbox AGENT --detach` starts a new one.")
    return instance
