"""The click command line: parses arguments and hands the work to the modules that do it.

agentbox.cli.main is the entry point: it sends `agentbox AGENT [ARGS]...` straight to the launch, without click,
and everything else here. Start-up speed matters (`agentbox --help` must stay well under 150 ms), so heavy
modules are imported inside the commands that need them.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import click

from agentbox import __version__
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.cli import boundary, helpscreen
from agentbox.cli.boundary import closed_pipe, report_error
from agentbox.cli.commands.help import unknown_command
from agentbox.errors import AgentboxError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

VM_COMMANDS = ("start", "stop", "restart", "rm", "status", "ls", "shell", "port", "ports")
# Imported only when used: an agent launch should not pay for every other command's module.
LAZY_COMMANDS = {
    **{name: ("agentbox.cli.commands.vm", f"{name}_command") for name in VM_COMMANDS},
    "port": ("agentbox.cli.commands.ports", "port_command"),
    "ports": ("agentbox.cli.commands.ports", "ports_command"),
    "doctor": ("agentbox.cli.commands.doctor", "doctor_command"),
    "ca": ("agentbox.cli.commands.ca", "ca_group"),
    "base": ("agentbox.cli.commands.base", "base_group"),
    "config": ("agentbox.cli.commands.config", "config_command"),
    "init": ("agentbox.cli.commands.config", "init_command"),
    "template": ("agentbox.cli.commands.config", "template_command"),
    "describe": ("agentbox.cli.commands.describe", "describe_command"),
    "trust": ("agentbox.cli.commands.safety", "trust_command"),
    "audit": ("agentbox.cli.commands.safety", "audit_command"),
    "report": ("agentbox.cli.commands.report", "report_group"),
    "checkpoint": ("agentbox.cli.commands.checkpoint", "checkpoint_command"),
    "checkpoints": ("agentbox.cli.commands.checkpoint", "checkpoints_command"),
    "diff": ("agentbox.cli.commands.checkpoint", "diff_command"),
    "proposals": ("agentbox.cli.commands.review", "proposals_command"),
    "review": ("agentbox.cli.commands.review", "review_command"),
    "apply": ("agentbox.cli.commands.review", "apply_command"),
    "reject": ("agentbox.cli.commands.review", "reject_command"),
    "instructions": ("agentbox.cli.commands.instructions", "instructions_group"),
    "sync": ("agentbox.cli.commands.sync", "sync_group"),
    "completion": ("agentbox.cli.commands.completion", "completion_command"),
    "help": ("agentbox.cli.commands.help", "help_command"),
    "undo": ("agentbox.cli.commands.undo", "undo_command"),
    "run": ("agentbox.cli.commands.run", "run_command"),
    "tasks": ("agentbox.cli.commands.tasks", "tasks_command"),
    "logs": ("agentbox.cli.commands.taskfollow", "logs_command"),
    "wait": ("agentbox.cli.commands.taskfollow", "wait_command"),
    "cancel": ("agentbox.cli.commands.taskfollow", "cancel_command"),
    "attach": ("agentbox.cli.commands.sessions", "attach_command"),
    "sessions": ("agentbox.cli.commands.sessions", "sessions_command"),
    "update-agents": ("agentbox.cli.commands.updateagents", "update_agents_command"),
    "net": ("agentbox.cli.commands.net", "net_group"),
    "hosts": ("agentbox.cli.commands.hosts", "hosts_group"),
}
# `agentbox --help` lists the commands in these groups (agentbox.cli.helpscreen has the table: the help prints it
# without click).
COMMAND_GROUPS = helpscreen.COMMAND_GROUPS


class AgentboxGroup(click.Group):
    """Adds one command per agent (built-in and configured) and the single error boundary."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Agents first (what people run most), then the groups of --help in order: for --help and completion."""
        grouped = [name for _, rows in COMMAND_GROUPS for name, _ in rows]
        names = [*grouped, *self.commands, *LAZY_COMMANDS]
        agents = [name for name in _agent_names(ctx) if name not in names]
        return [*agents, *dict.fromkeys(names)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is not None:
            return command
        if cmd_name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[cmd_name]
            lazy: click.Command = getattr(importlib.import_module(module), attribute)
            return lazy
        if cmd_name in BUILTIN_AGENTS or cmd_name in _agent_names(ctx):
            # deferred: start-up (cli.commands.agentcommand: only the command that needs it)
            from agentbox.cli.commands.agentcommand import make_agent_command

            return make_agent_command(cmd_name, _agent_summary(ctx, cmd_name))
        return None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's lookup, with agentbox's own error (and a did-you-mean) for a command that does not exist."""
        name = args[0]
        command = self.get_command(ctx, name)
        if command is not None:
            return name, command, args[1:]
        if ctx.resilient_parsing or name.startswith("-"):  # completion; or an option, which click reports
            return super().resolve_command(ctx, args)
        raise unknown_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The agents, then each group of COMMAND_GROUPS: from the table, so no command's module is imported."""
        sections = helpscreen.sections(_configured_agents(ctx))
        listed = {name for _, rows in sections for name, _ in rows}
        rest = [name for name in self.list_commands(ctx) if name not in listed]  # a command added without a group
        if rest:
            sections.append(("Other commands", [(name, self._short_help(ctx, name)) for name in rest]))
        width = max(len(name) for _, rows in sections for name, _ in rows)
        for title, rows in sections:
            with formatter.section(title):  # one width for every section: the summaries line up
                formatter.write_dl([(name.ljust(width), summary) for name, summary in rows])

    def _short_help(self, ctx: click.Context, name: str) -> str:
        command = self.get_command(ctx, name)
        return command.get_short_help_str(limit=60) if command is not None else ""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Bare `agentbox` prints the grouped help on stdout and exits 0, as gh does (not click's usage error)."""
        if not args and not ctx.resilient_parsing:
            click.echo(ctx.get_help())
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError:  # `agentbox --help | head -1`
            raise click.exceptions.Exit(closed_pipe()) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            except AgentboxError as exc:
                report_error(exc)
                ctx.exit(exc.exit_code)
            except KeyboardInterrupt:
                ctx.exit(boundary.interrupted())
            except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, BrokenPipeError):
                raise
            except Exception as exc:
                ctx.exit(boundary.internal_error(exc))
        except BrokenPipeError:  # raised by the command or while reporting its error
            ctx.exit(closed_pipe())


def _start_dir(ctx: click.Context) -> Path:
    root = ctx.find_root()
    directory = root.params.get("directory")
    return Path(directory) if directory else Path(os.getcwd())


def _agent_names(ctx: click.Context) -> list[str]:
    """Built-in agents plus those defined in config; a broken config still lists the built-ins."""
    return helpscreen.agent_names(_configured_agents(ctx))


def _configured_agents(ctx: click.Context) -> dict[str, Any]:
    cache = ctx.find_root().meta.setdefault("agentbox.configured_agents", {})
    if "agents" not in cache:
        cache["agents"] = helpscreen.configured_agents(_start_dir(ctx))
    agents: dict[str, Any] = cache["agents"]
    return agents


def _agent_summary(ctx: click.Context, name: str) -> str:
    return helpscreen.agent_summary(_configured_agents(ctx), name)


@click.group("agentbox", cls=AgentboxGroup, context_settings=CONTEXT_SETTINGS, help=helpscreen.ROOT_HELP)
@click.version_option(__version__, "-V", "--version", prog_name="agentbox", message="%(prog)s %(version)s")
@click.option(
    "-C",
    "directory",
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False, resolve_path=True),
    is_eager=True,  # processed before --help, which lists the agents defined in DIR's config
    help=helpscreen.OPTION_HELP["-C"],
)
@click.option("-v", "--verbose", is_flag=True, help=helpscreen.OPTION_HELP["-v"])
@click.option("-q", "--quiet", is_flag=True, help=helpscreen.OPTION_HELP["-q"])
@click.option("--debug", is_flag=True, help=helpscreen.OPTION_HELP["--debug"])
@click.option("--timings", is_flag=True, help=helpscreen.OPTION_HELP["--timings"])
@click.pass_context
def cli(ctx: click.Context, directory: str | None, verbose: bool, quiet: bool, debug: bool, timings: bool) -> None:
    # its help: helpscreen.ROOT_HELP
    if quiet and verbose:
        raise click.UsageError("-q/--quiet and -v/--verbose cannot be used together.")
    boundary.begin(quiet, timings)
    ctx.call_on_close(boundary.end)  # tests run many invocations in one process
    ctx.obj = {"cwd": Path(directory) if directory else Path(os.getcwd()), "verbose": verbose, "debug": debug}
