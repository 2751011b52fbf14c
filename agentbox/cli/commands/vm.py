"""VM commands: start, stop, restart, rm, status, ls, shell."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from agentbox import tables
from agentbox.cli.commands import ending
from agentbox.cli.commands.common import agent_named, settle_tasks, vm_control, vm_name
from agentbox.errors import AgentboxError, ConfigError
from agentbox.net import guard
from agentbox.progress import say, warn
from agentbox.safetext import visible
from agentbox.tasks.activity import ProjectActivity
from agentbox.vm import forwards, lifecycle, lima, statefile, workmode

if TYPE_CHECKING:
    from agentbox.cli.commands.ending import Ending
    from agentbox.config.load import AgentConfig
    from agentbox.vm.lifecycle import VmControl
    from agentbox.vm.lima import Instance


AGENT_HELP = ("The agent whose first launch the start sets up for (default: claude, or the only one you defined): "
              "its launch then skips the setup in the VM.")
START_SETUP = "AGENTBOX_START_SETUP"  # off: start and restart leave the first launch's setup to it
YES_HELP = ("Do not ask: go on even when it ends running sessions or tasks (a script needs it then: without a "
            "terminal to ask on, nothing is changed).")


@click.command("start")
@click.option("--recreate", is_flag=True, help="Delete the VM and create it anew from the current config.")
@click.option("--yes", is_flag=True, help="With --recreate: delete without asking (for scripts).")
@click.option("--isolated", is_flag=True, help="Create the VM isolated, whatever session.mode says: agents work on "
              "a copy of the workspace and propose their changes.")
@click.option("--agent", "agent_name", metavar="NAME", help=AGENT_HELP)
@click.pass_context
def start_command(ctx: click.Context, recreate: bool, yes: bool, isolated: bool, agent_name: str | None) -> None:
    """Create and start the project's VM, and set it up for the first launch."""
    control = vm_control(ctx)
    agent = _first_launch_agent(control, agent_name)  # an unknown one, or a bad AGENTBOX_START_SETUP: refused first
    if isolated:
        control.config = workmode.with_isolation(control.config)
    name = vm_name(control)
    existing = control.instance(name)
    if recreate and existing is not None:
        # A VM without agentbox's workspace marker may be replaced; one of another workspace may not.
        lifecycle.check_workspace_matches(existing, control.config)
        ends = ending.of(control, existing)
        asked = ending.Asked(f"Delete VM {name} and its disk, then create it anew? Your workspace on the host is not "
                             "touched.", f"refusing to delete {name} for --recreate",
                             "agentbox start --recreate --yes", f"{name} kept", always=True)
        if not ending.go_ahead(ends, asked, yes):
            ending.declined(asked)
        _remove(control, name, ends)
        existing = None
    if existing is not None and isolated:
        # Refused before anything starts: the VM's mounts, fixed at creation, decide its mode.
        recorded = workmode.mode_of_vm(lifecycle.expected_config(name), control.config.workspace)
        workmode.session_mode(workmode.ISOLATED, recorded, name, workmode.asked_by(control.config))
    instance = lifecycle.ensure_running(control, name, existing)
    if instance is existing:  # it was running and passed the checks: nothing was started
        instance = lifecycle.settle_in_place(control, instance)
        if instance is existing:
            say(f"{name} is already running")
            lifecycle.note_stale_base(control.config, name)
            degraded = lifecycle.degraded_note(name, statefile.read(name))
            if degraded:
                say(degraded)
            return
    say(f"{instance.name} is running (workspace {control.config.workspace})")
    _set_up_first_launch(control, agent, instance)


def _first_launch_agent(control: VmControl, wanted: str | None) -> AgentConfig | None:
    """The agent whose first launch start and restart set up (--agent, else the default one); None when
    AGENTBOX_START_SETUP=off says not to, for this run (the test suite's VMs skip it: each start would pay for it)."""
    switch = os.environ.get(START_SETUP, "on")
    if switch not in ("on", "off"):
        raise ConfigError(f"{START_SETUP}: expected on or off, found {switch!r}",
                          hint=f"Unset it, or {START_SETUP}=off to start the VM without setting it up.")
    agent = control.config.agent(agent_named(control.config, wanted))
    return agent if switch == "on" else None


def _set_up_first_launch(control: VmControl, agent: AgentConfig | None, instance: Instance) -> None:
    """The setup the first launch of `agent` would run in the VM, done now (agentbox.session.presetup). The VM runs
    whatever happens here: a setup that fails is the first launch's to run again."""
    if agent is None:
        return
    # deferred: start-up (session.presetup and the launch's modules: only a start that started the VM runs it)
    from agentbox.session import presetup

    said: str | None = None
    try:
        code = presetup.set_up(control, agent, instance)
        if code not in (0, None):
            said = f"launch.sh exited {code}; its messages are above"
    except AgentboxError as exc:
        said = exc.message
    if said is not None:
        warn(f"{instance.name} runs, but setting it up for the first launch of {agent.name} did not finish "
             f"({said}); that launch tries the setup again")


def _remove(control: VmControl, vm_name: str, ends: Ending) -> None:
    lifecycle.delete(control, vm_name)
    settle_tasks(vm_name, f"its VM {vm_name} was removed")  # before the outbox goes with vmstate.clear
    statefile.clear(vm_name)
    ending.said(ends, f"its VM {vm_name} was removed")
    say(lifecycle.REMOVED.format(name=vm_name))


def _say_if(message: str | None) -> None:
    if message:
        say(message)


def _stop(control: VmControl, vm_name: str, instance: Instance | None, force: bool, yes: bool,
          verb: str = "stop") -> bool:
    """Stop one VM, by the rule of agentbox.cli.commands.ending when it would end sessions or tasks (`verb`: the command
    the user typed, stop or restart, which the question and a refusal name). False when a restart found nothing to
    stop (`instance` is still what is known of it)."""
    if instance is not None:
        lifecycle.check_workspace_matches(instance, control.config)
    ends = ending.of(control, instance)
    killing = " (killing it)" if force else ""
    asked = ending.Asked(f"{verb.capitalize()} {vm_name}{killing}?", f"refusing to {verb} {vm_name}",
                         f"agentbox {verb}{' --force' if force else ''} --yes", f"{vm_name} left running")
    if not ending.go_ahead(ends, asked, yes):
        ending.declined(asked)
    if verb == "restart" and (instance is None or instance.status == lima.STOPPED):
        return False  # nothing to stop: the start says what happens
    _say_if(lifecycle.stop(control, vm_name, force=force, known=instance))
    ending.said(ends, f"its VM {vm_name} was {'restarted' if verb == 'restart' else 'stopped'}")
    return True


@click.command("stop")
@click.option("--all", "stop_all", is_flag=True, help="Stop every running agentbox VM (on a terminal, each VM that "
              "runs sessions or tasks is asked about).")
@click.option("--force", is_flag=True, help="Kill the VM at once (Lima's `stop --force`) instead of shutting it "
              "down cleanly. It does not skip the question: --yes does.")
@click.option("--yes", is_flag=True, help=YES_HELP)
@click.pass_context
def stop_command(ctx: click.Context, stop_all: bool, force: bool, yes: bool) -> None:
    """Stop the project's VM (or all agentbox VMs).

    The VM's detached sessions and running tasks end with it: on a terminal they are listed and you are asked
    first; in a script it changes nothing unless --yes says to go on. Either way it says what it ended.
    """
    if stop_all:
        control = vm_control(ctx, needs_config=False)
        running = [instance for instance in control.lima.instances().values()
                   if lifecycle.is_agentbox_vm(instance) and instance.status == lima.RUNNING]
        endings = [ending.of(control, instance) for instance in running]
        killing = " (killing it)" if force else ""
        if not yes and not ending.on_terminal() and any(ends.lines() for ends in endings):
            raise ending.refused(endings, ending.Asked("", "refusing to stop every agentbox VM",
                                                       f"agentbox stop --all{' --force' if force else ''} --yes", ""))
        for instance, ends in zip(running, endings, strict=True):  # each stop has its own line
            asked = ending.Asked(f"Stop {instance.name}{killing}?", "", "", f"{instance.name} left running")
            if not ending.go_ahead(ends, asked, yes):
                say(asked.kept)
                continue
            lifecycle.stop_now(control.lima, instance.name, force, control.verbose)
            control.on_stopped(instance.name)
            ending.said(ends, f"its VM {instance.name} was stopped")
        if not running:
            say("no agentbox VM was running")
        return
    control = vm_control(ctx, needs_trust=False, vm_only=True)
    name = vm_name(control)
    _stop(control, name, control.instance(name), force, yes)


@click.command("restart")
@click.option("--yes", is_flag=True, help=YES_HELP)
@click.option("--agent", "agent_name", metavar="NAME", help=AGENT_HELP)
@click.pass_context
def restart_command(ctx: click.Context, yes: bool, agent_name: str | None) -> None:
    """Stop the project's VM if it runs, then start it with the current config, and set it up for the first launch.

    A stopped VM is started. Its detached sessions and running tasks end: on a terminal they are listed and you are
    asked first; in a script it changes nothing unless --yes says to go on. Either way it says what it ended.
    """
    control = vm_control(ctx)
    agent = _first_launch_agent(control, agent_name)
    name = vm_name(control)
    known = control.instance(name)
    if _stop(control, name, known, False, yes, verb="restart"):
        instance = lifecycle.ensure_running(control, name)
    else:  # stopped (or not created): started as it is known, without a second `limactl list`
        instance = lifecycle.ensure_running(control, name, known)
    say(f"{instance.name} is running")
    _set_up_first_launch(control, agent, instance)


@click.command("rm")
@click.option("--yes", is_flag=True, help="Do not ask (for scripts).")
@click.option("--force", "old_force", is_flag=True, hidden=True)  # the earlier name of --yes, kept for scripts
@click.pass_context
def rm_command(ctx: click.Context, yes: bool, old_force: bool) -> None:
    """Delete the project's VM and its disk.

    On a terminal it asks first, naming the sessions and tasks that would end; without one it needs --yes
    (--force, its earlier name, still works).
    """
    control = vm_control(ctx, needs_trust=False, vm_only=True)
    name = vm_name(control)
    instance = control.instance(name)
    if instance is None:
        say(f"{name} does not exist; nothing to remove")
        return
    lifecycle.check_workspace_matches(instance, control.config)
    ends = ending.of(control, instance)
    asked = ending.Asked(f"Delete VM {name} and its disk? Your workspace on the host is not touched.",
                         f"refusing to delete {name}", "agentbox rm --yes", f"{name} kept", always=True)
    if not ending.go_ahead(ends, asked, yes or old_force):
        ending.declined(asked)
    _remove(control, name, ends)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool) -> None:
    """Show the project's VM: status, workspace, resources."""
    # deferred: start-up (pushreport, report: only the commands here that use it)
    from agentbox.credentials import brokerreport, pushreport
    control = vm_control(ctx, acts=False, vm_only=True)
    config = control.config
    name = vm_name(control)
    instances = control.lima.instances()  # all of them, for who holds which host port
    instance = instances.get(name)
    conflict = lifecycle.conflict(instance, config)
    # A VM of this name that is not this workspace's is not this workspace's VM: it has none yet.
    info = lifecycle.describe(None if conflict else instance, name, str(config.workspace))
    info["workspaceRule"] = config.workspace_rule
    info["conflict"] = conflict
    info["sessionMode"] = _session_mode(config, name, instance is not None and not conflict)
    holders = forwards.Holders(instances) if instance is not None and not conflict else None
    rows = holders.rows(instance) if holders is not None and instance is not None else []
    info["ports"] = [row.to_json() for row in rows]
    network = guard.describe(config.network, name, {}, config.vm_type)
    info["network"] = {key: network[key] for key in ("mode", "enforcement", "enforcementWhy", "allowHost",
                                                      "allowLan", "proxy")}
    info["broker"] = brokerreport.of(config, name)
    info["pushes"] = pushreport.of(config, name, history=not conflict)
    if as_json:
        click.echo(json.dumps(info))
        return
    for key in ("name", "status", "workspace", "cpus", "memory", "disk", "vmType", "arch", "dir"):
        value = info[key]
        if key in ("memory", "disk") and isinstance(value, int):
            value = f"{value / (1 << 30):g}GiB"
        if key == "workspace" and value == str(config.workspace):
            value = f"{value} ({config.workspace_rule})"
        click.echo(f"{key + ':':11}{'-' if value is None else value}")
        if key == "workspace" and conflict:
            owner = conflict["workspace"]
            taken = (f"the VM {name} belongs to another workspace, {owner}" if owner else
                     f"the Lima instance {name} exists but was not created by agentbox")
            click.echo(f"{'conflict:':11}{taken}")
            click.echo(f"{'fix:':11}{lifecycle.clash_hint(config, name, foreign=owner is None)}")
    click.echo(f"{'mode:':11}{_mode_words(config, info['sessionMode'])}")
    proxy = network["proxy"]
    click.echo(f"{'network:':11}{network['mode']} (enforcement: {network['enforcement']}"
               + (f"; proxy on 127.0.0.1:{proxy['port']}" if proxy["running"] else "") + "; `agentbox net status`)")
    click.echo(visible(f"{'broker:':11}{brokerreport.summary(info['broker'])}"))
    authority = brokerreport.ca_line(info["broker"])
    if authority is not None:
        click.echo(f"{'ca:':11}{authority}")
    for index, line in enumerate(pushreport.lines(info["pushes"])):
        click.echo(visible(f"{'pushes:' if index == 0 else '':11}{line}"))
    if holders is not None and info["status"] == "Running":
        _print_ports(rows, holders)


def _session_mode(config: Any, vm_name: str, exists: bool) -> str:
    """live or isolated: the VM's (fixed when it was created), else what session.mode would create it as."""
    found = workmode.mode_of_vm(lifecycle.expected_config(vm_name), config.workspace) if exists else None
    return found or config.session_mode


def _mode_words(config: Any, mode: str) -> str:
    words = ("isolated (the agent works on a copy in the VM; `agentbox proposals` lists what it proposes)"
             if mode == "isolated" else "live (the agent edits the workspace)")
    if mode != config.session_mode:
        words += (f"; session.mode says {config.session_mode}, which `agentbox start --recreate` applies")
    return words


def _print_ports(rows: list[Any], holders: Any) -> None:
    """One line per forwarded port; a port Lima could not forward says who has its host port, and the fix."""
    if not rows:
        click.echo(f"{'ports:':11}none forwarded")
    for index, row in enumerate(rows):
        key = "ports:" if index == 0 else ""
        if row.forwarded:
            by = "agentbox port" if row.via == forwards.VIA_AGENTBOX else "Lima"
            text = f"http://{row.host_addr}/ -> {row.guest_addr} in the VM ({by})"
        else:
            text = f"{forwards.clash_text(row)}; fix: {forwards.clash_hint(row, holders)}"
        click.echo(visible(f"{key:11}{text}"))


@click.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--all", "show_all", is_flag=True, help="Include Lima instances agentbox did not create.")
@click.pass_context
def ls_command(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """List agentbox's VMs."""
    control = vm_control(ctx, needs_config=False)
    rows = [
        lifecycle.describe(instance, instance.name, lifecycle.workspace_of(instance))
        for instance in control.lima.instances().values()
        if show_all or lifecycle.is_agentbox_vm(instance)
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        say("no agentbox VMs" + ("" if show_all else " (--all shows every Lima instance)"))
        return
    tables.echo([("NAME", "STATUS", "WORKSPACE"),
                 *((visible(row["name"]), row["status"], visible(row["workspace"] or "-")) for row in rows)])


ISOLATED_HELP = ("Work on a copy of the workspace in the VM; its changes become a proposal "
                 "(`agentbox review`, `agentbox apply`). In a VM created live the copy is made aside there.")


@click.command("shell", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--isolated", is_flag=True, help=ISOLATED_HELP)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def shell_command(ctx: click.Context, isolated: bool, command: tuple[str, ...]) -> None:
    """Open a login shell in the VM, or run `-- CMD ...` there."""
    ctx.exit(run_shell(ctx, None, command, isolated))


def run_shell(ctx: click.Context, agent: str | None, command: tuple[str, ...], isolated: bool = False) -> int:
    # deferred: start-up (launch: only the commands here that use it)
    from agentbox.session import launch
    from agentbox.session.prepare import Ask

    control = vm_control(ctx)
    if isolated:
        control.config = workmode.with_isolation(control.config)
    name = vm_name(control, agent)
    argv = list(command[1:] if command[:1] == ("--",) else command)
    ask = Ask(None, busy=ProjectActivity.of(control.config), vm_name=name)
    return launch.run(control, ask, launch.Command(argv, interactive_shell=not argv))


