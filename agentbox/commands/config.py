"""Config commands: `config` (show the merged config), `init` (write one), `template` (the lima.yaml it renders)."""

from __future__ import annotations

import click

from agentbox.commands.common import load_config, warn_if_untrusted
from agentbox.errors import ConfigError


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print the merged config as one JSON object.")
@click.option("--show-secrets", is_flag=True, help="Print env values instead of masking them.")
@click.pass_context
def config_command(ctx: click.Context, as_json: bool, show_secrets: bool) -> None:
    """Show the merged config and where each value came from."""
    from agentbox import configview

    loaded = load_config(ctx)
    warn_if_untrusted(loaded)
    if as_json:
        click.echo(configview.as_json(loaded, show_secrets))
    else:
        click.echo(configview.as_text(loaded, show_secrets), nl=False)
    if loaded.workspace_problem:
        click.echo(f"agentbox: warning: {loaded.workspace_problem}", err=True)


@click.command("init")
@click.option("--global", "is_global", is_flag=True, help="Write the global config instead of ./agentbox.yml.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.pass_context
def init_command(ctx: click.Context, is_global: bool, force: bool) -> None:
    """Write a commented config file to start from."""
    from agentbox import initfile

    target = initfile.write(ctx.obj["cwd"], is_global=is_global, force=force)
    click.echo(f"Wrote {target}")


@click.command("template")
@click.option("--agent", metavar="NAME", help="Render for this agent's VM (agents.NAME.vmName).")
@click.pass_context
def template_command(ctx: click.Context, agent: str | None) -> None:
    """Print the lima.yaml agentbox would create the VM from."""
    from agentbox import render, trust

    loaded = load_config(ctx)
    if agent is not None and agent not in loaded.agents:
        raise click.BadParameter(f"unknown agent {agent!r} (known: {', '.join(loaded.agents)})", param_hint="--agent")
    name = loaded.agent(agent).vm_name if agent else loaded.vm_name
    warn_if_untrusted(loaded)
    present = (("vm.template", "template" in loaded.local_data.get("vm", {})), ("caCert", "caCert" in loaded.local_data))
    named = [key for key, found in present if found]
    if named and loaded.local_file is not None and not trust.is_trusted(loaded):
        raise ConfigError(
            f"{loaded.local_file} is not trusted, and its {' and '.join(named)} would make agentbox read host files into the "
            "rendered lima.yaml; agentbox renders nothing from an untrusted config that names files",
            hint=f"Read it with `agentbox trust --show`, then `agentbox -C {loaded.local_file.parent} trust`.",
        )
    click.echo(render.render(loaded, name), nl=False)
