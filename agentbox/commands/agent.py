"""`agentbox <agent> [ARGS]...`: run an agent in the project's VM. `agentbox <agent> shell` opens a shell there,
`agentbox <agent> login` runs the agent's own login there (and its login becomes the host's:
agentbox.credentials.writeback).

Every argument reaches the agent untouched, `--help` and `--version` included, so the agent answers
them from inside the VM. A `--help`, `-h` or `--version` on its own never creates or starts a VM,
though: when the agent's VM is not running, agentbox answers from the host with what it knows (the
agent's registry entry and config) and says how to get the agent's own answer.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import click

from agentbox.agents.builtin import agent_argv, flag_subcommands, model_after

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from agentbox.config.load import AgentConfig, Config
    from agentbox.session.worktrees import Worktree
    from agentbox.vm.lifecycle import Session
    from agentbox.vm.lima import Instance

ISOLATED_FLAG = "--isolated"  # right after the agent's name: agentbox's, not the agent's
WORKTREE_FLAG = "--worktree"  # `--worktree NAME` right after the agent's name (or after --isolated): agentbox's
DETACH_FLAGS = ("--detach", "-d")  # the same: start the agent in a tmux session in the VM and return
# Asked on their own, these are questions about the agent, not work for it.
QUERIES = ("--help", "-h", "--version")
CONFIG_META = "agentbox.config.load"  # ctx.meta key: a config already loaded, reused by the help text


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
        from click.shell_completion import CompletionItem

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
                  "review`); the VM must have been created isolated.")
    @click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
    @click.pass_context
    def shell(ctx: click.Context, isolated: bool, command: tuple[str, ...]) -> int:
        from agentbox.commands.vm import run_shell

        return run_shell(ctx, name, command, isolated)

    return shell


def run_agent(ctx: click.Context, name: str, args: list[str]) -> int:
    from agentbox.commands.common import session as session_for

    # agentbox's own options come first (each once); anything after them (another --isolated too) is the agent's.
    isolated = detach = False
    while args:
        if args[0] == ISOLATED_FLAG and not isolated:
            isolated = True
        elif args[0] in DETACH_FLAGS and not detach:
            detach = True
        else:
            break
        args = args[1:]
    if detach and (args[:1] in (["shell"], ["login"]) or (len(args) == 1 and args[0] in QUERIES)):
        from agentbox.errors import UsageError

        raise UsageError(f"--detach starts the agent itself in a session; it does not go with `{args[0]}`",
                         hint=f"Run `agentbox {name} --detach [ARGS]...` for the agent.")
    if args[:1] == ["shell"]:
        command = agent_shell_command(name)
        shell_args = [ISOLATED_FLAG, *args[1:]] if isolated else args[1:]
        with command.make_context("shell", shell_args, parent=ctx) as shell_ctx:
            return int(command.invoke(shell_ctx))
    if len(args) == 1 and args[0] in QUERIES:
        return answer_query(ctx, name, args[0], isolated)
    session = session_for(ctx)
    if isolated:
        session.config = isolation_config(session.config)
    if args[:1] == ["login"]:
        return login_agent(session, name, args[1:])
    worktree = None
    if args[:1] == [WORKTREE_FLAG]:
        from agentbox.session.worktrees import session_worktree

        if len(args) < 2:
            from agentbox.errors import UsageError

            raise UsageError(f"agentbox {name} --worktree needs a NAME", hint=f"agentbox {name} --worktree fix-tests")
        worktree = session_worktree(session.config, args[1])
        args = args[2:]
    return launch_agent(session, name, args, detach=detach, worktree=worktree)


def answer_without_vm(ctx: click.Context, name: str, query: str, reason: str) -> int:
    """`agentbox AGENT --help` where no VM is meant (the home folder, say): agentbox's description, and why."""
    from agentbox.errors import StateError

    config, _ = _config_for_help(ctx)
    agent = config.agents.get(name) if config is not None else None
    binary = _shown(agent.binary if agent else _builtin_binary(name))
    why = f"{binary} was not asked: {_shown(reason).rstrip('.')}"
    if query == "--version":
        from agentbox import __version__

        raise StateError(f"{binary}'s version is that of the {binary} in a project's VM; {why}",
                         hint=f"Run `agentbox {name} --version` in a project folder (or `agentbox -C DIR {name} "
                         f"--version`). agentbox's own version is {__version__} (`agentbox --version`).")
    click.echo(ctx.command.get_help(ctx))
    click.echo(f"\nThis is agentbox's description; {why}. For {binary}'s own help run `agentbox {name} {query}` "
               f"in a project folder (or `agentbox -C DIR {name} {query}`).")
    return 0


def isolation_config(config: Config) -> Config:
    from agentbox.review import isolation

    return isolation.with_isolation(config)


def login_agent(session: Session, name: str, args: list[str]) -> int:
    """`agentbox NAME login [ARGS]`: the agent's own login command in its VM; afterwards the login is the host's too.

    The agent's OAuth callback listens on the VM's localhost, which Lima forwards to the same port of the
    host's; the VM has no browser, so the page's address is printed (launch.sh's BROWSER) for the user to open.
    """
    from agentbox.agents.builtin import BUILTIN_AGENTS
    from agentbox.agents.logins import FORMATS
    from agentbox.credentials.stage import guest_path_for
    from agentbox.errors import StateError
    from agentbox.progress import note
    from agentbox.session import launch

    agent = session.config.agent(name)
    session.config.require_workspace()
    spec = BUILTIN_AGENTS.get(name)
    binary = _shown(agent.binary)
    if spec is None or spec.login is None:
        raise StateError(
            f"agentbox does not know how {name} logs in",
            hint=f"Run `agentbox {name} shell` and log in with {binary}'s own command there; the login stays in "
            "the VM.",
        )
    hint = f": {spec.login_hint}" if spec.login_hint else ""
    note(f"logging in to {spec.summary} in the VM {agent.vm_name}{hint}")
    note("open the address it shows in a browser on this computer: Lima forwards the VM's localhost ports here, "
         "so the login page's redirect reaches it")
    if not any(guest_path_for(path)[2:] in FORMATS for path in agent.credentials):
        note(f"{spec.summary} keeps its login where agentbox does not copy it back, so the login stays in the VM")
    return launch.run_in_vm(session, agent.vm_name, [agent.binary, *spec.login, *args], agent=agent, login=True)


def launch_agent(
    session: Session, name: str, args: list[str], running: Instance | None = None, detach: bool = False,
    keep_alive: bool = True, worktree: Worktree | None = None,
) -> int:
    """Run the agent in its VM. `detach`: in a new tmux session, and return at once (agentbox.session.detached); with
    session.keepAlive (unless keep_alive is False: a --help or --version) a launch on a terminal runs in such
    a session too, attached. `worktree`: in that git worktree of the workspace."""
    from agentbox.session import launch

    agent = session.config.agent(name)
    session.config.require_workspace()
    argv = agent_argv(agent.binary, list(agent.default_args), args, agent.model, model_after(name, agent.default_args),
                      flag_subcommands(name))
    kept = launch.DETACHED if detach else launch.ATTACHED if keep_alive and launch.keeps_alive(session.config) else None
    return launch.run_in_vm(session, agent.vm_name, argv, agent=agent, running=running, keep=kept, worktree=worktree)


def answer_query(ctx: click.Context, name: str, query: str, isolated: bool = False) -> int:
    """`--help`/`-h`/`--version` alone: the agent answers when its VM runs; otherwise agentbox does, from the host.

    Costs the `limactl list` a launch makes anyway; a running VM then gets exactly the warm launch's calls.
    """
    from agentbox.commands.common import session as session_for
    from agentbox.commands.common import warn_if_untrusted
    from agentbox.config import trust
    from agentbox.errors import AgentboxError, LimaError, StateError
    from agentbox.vm import lifecycle as vm
    from agentbox.vm.lima import RUNNING

    try:
        session = session_for(ctx, acts=False)
        if isolated:
            session.config = isolation_config(session.config)
        config = session.config
        agent = config.agent(name)
        config.require_workspace()
    except AgentboxError as exc:  # no VM can be meant here (the home folder, a config that cannot be read)
        return answer_without_vm(ctx, name, query, exc.message)
    problem = None
    try:
        instance = session.instance(agent.vm_name)
    except LimaError as exc:
        instance, problem = None, exc.message
    if instance is not None:
        vm.check_ownership(instance, config)
        if instance.status == RUNNING:
            trust.require_trust(config)
            return launch_agent(session, name, [query], running=instance, keep_alive=False)
    warn_if_untrusted(config)
    binary = _shown(agent.binary)
    vm_name = agent.vm_name
    if problem is not None:
        state = f"could not be checked ({problem.rstrip('.')})"
    elif instance is None:
        state = "does not exist yet (creating it takes minutes)"
    else:
        state = f"is {instance.status.lower()}"
    how = "agentbox start" if vm_name == config.vm_name else f"agentbox {name} shell -- true"
    if query == "--version":
        from agentbox import __version__

        installed = ""
        if agent.install:
            installed = f"; agentbox installs it at the first launch with `{_shown(agent.install)}`"
        raise StateError(
            f"{binary}'s version is that of the {binary} in the VM {vm_name}, which {state}; "
            "agentbox does not create or start a VM to ask it",
            hint=f"Run `{how}`, then `agentbox {name} --version` asks {binary}{installed}. "
            f"agentbox's own version is {__version__} (`agentbox --version`).",
        )
    ctx.meta[CONFIG_META] = config
    command = ctx.command
    click.echo(command.get_help(ctx))
    click.echo(
        f"\nThis is agentbox's description; {binary} was not asked because the VM {vm_name} {state}. "
        f"For {binary}'s own help run `{how}`, then `agentbox {name} {query}`."
    )
    return 0


def _config_for_help(ctx: click.Context) -> tuple[Config | None, str | None]:
    """The config the help describes (never printed notices: help must not nag); None and why when unreadable."""
    from pathlib import Path

    from agentbox.config import load as config
    from agentbox.errors import AgentboxError

    loaded = ctx.meta.get(CONFIG_META)
    if loaded is not None:
        return loaded, None
    root = ctx.find_root()
    cwd = (root.obj or {}).get("cwd") or Path(root.params.get("directory") or ".").resolve()
    try:
        loaded = config.load(cwd)
    except AgentboxError as exc:
        return None, exc.message
    ctx.meta[CONFIG_META] = loaded
    return loaded, None


def _own_options(name: str, binary: str) -> list[tuple[str, str]]:
    return [
        ("--isolated", f"{binary} works on a copy of the workspace in the VM; its changes come back as a proposal "
                       "(`agentbox proposals`, `review`, `apply`)."),
        ("--detach, -d", f"Start {binary} in a tmux session in the VM and return; `agentbox attach` attaches to it, "
                         "`agentbox sessions` lists them."),
        ("--worktree NAME", f"Run {binary} in the git worktree .agentbox/worktrees/NAME on the branch "
                            "agentbox/NAME (made from HEAD the first time), so parallel sessions do not share files."),
    ]


def _agent_rows(
    name: str, agent: AgentConfig | None, config: Config | None, problem: str | None
) -> list[tuple[str, str]]:
    from agentbox.agents.builtin import BUILTIN_AGENTS

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
    from agentbox.agents.builtin import BUILTIN_AGENTS

    spec = BUILTIN_AGENTS.get(name)
    if spec is None or spec.login is None:
        return f"`agentbox {name} login` is not available: agentbox does not know how {binary} logs in."
    command = _shown(shlex.join([binary, *spec.login]))
    return (
        f"`agentbox {name} login [ARGS]...` runs `{command} [ARGS]...` in the VM (without the default arguments); "
        "open the address it shows in a browser on this computer. The new login then becomes the host's too "
        "(credentials.writeBack)."
    )


def _builtin_binary(name: str) -> str:
    from agentbox.agents.builtin import BUILTIN_AGENTS

    spec = BUILTIN_AGENTS.get(name)
    return spec.binary if spec else name


def _shown(text: str) -> str:
    from agentbox.safetext import visible

    return visible(text)
