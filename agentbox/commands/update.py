"""`agentbox update-agents [AGENT]...`: update the agent CLIs inside the project's VM (agentbox.sync.update).

It costs `limactl list` and one `limactl shell` per VM (an agent with agents.NAME.vmName has its own VM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config


@click.command("update-agents")
@click.argument("agents", nargs=-1, metavar="[AGENT]...")
@click.pass_context
def update_agents_command(ctx: click.Context, agents: tuple[str, ...]) -> None:
    """Update the agent CLIs in the project's VM to their latest release, without a new VM.

    Each agent is updated its own way: `npm install -g PACKAGE@latest` for the npm ones (in the VM user's
    ~/.local), its install command again for the others. Without AGENT: every agent installed in the VM.
    Prints each one's old and new version; exits 1 naming any agent whose update failed.
    """
    from agentbox.commands.common import session as session_for
    from agentbox.errors import AgentboxError, StateError
    from agentbox.progress import Progress, emit, say
    from agentbox.safetext import visible
    from agentbox.sync import update as agentupdate
    from agentbox.vm import lifecycle as vm

    session = session_for(ctx)
    config = session.config
    config.require_workspace()
    chosen = _chosen(config, agents)
    failed: list[str] = []
    for vm_name, group in _by_vm(chosen).items():
        instance = session.instance(vm_name)
        if instance is None:
            say(f"{vm_name} does not exist yet; its agents are installed, at their latest, by their first launch")
            continue
        vm.ensure_running(session, vm_name, instance)
        argv = agentupdate.script_argv(group, named=bool(agents))
        with Progress(f"Updating agents in VM {vm_name}", verbose=session.verbose):
            code, stdout, stderr = session.lima.shell_bytes(vm_name, argv, agentupdate.OUTPUT_LIMIT)
        outcomes = agentupdate.parse(stdout, group)
        for outcome in outcomes:
            if outcome.status in (agentupdate.UPDATED, agentupdate.UNCHANGED):
                click.echo(outcome.describe())
            elif outcome.status == agentupdate.MISSING and agents:
                failed.append(outcome.agent)
                emit(visible(f"agentbox: {outcome.agent} is not installed in {vm_name} (`agentbox {outcome.agent}` "
                             "installs it)"))
            elif outcome.status == agentupdate.FAILED:
                failed.append(outcome.agent)
        if code == 255 and not stdout:
            raise StateError(f"could not reach {vm_name} to update its agents (ssh exit 255)",
                             hint="`agentbox restart` restarts the VM; then run the command again.")
        if any(outcome.status == agentupdate.FAILED for outcome in outcomes):
            for line in stderr.splitlines()[-40:]:
                emit(visible(f"  {line}"))
        if not any(outcome.status != agentupdate.MISSING for outcome in outcomes) and not agents:
            say(f"no agent is installed in {vm_name} yet; each installs at its first launch")
    if failed:
        commands = "; ".join(f"{name}: `{agentupdate.update_command(config.agent(name))}`" for name in failed)
        raise AgentboxError(
            visible(f"updating {', '.join(failed)} failed" + ("" if len(failed) == 1 else " (each)")),
            hint=visible(f"What it printed last is above. The update commands ({commands}) can be run by hand in "
                         "`agentbox shell`; the other agents were updated."),
        )


def _chosen(config: Config, names: tuple[str, ...]) -> list[AgentConfig]:
    """The agents named (each must exist and have an update command), or the project VM's agents that have one."""
    from agentbox.errors import UsageError
    from agentbox.safetext import visible
    from agentbox.sync import update as agentupdate

    if not names:
        return [agent for agent in config.agents.values()
                if agent.vm_name == config.vm_name and agentupdate.update_command(agent)]
    chosen = []
    for name in dict.fromkeys(names):
        if name not in config.agents:
            raise UsageError(visible(f"no agent `{name}`"), hint=f"Agents: {', '.join(config.agents)}.")
        agent = config.agent(name)
        if not agentupdate.update_command(agent):
            raise UsageError(visible(f"`{name}` has no install command, so agentbox cannot update it"),
                             hint=f"Set agents.{name}.install to the command that installs its latest release.")
        chosen.append(agent)
    return chosen


def _by_vm(agents: list[AgentConfig]) -> dict[str, list[AgentConfig]]:
    groups: dict[str, list[AgentConfig]] = {}
    for agent in agents:
        groups.setdefault(agent.vm_name, []).append(agent)
    return groups
