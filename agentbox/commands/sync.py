"""`agentbox sync`: what of the agents' own setup the VM gets (`--show [AGENT]`), and `sync pull AGENT`.

The sync itself happens at every launch (agentbox.sync.stage); these commands explain it and bring
back what was made in the VM.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from agentbox import paths
from agentbox.progress import say

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.sync.stage import FileView
    from agentbox.sync.transform import Context

_EPILOG = (
    "Each launch brings the launched agent's own setup (every agent's for `agentbox shell`) into the VM, "
    "filtered: hooks, status lines, helper programs and MCP servers that need your host are left out, MCP "
    "secrets too unless agents.NAME.sync.mcpSecrets is true. `sync.agentConfig: false` turns it off."
)


class SyncGroup(click.Group):
    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[--show [AGENT]]")
        formatter.write_usage(ctx.command_path, "pull AGENT [--dry-run]", prefix="   or: ")


@click.group("sync", cls=SyncGroup, invoke_without_command=True, epilog=_EPILOG)
@click.option("--show", "show", is_flag=False, flag_value="", default=None, metavar="[AGENT]",
              help="Print what a launch brings into the VM and what it leaves out, with why (the default).")
@click.pass_context
def sync_group(ctx: click.Context, show: str | None) -> None:
    """Show what of your agents' own setup the VM gets; bring back what was made there."""
    if ctx.invoked_subcommand is not None:
        if show is not None:
            raise click.UsageError("--show and a sub-command do not go together")
        return
    show_sync(ctx, show or None)


@sync_group.command("pull")
@click.argument("agent")
@click.option("--dry-run", is_flag=True, help="Only list what would be copied.")
@click.pass_context
def pull_command(ctx: click.Context, agent: str, dry_run: bool) -> None:
    """Copy skills, subagents and commands made in the VM back to your home: new files only, after listing them."""
    from agentbox import paths
    from agentbox.commands.common import session as session_for
    from agentbox.sync import pull as syncpull
    from agentbox.sync import stage as agentsync

    session = session_for(ctx)
    agent_config = _agent(session.config, agent)
    spec = agentsync.spec_of(agent_config)
    if spec is None or not spec.pull_folders:
        raise click.UsageError(f"`{agent}` has no folders `agentbox sync pull` brings back")
    home = paths.home()
    pull = syncpull.plan(syncpull.fetch(session, agent_config, spec), spec, home)
    verb = "would copy" if dry_run else "copy"
    for incoming in pull.copy:
        click.echo(f"{verb}  ~/{_shown(incoming.relative)} ({len(incoming.data):,} bytes)")
    for skipped in pull.skipped:
        click.echo(f"skip  {skipped.shown}: {skipped.why}")
    folders = ", ".join(f"~/{spec.folder}/{folder}/" for folder in spec.pull_folders)
    if not pull.copy:
        say(f"nothing new in {folders} of the VM {agent_config.vm_name}")
        return
    if dry_run:
        say(f"{len(pull.copy)} new file(s) in the VM {agent_config.vm_name}; nothing copied (--dry-run)")
        return
    copied, failed = syncpull.copy(pull, spec, home)
    for skipped in failed:
        click.echo(f"skip  {skipped.shown}: {skipped.why}")
    say(f"copied {len(copied)} file(s) from the VM {agent_config.vm_name} into {folders} (without executable "
        "bits); skills and commands can run programs when used: read them before you do")


def show_sync(ctx: click.Context, name: str | None) -> None:
    from agentbox.commands.common import session as session_for
    from agentbox.commands.common import warn_if_untrusted
    from agentbox.errors import LimaError
    from agentbox.sync import stage as agentsync

    session = session_for(ctx, acts=False)
    config = session.config
    warn_if_untrusted(config)
    agents = [_agent(config, name)] if name else list(config.agents.values())
    if not config.sync_agent_config:
        from agentbox.agents.builtin import BUILTIN_AGENTS

        logins = [f"~/{relative}" for spec in BUILTIN_AGENTS.values() for relative, _ in spec.login_transforms]
        click.echo("sync.agentConfig is false: a launch brings none of the agents' own setup into the VM, "
                   f"and {' and '.join(logins)} reaches it without its MCP servers.")
        return
    for agent in agents:
        if agentsync.spec_of(agent) is None:
            if name:
                click.echo(f"{agent.name}: agentbox knows no folder of this agent's own setup; nothing is synced")
            continue
        try:
            instance = session.instance(agent.vm_name)
        except LimaError:
            instance = None
        guest_home = agentsync.guest_home_of(instance)
        _show_agent(config, agent, guest_home, paths.staging_dir(agent.vm_name))


def _show_agent(config: Config, agent: AgentConfig, guest_home: str, staging_folder: Path) -> None:
    from agentbox import paths
    from agentbox.sync import stage as agentsync

    spec = agentsync.spec_of(agent)
    assert spec is not None and spec.folder is not None
    collected = agentsync.collect(agent, spec, paths.home())
    context = agentsync.context_for(config, agent, guest_home, staging_folder)
    click.echo(f"{agent.name}: ~/{spec.folder} -> {guest_home}/{spec.folder} in the VM {agent.vm_name}")
    if not (paths.home() / spec.folder).is_dir():
        click.echo(f"  (no ~/{spec.folder} on this host: nothing to bring)")
    builtin = [entry.rstrip("/") for entry in spec.sync_items]
    groups: dict[str, list[FileView]] = {}
    for item in collected.items:
        entry = next((e for e in builtin if item.inner == e or item.inner.startswith(e + "/")),
                     item.inner.split("/")[0])
        groups.setdefault(entry, []).append(agentsync.view_of(item, context))
    for entry, group in groups.items():
        good = [view for view in group if view.problem is None]
        if len(group) == 1 and group[0].item.inner == entry:
            if good:
                click.echo(f"  copy  ~/{spec.folder}/{_shown(entry)} ({good[0].size:,} bytes)")
        elif good:
            names = sorted({view.item.inner[len(entry) + 1:].split("/")[0] for view in good})
            listed = ", ".join(_shown(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
            click.echo(f"  copy  ~/{spec.folder}/{_shown(entry)}/ ({len(good)} file{'s' if len(good) > 1 else ''}, "
                       f"{sum(view.size for view in good):,} bytes: {listed})")
        for view in group:
            _print_notes(view)
    for relative, transform in spec.login_transforms:
        _show_login_file(config, agent, spec.title, relative, transform, context)
    for dropped in collected.dropped:
        click.echo(f"  drop  {dropped.shown}: {_shown(dropped.why)}")


def _print_notes(view: FileView) -> None:
    shown = f"~/{_shown(view.item.relative)}"
    if view.problem:
        click.echo(f"  drop  {shown}: {_shown(view.problem)} (the launch goes on without it)")
    for note in view.notes:
        _print_note(shown, note.what, note.where, note.why)


def _print_note(shown: str, what: str, where: str, why: str) -> None:
    label = {"dropped": "drop", "changed": "edit", "kept": "keep"}.get(what, what)
    inside = f" {_shown(where)}" if where else ""
    click.echo(f"  {label}  {shown}{inside}: {_shown(why)}")


def _show_login_file(
    config: Config, agent: AgentConfig, title: str, relative: str, transform: str, context: Context
) -> None:
    """A login file that also holds the agent's setup (AgentSpec.login_transforms: ~/.claude.json)."""
    import os

    from agentbox import paths
    from agentbox.sync import stage as agentsync
    from agentbox.sync import transform as synctransform

    path = paths.home() / relative
    shown = f"~/{relative}"
    if not path.is_file():
        return
    if not config.credentials.enabled or shown not in agent.credentials:
        click.echo(f"  drop  {shown}: it is one of {title}'s login files, which this config does not "
                   "bring (credentials), so its MCP servers stay on the host too")
        return
    notes: list[synctransform.Note] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            synctransform.LOGIN_TRANSFORMS[transform](handle.read(agentsync.MAX_FILE), context, notes, True)
    except synctransform.Unusable as exc:
        click.echo(f"  drop  {shown}: {_shown(str(exc))} (the launch goes on without it)")
        return
    except OSError as exc:
        click.echo(f"  drop  {shown}: cannot read it ({exc.strerror})")
        return
    for note in notes:
        _print_note(shown, note.what, note.where, note.why)


def _agent(config: Config, name: str) -> AgentConfig:
    if name not in config.agents:
        raise click.UsageError(f"no agent `{name}` (agents: {', '.join(config.agents)})")
    return config.agents[name]


def _shown(text: str) -> str:
    from agentbox.safetext import visible

    return visible(text)
