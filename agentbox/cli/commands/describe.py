"""`agentbox describe`: what the agent is told about its sandbox, printed on the host."""

from __future__ import annotations

import click

from agentbox.cli import describetext
from agentbox.cli.commands.common import load_config, warn_if_untrusted
from agentbox.errors import ConfigError
from agentbox.vm import lifecycle, statefile, workmode


@click.command("describe")
@click.option("--json", "as_json", is_flag=True,
              help="Print the document the agent reads in /run/agentbox/context.json.")
@click.option("--agent", "agent_name", metavar="AGENT",
              help="Describe a launch of AGENT (whose login files it brings); without it, `agentbox shell`'s.")
@click.pass_context
def describe_command(ctx: click.Context, as_json: bool, agent_name: str | None) -> None:
    """Print what the agent is told about its sandbox.

    The same description a launch installs as /run/agentbox/context.json, with the block it keeps in the
    agents' memory files; printed without asking Lima or starting the VM. The VM's resources and mounts
    are those the last launch saw (before any launch: what the config asks for); the tools are looked up
    in the VM only at a launch.
    """
    # deferred: start-up (context: only the commands here that use it)
    from agentbox.session import context

    loaded = load_config(ctx, describe=True)
    warn_if_untrusted(loaded)
    agent = None
    if agent_name is not None:
        if agent_name not in loaded.agents:
            raise ConfigError(f"--agent: there is no agent {agent_name!r}",
                              hint=f"Agents: {', '.join(sorted(loaded.agents))}.")
        agent = loaded.agent(agent_name)
    vm_name = agent.vm_name if agent is not None else loaded.vm_name
    # The VM decides: one created isolated stays so until it is recreated (agentbox.review.isolation).
    made = workmode.mode_of_vm(lifecycle.expected_config(vm_name, statefile.read(vm_name)), loaded.require_workspace())
    document = context.build(loaded, vm_name, agent, mode=made or loaded.session_mode)
    if as_json:
        click.echo(context.dump(document), nl=False)
    else:
        click.echo(describetext.as_text(document, context.memory_block(document)), nl=False)
