"""agentbox's entry point (the `agentbox` console script and `python -m agentbox`).

An agent launch, `agentbox [-C DIR] [-v|-q] [--debug] [--timings] AGENT [ARGS]...` with a built-in AGENT, is
what people run fifty times a day: it goes straight to the launch (agentbox.cli.commands.agent), without importing
click or building its command line, behind the same error boundary (agentbox.cli.boundary). Everything else,
and anything this module does not recognise exactly (a global option it does not know, a -C that click would
refuse, `AGENT shell`, `AGENT --help`, completion), goes to the click command line (agentbox.cli.commandline),
which gives the same result for a launch, at click's cost. `agentbox --help` alone (or bare `agentbox`) is printed
without click too (agentbox.cli.helpscreen: the same text).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox.agents.argv import BUILTIN_NAMES
from agentbox.cli.launchflags import DETACH_FLAGS, ISOLATED_FLAG, plain_launch

if TYPE_CHECKING:
    import click

# agentbox's global flags (agentbox.cli.commandline.cli), by the parameter each sets
GLOBAL_FLAGS = {"-v": "verbose", "--verbose": "verbose", "-q": "quiet", "--quiet": "quiet", "--debug": "debug",
                "--timings": "timings"}
COMPLETION_VARIABLE = "_AGENTBOX_COMPLETE"  # set by the shell's completion script: click answers it


class LaunchContext:
    """What agentbox.cli.commands.agent reads of click's context on a launch: the global options (obj, params) and
    a place for what the command works out (meta)."""

    def __init__(self, directory: str | None, verbose: bool, debug: bool) -> None:
        self.params: dict[str, Any] = {"directory": directory}
        self.obj: dict[str, Any] = {"cwd": Path(directory) if directory else Path(os.getcwd()), "verbose": verbose,
                                    "debug": debug}
        self.meta: dict[str, Any] = {}

    def find_root(self) -> LaunchContext:
        return self


def launch_line(args: list[str]) -> tuple[dict[str, Any], str, list[str]] | None:
    """(global options, agent, its arguments) when args are an agent launch the fast path runs exactly as
    the click command line would; None for anything else."""
    if COMPLETION_VARIABLE in os.environ:
        return None
    options: dict[str, Any] = {"directory": None, "verbose": False, "quiet": False, "debug": False,
                               "timings": False}
    index = 0
    while index < len(args) and args[index] in (*GLOBAL_FLAGS, "-C"):
        if args[index] == "-C":
            if index + 1 == len(args) or args[index + 1].startswith("-"):
                return None
            # click.Path(exists=True, file_okay=False, resolve_path=True): anything it might refuse is left to it
            directory = os.path.realpath(args[index + 1])
            if not (os.path.isdir(directory) and os.access(directory, os.R_OK)):
                return None
            options["directory"] = directory
            index += 2
        else:
            options[GLOBAL_FLAGS[args[index]]] = True
            index += 1
    if index == len(args) or (options["quiet"] and options["verbose"]):  # click's usage errors
        return None
    name, rest = args[index], args[index + 1:]
    if name not in BUILTIN_NAMES:  # a configured agent's name needs the config read: click's command line does
        return None
    after, isolated, detach = rest, False, False  # as run_agent reads agentbox's own options (each once)
    while after and ((after[0] == ISOLATED_FLAG and not isolated) or (after[0] in DETACH_FLAGS and not detach)):
        isolated, detach = isolated or after[0] == ISOLATED_FLAG, detach or after[0] in DETACH_FLAGS
        after = after[1:]
    if after[:1] == ["shell"] or after in (["--help"], ["-h"]):  # click commands and click's help
        return None
    return options, name, rest


def launch(options: dict[str, Any], name: str, args: list[str]) -> int:
    """Run the agent as the click command line would (agentbox.cli.commandline.cli, then the agent's command):
    from its verified plan when it has one that still holds (agentbox.session.plan), else in full, saving one."""
    # deferred: start-up (boundary, session.plan: not on `agentbox --help`)
    from agentbox.cli import boundary
    from agentbox.session import plan

    ctx = LaunchContext(options["directory"], options["verbose"], options["debug"])
    boundary.begin(options["quiet"], options["timings"])
    try:
        # --debug and --timings show the full launch
        plannable = not (options["debug"] or options["timings"]) and plain_launch(args)
        key = plan.key_of(str(ctx.obj["cwd"]), name, options) if plannable else None
        if key is not None:
            code = boundary.guarded(lambda: from_plan(key, args))
            if code != plan.DECLINED:
                return code
        return boundary.guarded(lambda: full_launch(ctx, key, name, args))
    finally:
        boundary.end()


def from_plan(key: str, args: list[str]) -> int:
    """The agent's exit code, or plan.DECLINED: no plan holds, or the VM did not prove itself (nothing ran)."""
    # deferred: start-up (session.plan: not on `agentbox --help`)
    from agentbox.session import plan

    data = plan.load(key)
    if data is None:
        return plan.DECLINED
    # deferred: start-up (session.planned, tasks.activity: only a launch with a verified plan)
    from agentbox.session import planned
    from agentbox.tasks.activity import ProjectActivity

    code = planned.run(data, args, ProjectActivity(Path(data["workspace"]), set(data["busy"])))
    return plan.DECLINED if code is None else code


def full_launch(ctx: LaunchContext, key: str | None, name: str, args: list[str]) -> int:
    if key is not None:
        # deferred: start-up (session.planrecorder: a launch from a plan records nothing)
        from agentbox.session import planrecorder

        planrecorder.start(key)
    # deferred: start-up (cli.commands.agent: not on a launch from a plan or `agentbox --help`)
    from agentbox.cli.commands.agent import run_agent

    # The launch reads only what LaunchContext has of click's context.
    return run_agent(_as_click(ctx), name, args)


def _as_click(ctx: LaunchContext) -> click.Context:
    return ctx  # type: ignore[return-value]


def main() -> None:
    line = launch_line(sys.argv[1:])
    if line is not None:
        sys.exit(launch(*line))
    if sys.argv[1:] in (["--help"], ["-h"], []) and COMPLETION_VARIABLE not in os.environ:  # bare: the help too
        # deferred: start-up (helpscreen: not on a launch or `agentbox --help`)
        from agentbox.cli import helpscreen

        try:
            code = helpscreen.show()
        except BrokenPipeError:  # `agentbox --help | head -1`
            # deferred: start-up (cli.boundary: not on a launch or `agentbox --help`)
            from agentbox.cli.boundary import closed_pipe

            sys.exit(closed_pipe())
        if code >= 0:
            sys.exit(code)
    # deferred: start-up (cli.boundary, cli.commandline: not on a launch or `agentbox --help`)
    from agentbox.cli.boundary import closed_pipe
    from agentbox.cli.commandline import cli

    try:
        cli.main(prog_name="agentbox")
    except BrokenPipeError:  # click printing a usage error to a closed stderr
        sys.exit(closed_pipe())


def __getattr__(name: str) -> Any:
    """The click command line's names (`from agentbox.cli.main import cli`), imported when asked for."""
    if name.startswith("__"):  # the import system's questions (`__path__`: is this a package?)
        raise AttributeError(name)
    # deferred: start-up (commandline: not on a launch or `agentbox --help`)
    from agentbox.cli import commandline

    return getattr(commandline, name)


if __name__ == "__main__":
    main()
    sys.exit(0)
