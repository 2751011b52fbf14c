"""`agentbox <agent> [ARGS]...`: run an agent in the project's VM. `agentbox <agent> shell` opens a shell there,
`agentbox <agent> login` runs the agent's own login there (and its login becomes the host's: through the
credential broker, inside the login window this command opens, agentbox.credentials.loginwindow; without the
broker, agentbox.credentials.writeback).

Every argument reaches the agent untouched, `--help` and `--version` included, so the agent answers
them from inside the VM. A `--help`, `-h` or `--version` on its own never creates or starts a VM,
though: when the agent's VM is not running, agentbox answers from the host with what it knows (the
agent's registry entry and config) and says how to get the agent's own answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentbox import __version__
from agentbox.agents.argv import agent_argv
from agentbox.agents.builtin import BUILTIN_AGENTS, flag_subcommands, model_after
from agentbox.cli.commands.common import vm_control, warn_if_untrusted
from agentbox.cli.launchflags import DETACH_FLAGS, ISOLATED_FLAG, ON_FLAG, QUERIES, WORKTREE_FLAG
from agentbox.config import load, trust
from agentbox.errors import AgentboxError, LimaError, StateError, UsageError
from agentbox.progress import note
from agentbox.safetext import visible
from agentbox.session import launch, prepare
from agentbox.session.prepare import Ask
from agentbox.session.worktrees import session_worktree
from agentbox.tasks.activity import ProjectActivity
from agentbox.vm import lifecycle, workmode
from agentbox.vm.lima import RUNNING

if TYPE_CHECKING:
    import click

    from agentbox.config.load import Config
    from agentbox.session.worktrees import Worktree
    from agentbox.vm.lifecycle import VmControl
    from agentbox.vm.lima import Instance

CONFIG_META = "agentbox.config.load"  # ctx.meta key: a config already loaded, reused by the help text


def run_agent(ctx: click.Context, name: str, args: list[str]) -> int:
    # agentbox's own options come first (each once); anything after them (another --isolated too) is the agent's.
    isolated = detach = False
    place: str | None = None
    while args:
        if args[0] == ISOLATED_FLAG and not isolated:
            isolated = True
        elif args[0] in DETACH_FLAGS and not detach:
            detach = True
        elif args[0] == ON_FLAG and place is None:
            place, args = _place(name, args[1:2]), args[1:]
        elif args[0].startswith(f"{ON_FLAG}=") and place is None:
            place = _place(name, [args[0].partition("=")[2]])
        else:
            break
        args = args[1:]
    if place is not None and not detach:
        raise UsageError(f"--on {visible(place)} needs --detach: a session on another machine always runs detached",
                         hint=f"`agentbox {name} --on {visible(place)} --detach [ARGS]...` starts it and prints its "
                         "id; `agentbox attach ID` joins it.")
    if detach and (args[:1] in (["shell"], ["login"]) or (len(args) == 1 and args[0] in QUERIES)):
        raise UsageError(f"--detach starts the agent itself in a session; it does not go with `{args[0]}`",
                         hint=f"Run `agentbox {name} --detach [ARGS]...` for the agent.")
    if args[:1] == ["shell"]:
        # deferred: start-up (cli.commands.agentshell: not on a warm launch)
        from agentbox.cli.commands.agentshell import agent_shell_command

        command = agent_shell_command(name)
        shell_args = [ISOLATED_FLAG, *args[1:]] if isolated else args[1:]
        with command.make_context("shell", shell_args, parent=ctx) as shell_ctx:
            return int(command.invoke(shell_ctx))
    if len(args) == 1 and args[0] in QUERIES:
        return answer_query(ctx, name, args[0], isolated)
    if place is not None and args[:1] == [WORKTREE_FLAG]:
        raise UsageError("--on (a session on a copy of the workspace) and --worktree do not go together",
                         hint="Drop one of them.")
    if place in ("local", "any"):
        raise UsageError(f"agentbox {name} --on takes a host added with `agentbox hosts add`, not {place}",
                         hint=f"On this machine: `agentbox {name} --detach` (the live workspace) or `agentbox {name} "
                         "--isolated` (on a copy, attached); `agentbox run --on local PROMPT` is a task on a copy.")
    control = vm_control(ctx)
    if place is not None:
        return detach_on_host(control, name, args, place)
    if isolated:
        control.config = isolation_config(control.config)
    if args[:1] == ["login"]:
        # deferred: start-up (the login window and click: `agentbox AGENT login` only, never a launch)
        from agentbox.cli.commands import agentlogin

        return agentlogin.login_agent(control, name, args[1:])
    worktree = None
    if args[:1] == [WORKTREE_FLAG]:
        if len(args) < 2:
            raise UsageError(f"agentbox {name} --worktree needs a NAME", hint=f"agentbox {name} --worktree fix-tests")
        worktree = session_worktree(control.config, args[1])
        args = args[2:]
    keep = prepare.DETACHED if detach else prepare.ATTACHED if prepare.keeps_alive(control.config) else None
    return launch_agent(control, name, args, keep, worktree=worktree)


def _place(name: str, value: list[str]) -> str:
    if not value or not value[0] or value[0].startswith("-"):
        raise UsageError(f"agentbox {name} --on needs a host's name",
                         hint=f"`agentbox {name} --on HOST --detach`; `agentbox hosts ls` lists the hosts.")
    return value[0]


def detach_on_host(control: VmControl, name: str, args: list[str], host: str) -> int:
    """`agentbox NAME --on HOST --detach [ARGS]...`: the agent in a session on HOST (a remote isolated task);
    prints its id."""
    # deferred: start-up (click, hostsession: click is never imported on a launch)
    import click

    from agentbox.tasks import hostsession

    task = hostsession.start(control, name, args, host)
    click.echo(task.id)
    waiting = f", waiting for {host}" if not task.handed else ""
    note(f"{task.label}: {name} runs in a session on {host}{waiting}, on a copy of the workspace (its changes come "
         f"back as a proposal when it ends); `agentbox attach {task.id}` joins it, `agentbox cancel {task.id}` "
         "ends it")
    return 0


def answer_without_vm(ctx: click.Context, name: str, query: str, reason: str) -> int:
    """`agentbox AGENT --help` where no VM is meant (the home folder, say): agentbox's description, and why."""
    # deferred: start-up (click: click is never imported on a launch)
    import click

    config, _ = _config_for_help(ctx)
    agent = config.agents.get(name) if config is not None else None
    binary = _shown(agent.binary if agent else _builtin_binary(name))
    why = f"{binary} was not asked: {_shown(reason).rstrip('.')}"
    if query == "--version":
        raise StateError(f"{binary}'s version is that of the {binary} in a project's VM; {why}",
                         hint=f"Run `agentbox {name} --version` in a project folder (or `agentbox -C DIR {name} "
                         f"--version`). agentbox's own version is {__version__} (`agentbox --version`).")
    click.echo(ctx.command.get_help(ctx))
    click.echo(f"\nThis is agentbox's description; {why}. For {binary}'s own help run `agentbox {name} {query}` "
               f"in a project folder (or `agentbox -C DIR {name} {query}`).")
    return 0


def isolation_config(config: Config) -> Config:
    return workmode.with_isolation(config)


def launch_agent(control: VmControl, name: str, args: list[str], keep: str | None, running: Instance | None = None,
                 worktree: Worktree | None = None) -> int:
    """Run the agent in its VM. `keep`: DETACHED runs it in a new tmux session and returns at once
    (agentbox.session.detached); ATTACHED (session.keepAlive, on a terminal) runs it in such a session, attached.
    `worktree`: in that git worktree of the workspace."""
    agent = control.config.agent(name)
    control.config.require_workspace()
    argv = agent_argv(agent.binary, list(agent.default_args), args, agent.model, model_after(name, agent.default_args),
                      flag_subcommands(name))
    ask = Ask(agent, keep=keep, worktree=worktree, busy=ProjectActivity.of(control.config))
    return launch.run(control, ask, launch.Command(argv), running)


def answer_query(ctx: click.Context, name: str, query: str, isolated: bool = False) -> int:
    """`--help`/`-h`/`--version` alone: the agent answers when its VM runs; otherwise agentbox does, from the host.

    Costs the `limactl list` a launch makes anyway; a running VM then gets exactly the warm launch's calls.
    """
    try:
        control = vm_control(ctx, acts=False)
        if isolated:
            control.config = isolation_config(control.config)
        config = control.config
        agent = config.agent(name)
        config.require_workspace()
    except AgentboxError as exc:  # no VM can be meant here (the home folder, a config that cannot be read)
        return answer_without_vm(ctx, name, query, exc.message)
    problem = None
    try:
        instance = control.instance(agent.vm_name)
    except LimaError as exc:
        instance, problem = None, exc.message
    if instance is not None:
        lifecycle.check_ownership(instance, config)
        if instance.status == RUNNING:
            trust.require_trust(config)
            return launch_agent(control, name, [query], None, running=instance)
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
        installed = ""
        if agent.install:
            installed = f"; agentbox installs it at the first launch with `{_shown(agent.install)}`"
        raise StateError(
            f"{binary}'s version is that of the {binary} in the VM {vm_name}, which {state}; "
            "agentbox does not create or start a VM to ask it",
            hint=f"Run `{how}`, then `agentbox {name} --version` asks {binary}{installed}. "
            f"agentbox's own version is {__version__} (`agentbox --version`).",
        )
    # deferred: start-up (click: click is never imported on a launch)
    import click

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
    loaded = ctx.meta.get(CONFIG_META)
    if loaded is not None:
        return loaded, None
    root = ctx.find_root()
    cwd = (root.obj or {}).get("cwd") or Path(root.params.get("directory") or ".").resolve()
    try:
        loaded = load.load(cwd)
    except AgentboxError as exc:
        return None, exc.message
    ctx.meta[CONFIG_META] = loaded
    return loaded, None


def _builtin_binary(name: str) -> str:
    spec = BUILTIN_AGENTS.get(name)
    return spec.binary if spec else name


def _shown(text: str) -> str:
    return visible(text)
