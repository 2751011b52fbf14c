"""`agentbox completion SHELL`: print the shell completion script (click generates it)."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class


@click.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
@click.pass_context
def completion_command(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script."""
    completion_class = get_completion_class(shell)
    assert completion_class is not None
    click.echo(completion_class(ctx.find_root().command, {}, "agentbox", "_AGENTBOX_COMPLETE").source())
