"""`agentbox <agent> [ARGS]...`: run an agent in the project's VM. `agentbox <agent> shell` opens a shell there."""

from __future__ import annotations

import click

MODEL_FLAGS = ("--model", "-m")


class PassthroughCommand(click.Command):
    """Hands every argument to the agent untouched: click would otherwise swallow a `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.args = list(args)
        return ctx.args


def make_agent_command(name: str, summary: str) -> click.Command:
    @click.command(
        name,
        cls=PassthroughCommand,
        help=f"{summary}. Arguments are passed to the agent unchanged (try `agentbox {name} --help`).",
        short_help=summary,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
        add_help_option=False,
    )
    @click.pass_context
    def agent_command(ctx: click.Context) -> None:
        ctx.exit(run_agent(ctx, name, list(ctx.args)))

    return agent_command


def run_agent(ctx: click.Context, name: str, args: list[str]) -> int:
    from agentbox import launch
    from agentbox.commands.common import session as session_for

    if args[:1] == ["shell"]:
        from agentbox.commands.vm import run_shell

        return run_shell(ctx, name, tuple(args[1:]))
    session = session_for(ctx)
    agent = session.config.agent(name)
    session.config.require_workspace()
    argv = agent_argv(agent.binary, list(agent.default_args), args, agent.model, model_after(name, agent.default_args))
    return launch.run_in_vm(session, agent.vm_name, argv, agent=agent)


def model_after(name: str, default_args: tuple[str, ...]) -> int | None:
    """Where --model goes: first, or right after the agent's anchor argument (kiro's `chat`).

    None when the anchor is missing (custom kiro args without `chat`): like the previous agentbox,
    no model is added then, since kiro's other subcommands take no --model.
    """
    from agentbox.agents import BUILTIN_AGENTS

    spec = BUILTIN_AGENTS.get(name)
    anchor = spec.model_after_arg if spec else None
    if anchor is None:
        return 0
    return default_args.index(anchor) + 1 if anchor in default_args else None


def agent_argv(
    binary: str, default_args: list[str], user_args: list[str], model: str | None, after: int | None
) -> list[str]:
    args = [*default_args, *user_args]
    if model and after is not None and not any(a in MODEL_FLAGS or a.startswith("--model=") for a in user_args):
        args[after:after] = ["--model", model]
    return [binary, *args]
