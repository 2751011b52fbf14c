"""The click command of `agentbox <agent>`: its help (`agentbox help NAME`, from the host) and its completion.

What it runs is agentbox.cli.commands.agent, which imports no click: an agent launch reaches that without the click
command line (agentbox.cli.main). `agentbox <agent> shell` is agentbox.cli.commands.agentshell.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import click
from click.shell_completion import CompletionItem

from agentbox.agents.argv import agent_argv
from agentbox.agents.builtin import BUILTIN_AGENTS, flag_subcommands, model_after
from agentbox.cli.commands.agent import _builtin_binary, _config_for_help, _shown, run_agent

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from agentbox.config.load import AgentConfig, Config


class PassthroughCommand(click.Command):
    """Hands every argument to the agent untouched: click would otherwise swallow a `--`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.args = list(args)
        return ctx.args


class AgentCommand(PassthroughCommand):
    """One agent's command; its help (`agentbox help NAME`) describes what agentbox runs, from the host."""

    def __init__(self, name: str, summary: str, **kwargs: Any) -> None:
        super().__init__(
            name,
            short_help=summary,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
            add_help_option=False,
            **kwargs,
        )
        self.summary = summary

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[--isolated] [--detach|-d] [--worktree NAME] [ARGS]...")
        formatter.write_usage(ctx.command_path, "shell [-- CMD...]", prefix="   or: ")
        formatter.write_usage(ctx.command_path, "login [ARGS]...", prefix="   or: ")
        formatter.write_usage(ctx.command_path, "--on HOST --detach|-d [ARGS]...", prefix="   or: ")

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        name = self.name or ""
        config, problem = _config_for_help(ctx)
        agent = config.agents.get(name) if config is not None else None
        binary = _shown(agent.binary if agent else _builtin_binary(name))
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(f"{self.summary}.")
            formatter.write_paragraph()
            formatter.write_text(
                f"Every argument reaches {binary} unchanged, --help and --version included: "
                f"`agentbox {name} --help` shows {binary}'s own help, from the VM. A --help, -h or --version "
                "on its own never creates or starts a VM: when the VM is not running, agentbox answers "
                "from the host instead."
            )
        with formatter.section(f"agentbox's own options (right after `{name}`; every other argument is {binary}'s)"):
            formatter.write_dl(_own_options(name, binary))
        with formatter.section("What agentbox runs"):
            formatter.write_dl(_agent_rows(name, agent, config, problem))
        formatter.write_paragraph()
        with formatter.indentation():
            formatter.write_text(
                f"`agentbox {name} shell` opens a login shell in that VM; `agentbox {name} shell -- CMD...` runs CMD "
                f"there (`agentbox {name} shell --help`)."
            )
            formatter.write_paragraph()
            formatter.write_text(_login_help(name, binary))

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """`shell` right after the agent's name, file names everywhere (the agent takes any argument)."""
        items = []
        if not ctx.args and "shell".startswith(incomplete):
            items.append(CompletionItem("shell", help=f"a shell in {self.name}'s VM"))
        if not ctx.args and "login".startswith(incomplete):
            items.append(CompletionItem("login", help=f"log {self.name} in, in its VM and on this computer"))
        return [*items, CompletionItem(incomplete, type="file")]


def make_agent_command(name: str, summary: str) -> click.Command:
    @click.pass_context
    def agent_command(ctx: click.Context) -> None:
        ctx.exit(run_agent(ctx, name, list(ctx.args)))

    return AgentCommand(name, summary, callback=agent_command)


def _own_options(name: str, binary: str) -> list[tuple[str, str]]:
    return [
        ("--isolated", f"{binary} works on a copy of the workspace in the VM; its changes come back as a proposal "
                       "(`agentbox proposals`, `review`, `apply`)."),
        ("--detach, -d", f"Start {binary} in a tmux session in the VM and return; `agentbox attach` attaches to it, "
                         "`agentbox sessions` lists them."),
        ("--worktree NAME", f"Run {binary} in the git worktree .agentbox/worktrees/NAME on the branch "
                            "agentbox/NAME (made from HEAD the first time), so parallel sessions do not share files."),
        ("--on HOST", f"With --detach: start {binary} in a session on HOST (`agentbox hosts add`), on a copy of the "
                      "workspace; it is a task (`agentbox tasks`, `cancel`), `agentbox attach ID` joins it over ssh, "
                      "and its changes come back as a proposal when it ends."),
    ]


def _agent_rows(
    name: str, agent: AgentConfig | None, config: Config | None, problem: str | None
) -> list[tuple[str, str]]:
    if agent is None:  # the config could not be read: the built-in entry is all there is to show
        spec = BUILTIN_AGENTS[name]
        rows = [("runs", _shown(shlex.join([spec.binary, *spec.default_args])) + " [ARGS]...")]
        if spec.install:
            rows.append(("install", _shown(spec.install)))
        return [*rows, ("config", f"not read: {_shown(problem or '')}")]
    binary = _shown(agent.binary)
    after = model_after(name, agent.default_args)
    runs = _shown(shlex.join(agent_argv(agent.binary, list(agent.default_args), [], agent.model, after))) + " [ARGS]..."
    if agent.model and after is not None:
        runs += " (--model is left out when ARGS has --model or -m)"
    for sub in flag_subcommands(name) or ():
        argv = agent_argv(agent.binary, list(agent.default_args), [sub], agent.model, after, (sub,))
        shown = _shown(shlex.join(argv))
        runs += f"; `{sub} ARGS...` runs {shown} ARGS..."
    if flag_subcommands(name) is not None:
        runs += "; other sub-commands get none of these options"
    elif agent.model:
        runs += (
            f" (model {_shown(agent.model)} is not passed: defaultArgs lack `{BUILTIN_AGENTS[name].model_after_arg}`)"
        )
    if agent.install:
        install = f"{_shown(agent.install)} (in the VM, at a launch that finds {binary} missing)"
    else:
        install = f"none: {binary} must already be in the VM"
    own_vm = config is None or agent.vm_name != config.vm_name
    logins = ", ".join(_shown(path) for path in agent.credentials)
    return [
        ("runs", runs),
        ("install", install),
        ("VM", f"{agent.vm_name} (agents.{name}.vmName)" if own_vm else "the project's VM (this folder is no project)"
         if config is not None and config.workspace_problem else f"{agent.vm_name} (the project's VM)"),
        ("logins", f"{logins} (copied into the VM at each launch)" if logins else "none copied into the VM"),
    ]


def _login_help(name: str, binary: str) -> str:
    spec = BUILTIN_AGENTS.get(name)
    if spec is None or spec.login is None:
        return f"`agentbox {name} login` is not available: agentbox does not know how {binary} logs in."
    command = _shown(shlex.join([binary, *spec.login]))
    return (
        f"`agentbox {name} login [ARGS]...` runs `{command} [ARGS]...` in the VM (without the default arguments); "
        "open the address it shows in a browser on this computer. The new login then becomes the host's too "
        "(credentials.writeBack)."
    )
