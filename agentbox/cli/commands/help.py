"""`agentbox help [COMMAND]...` (like `git help`), and the did-you-mean error for a command that does not exist."""

from __future__ import annotations

import difflib
import shlex
from typing import TYPE_CHECKING

import click
from click.shell_completion import CompletionItem

from agentbox.cli.commands.agentshell import agent_shell_command
from agentbox.errors import UsageError
from agentbox.safetext import visible

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem


def _complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    words = list(ctx.params.get("words") or ())
    try:
        command, command_ctx = resolve(ctx, words)
    except UsageError:
        return []
    return [CompletionItem(name) for name in subcommand_names(command, command_ctx) if name.startswith(incomplete)]


@click.command("help", short_help="Show agentbox's help, or the help of COMMAND.")
@click.argument("words", nargs=-1, metavar="[COMMAND]...", shell_complete=_complete)
@click.pass_context
def help_command(ctx: click.Context, words: tuple[str, ...]) -> None:
    """Show agentbox's help, or a command's: `agentbox help claude`."""
    command, command_ctx = resolve(ctx, list(words))
    click.echo(command.get_help(command_ctx), color=ctx.color)


def resolve(ctx: click.Context, words: list[str]) -> tuple[click.Command, click.Context]:
    """The command that `agentbox WORDS...` names, with a context for its help (nothing is parsed or run)."""
    # deferred: start-up (cli.commands.agentcommand: only the commands here that use it)
    from agentbox.cli.commands.agentcommand import AgentCommand
    root = ctx.find_root()
    command: click.Command = root.command
    command_ctx = root
    for index, word in enumerate(words):
        found: click.Command | None = None
        if isinstance(command, click.Group):
            found = command.get_command(command_ctx, word)
        elif isinstance(command, AgentCommand) and word == "shell":
            found = agent_shell_command(command.name or "")
        if found is None:
            if index == 0:
                raise unknown_command(command_ctx, word)
            path = " ".join(["agentbox", *words[:index]])
            raise UsageError(
                f"`{path}` has no command `{_visible(word)}`",
                hint=f"`agentbox help {' '.join(words[:index])}` shows what it takes.",
            )
        command = found
        command_ctx = click.Context(command, info_name=word, parent=command_ctx)
    return command, command_ctx


def subcommand_names(command: click.Command, ctx: click.Context) -> list[str]:
    # deferred: start-up (cli.commands.agentcommand: only the commands here that use it)
    from agentbox.cli.commands.agentcommand import AgentCommand

    if isinstance(command, click.Group):
        return command.list_commands(ctx)
    return ["shell"] if isinstance(command, AgentCommand) else []


def unknown_command(ctx: click.Context, name: str) -> UsageError:
    """`agentbox NAME` where NAME is no command: the closest command, or how to run a program of that name."""
    group = ctx.find_root().command
    assert isinstance(group, click.Group)
    names = group.list_commands(ctx)
    lowered = {candidate.lower(): candidate for candidate in names}
    if name.lower() in lowered:
        close = [lowered[name.lower()]]
    else:
        scored = sorted(((difflib.SequenceMatcher(None, name, c).ratio(), c) for c in names), reverse=True)
        # Like git: every command about as close as the closest one (`stat`: start and status).
        close = [c for score, c in scored if score >= 0.6 and score >= scored[0][0] - 0.1][:3]
    if close:
        hint = "Did you mean " + " or ".join(f"`agentbox {c}`" for c in close) + "?"
    else:
        hint = (
            f"`agentbox --help` lists the commands. To run a program in the VM: `agentbox shell -- {_quoted(name)}`; "
            f"to add an agent, define agents.NAME (with its binary) in agentbox.yml."
        )
    return UsageError(f"unknown command `{_visible(name)}`", hint=hint)


def _quoted(word: str) -> str:
    return _visible(shlex.quote(word))


def _visible(word: str) -> str:
    return visible(word)
