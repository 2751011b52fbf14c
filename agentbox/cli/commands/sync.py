"""`agentbox sync`: what of the agents' own setup the VM gets (`--show [AGENT] [--json]`), and `sync pull AGENT`.

The sync itself happens at every launch (agentbox.sync.agentsetup); these commands explain it and bring
back what was made in the VM.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from agentbox import paths
from agentbox.cli.commands.common import vm_control, warn_if_untrusted
from agentbox.errors import LimaError
from agentbox.progress import say
from agentbox.safetext import visible
from agentbox.sync import agentsetup, pull, show

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config

MAX_NAMES = 8  # a folder's names shown in the text (--json has them all)

_EPILOG = (
    "Each launch brings the launched agent's own setup (every agent's for `agentbox shell`) into the VM, "
    "filtered: hooks, status lines, helper programs and MCP servers that need your host are left out, MCP "
    "secrets too unless agents.NAME.sync.mcpSecrets is true. `sync.agentConfig: false` turns it off."
)


class SyncGroup(click.Group):
    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[--show [AGENT]] [--json]")
        formatter.write_usage(ctx.command_path, "pull AGENT [--dry-run]", prefix="   or: ")


@click.group("sync", cls=SyncGroup, invoke_without_command=True, epilog=_EPILOG)
@click.option("--show", "show", is_flag=False, flag_value="", default=None, metavar="[AGENT]",
              help="Print what a launch brings into the VM and what it leaves out, with why (the default).")
@click.option("--json", "as_json", is_flag=True,
              help='Print --show as {"agentConfig", "loginFiles", "agents": [{"agent", "vm", "folder", "guestFolder", '
                   '"onHost", "entries": [{"action", "path", "where", "why", "files", "bytes", "names"}]}]}.')
@click.pass_context
def sync_group(ctx: click.Context, show: str | None, as_json: bool) -> None:
    """Show what of your agents' own setup the VM gets; bring back what was made there."""
    if ctx.invoked_subcommand is not None:
        if show is not None or as_json:
            raise click.UsageError(f"{'--show' if show is not None else '--json'} and a sub-command do not go together")
        return
    show_sync(ctx, show or None, as_json)


@sync_group.command("pull")
@click.argument("agent")
@click.option("--dry-run", is_flag=True, help="Only list what would be copied.")
@click.pass_context
def pull_command(ctx: click.Context, agent: str, dry_run: bool) -> None:
    """Copy skills, subagents and commands made in the VM back to your home: new files only, after listing them."""
    control = vm_control(ctx)
    agent_config = _agent(control.config, agent)
    spec = agentsetup.spec_of(agent_config)
    if spec is None or not spec.pull_folders:
        raise click.UsageError(f"`{agent}` has no folders `agentbox sync pull` brings back")
    home = paths.home()
    planned = pull.plan(pull.fetch(control, agent_config, spec), spec, home)
    verb = "would copy" if dry_run else "copy"
    for incoming in planned.copy:
        click.echo(f"{verb}  ~/{_shown(incoming.relative)} ({len(incoming.data):,} bytes)")
    for skipped in planned.skipped:
        click.echo(f"skip  {skipped.shown}: {skipped.why}")
    folders = ", ".join(f"~/{spec.folder}/{folder}/" for folder in spec.pull_folders)
    if not planned.copy:
        say(f"nothing new in {folders} of the VM {agent_config.vm_name}")
        return
    if dry_run:
        say(f"{len(planned.copy)} new file(s) in the VM {agent_config.vm_name}; nothing copied (--dry-run)")
        return
    copied, failed = pull.copy(planned, spec, home)
    for skipped in failed:
        click.echo(f"skip  {skipped.shown}: {skipped.why}")
    say(f"copied {len(copied)} file(s) from the VM {agent_config.vm_name} into {folders} (without executable "
        "bits); skills and commands can run programs when used: read them before you do")


def show_sync(ctx: click.Context, name: str | None, as_json: bool) -> None:
    control = vm_control(ctx, acts=False)
    config = control.config
    warn_if_untrusted(config)
    agents = [_agent(config, name)] if name else list(config.agents.values())
    records = []
    if config.sync_agent_config:
        for agent in agents:
            if agentsetup.spec_of(agent) is None:
                if name:
                    records.append(show.unknown_agent(agent))
                continue
            try:
                instance = control.instance(agent.vm_name)
            except LimaError:
                instance = None
            records.append(show.agent_record(config, agent, agentsetup.guest_home_of(instance),
                                                 paths.staging_dir(agent.vm_name)))
    logins = [] if config.sync_agent_config else show.login_files()
    if as_json:
        click.echo(json.dumps({"agentConfig": config.sync_agent_config, "loginFiles": logins, "agents": records},
                              indent=2, ensure_ascii=False))
        return
    if not config.sync_agent_config:
        click.echo("sync.agentConfig is false: a launch brings none of the agents' own setup into the VM, "
                   f"and {' and '.join(logins)} reaches it without its MCP servers.")
    for record in records:
        _print_agent(record)


def _print_agent(record: dict[str, Any]) -> None:
    if record["folder"] is None:
        click.echo(f"{record['agent']}: agentbox knows no folder of this agent's own setup; nothing is synced")
        return
    click.echo(f"{record['agent']}: {record['folder']} -> {record['guestFolder']} in the VM {record['vm']}")
    if not record["onHost"]:
        click.echo(f"  (no {record['folder']} on this host: nothing to bring)")
    for entry in record["entries"]:
        if entry["action"] != "copy":
            inside = f" {entry['where']}" if entry["where"] else ""
            click.echo(f"  {entry['action']}  {entry['path']}{inside}: {entry['why']}")
        elif entry["names"] is None:
            click.echo(f"  copy  {entry['path']} ({entry['bytes']:,} bytes)")
        else:
            names = entry["names"]
            listed = ", ".join(names[:MAX_NAMES]) + (", ..." if len(names) > MAX_NAMES else "")
            files = entry["files"]
            click.echo(f"  copy  {entry['path']} ({files} file{'s' if files > 1 else ''}, {entry['bytes']:,} bytes: "
                       f"{listed})")


def _agent(config: Config, name: str) -> AgentConfig:
    if name not in config.agents:
        raise click.UsageError(f"no agent `{name}` (agents: {', '.join(config.agents)})")
    return config.agents[name]


def _shown(text: str) -> str:
    return visible(text)
