"""`agentbox <agent> shell`: a shell in the VM that agent runs in, as a click command of its own (its own help)."""

from __future__ import annotations

import click


def agent_shell_command(name: str) -> click.Command:
    """`agentbox NAME shell`: the shell command of the VM this agent runs in (its own help, not bash's)."""

    @click.command(
        "shell",
        help=f"Open a login shell in the VM `agentbox {name}` runs in, or run `-- CMD ...` there and exit "
        f"with its code. That is the project's VM unless agents.{name}.vmName names another.",
        context_settings={
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
            "help_option_names": ["-h", "--help"],
        },
    )
    @click.option("--isolated", is_flag=True, help="Work on a copy of the workspace in the VM (see `agentbox help "
                  "review`); in a VM created live the copy is made aside there.")
    @click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
    @click.pass_context
    def shell(ctx: click.Context, isolated: bool, command: tuple[str, ...]) -> int:
        # deferred: start-up (cli.commands.vm: only the commands here that use it)
        from agentbox.cli.commands.vm import run_shell

        return run_shell(ctx, name, command, isolated)

    return shell
