"""Config commands: `config` (show the merged config), `init` (write one), `template` (the lima.yaml it renders)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from agentbox import paths
from agentbox.cli.commands import init
from agentbox.cli.commands.common import load_config, warn_if_untrusted
from agentbox.config import view
from agentbox.errors import ConfigError
from agentbox.git import dirs
from agentbox.progress import warn
from agentbox.safetext import visible


class ConfigGroup(click.Group):
    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[--json [--sources]] [--changed] [--show-secrets]")
        formatter.write_usage(ctx.command_path, "get KEY [--show-secrets]", prefix="   or: ")


@click.group("config", cls=ConfigGroup, invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the merged config as one JSON object.")
@click.option("--sources", is_flag=True,
              help='With --json: print {"config": ..., "sources": {KEY: where its value came from}}.')
@click.option("--changed", is_flag=True,
              help="Only the keys your config files set to something other than the default (with --json: "
                   '{KEY: value}).')
@click.option("--show-secrets", is_flag=True, help="Print env values instead of masking them.")
@click.pass_context
def config_command(ctx: click.Context, as_json: bool, sources: bool, changed: bool, show_secrets: bool) -> None:
    """Show the merged config and where each value came from; `config get KEY` prints one key's value."""
    if ctx.invoked_subcommand is not None:
        if as_json or sources or changed or show_secrets:
            raise click.UsageError(f"the options of `config` go before nothing else: `agentbox config "
                                   f"{ctx.invoked_subcommand}` takes its own")
        return
    if sources and not as_json:
        raise click.UsageError("--sources goes with --json (the text view always shows where values came from)")
    if sources and changed:
        raise click.UsageError("--sources and --changed do not go together (--changed --json gives {KEY: value})")
    loaded = load_config(ctx, describe=True)
    warn_if_untrusted(loaded)
    if as_json and changed:
        click.echo(view.changed_json(loaded, show_secrets))
    elif as_json:
        click.echo(view.as_json(loaded, show_secrets, with_sources=sources))
    else:
        click.echo(view.as_text(loaded, show_secrets, width=_width(), only_changed=changed), nl=False)
    if loaded.workspace_problem:
        warn(loaded.workspace_problem)


@config_command.command("get")
@click.argument("key")
@click.option("--show-secrets", is_flag=True, help="Print an env value instead of masking it.")
@click.pass_context
def get_command(ctx: click.Context, key: str, show_secrets: bool) -> None:
    """Print one key's effective value (`vm.cpus`, `agents.claude.model`, `mounts[0].location`): a string as it
    is, anything else as JSON; a section (`vm`, `agents.claude`) as one JSON object."""
    loaded = load_config(ctx, describe=True)
    click.echo(view.value_of(loaded, key, show_secrets))


def _width() -> int:
    """The terminal's width (or $COLUMNS); 100 when the output goes to a pipe or file."""
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return shutil.get_terminal_size((100, 24)).columns
    return 100


@click.command("init")
@click.option("--global", "is_global", is_flag=True, help="Write the global config instead of ./agentbox.yml.")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
@click.option("--force", "old_force", is_flag=True, hidden=True)  # the earlier name of --overwrite, kept for scripts
@click.option("--vm-name", metavar="NAME",
              help="Write ./agentbox.yml with only `vm.name: NAME` enabled, and trust it (you typed the name).")
@click.pass_context
def init_command(ctx: click.Context, is_global: bool, overwrite: bool, old_force: bool, vm_name: str | None) -> None:
    """Write a commented config file to start from (--force, the earlier name of --overwrite, still works)."""
    cwd = ctx.obj["cwd"]
    target = init.write(cwd, is_global=is_global, overwrite=overwrite or old_force, vm_name=vm_name)
    click.echo(f"Wrote {target}")
    if vm_name is not None:
        init.trust_written(cwd, target)
        click.echo(f"Trusted it: the VM of {target.parent} is {vm_name}.", err=True)
    if is_global:
        return
    here = Path(os.path.realpath(cwd))
    top = dirs.work_tree_top(here, Path(os.path.realpath(paths.home())))
    if top is not None and top != here:
        click.echo(
            visible(f"agentbox: note: the workspace is now {here}, the folder of this file, not the git work tree "
                    f"{top}: the VM does not see the rest of the repository or its .git. For the whole repository, "
                    f"move the file to {top}."),
            err=True,
        )


@click.command("template")
@click.option("--agent", metavar="NAME", help="Render for this agent's VM (agents.NAME.vmName).")
@click.pass_context
def template_command(ctx: click.Context, agent: str | None) -> None:
    """Print the lima.yaml agentbox would create the VM from."""
    # deferred: start-up (trust, render: only the commands here that use it)
    from agentbox.config import trust
    from agentbox.vm import render

    loaded = load_config(ctx)
    if agent is not None and agent not in loaded.agents:
        raise click.BadParameter(f"unknown agent {agent!r} (known: {', '.join(loaded.agents)})", param_hint="--agent")
    vm_name = loaded.agent(agent).vm_name if agent else loaded.vm_name
    warn_if_untrusted(loaded)
    present = (
        ("vm.template", "template" in loaded.local_data.get("vm", {})),
        ("caCert", "caCert" in loaded.local_data),
        ("vm.image", "image" in loaded.local_data.get("vm", {}) and bool(loaded.image and loaded.image.host_paths())),
    )
    named = [key for key, found in present if found]
    if named and loaded.local_file is not None and not trust.is_trusted(loaded):
        raise ConfigError(
            f"{loaded.local_file} is not trusted, and its {' and '.join(named)} would make agentbox read host files "
            "into the rendered lima.yaml; agentbox renders nothing from an untrusted config that names files",
            hint=f"Read it with `agentbox trust --show`, then `agentbox -C {loaded.local_file.parent} trust`.",
        )
    click.echo(render.render(loaded, vm_name), nl=False)
