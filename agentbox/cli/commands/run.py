"""`agentbox run`: hand a prompt to an agent in the background, in this machine's VM or, isolated, on any place
(agentbox.tasks.submit, agentbox.tasks.jobs); print the task's id. `tasks`, `logs`, `wait` and `cancel`
(agentbox.cli.commands.tasks) follow it.
"""

from __future__ import annotations

import sys

import click

from agentbox.cli.commands.common import agent_named, vm_control
from agentbox.cli.commands.tasks import duration
from agentbox.errors import UsageError
from agentbox.progress import note
from agentbox.session.worktrees import check_name
from agentbox.tasks import jobs, places, submit


@click.command("run", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--agent", "agent_name", metavar="NAME", help="The agent (default: claude, or the only one you "
              "defined).")
@click.option("--name", metavar="N", help="A name for the task (commands take it instead of the id).")
@click.option("--timeout", metavar="DURATION", callback=duration,
              help="Stop the task after this long (90, 90s, 10m, 1h30m): it ends as Timeout.")
@click.option("--worktree", metavar="NAME", is_flag=False, flag_value="", default=None,
              help="Run in the git worktree .agentbox/worktrees/NAME on the branch agentbox/NAME (made, or used "
              "again); alone (before another option or --): a worktree of its own, task-ID.")
@click.option("--on", "place", metavar="PLACE", help="An isolated task: the agent works on a copy of the workspace "
              "in the VM of PLACE (local: this machine's; a host added with `agentbox hosts add`; any: the first "
              "of tasks.hosts with a free slot), and what it changed comes back as a proposal "
              "(`agentbox review`, `apply`); the workspace is not touched.")
@click.option("--isolated", is_flag=True, help="The same as --on local.")
@click.option("-d", "--detach", is_flag=True, hidden=True, help="Accepted for symmetry: a task always runs detached.")
@click.argument("prompt", nargs=-1, required=False)
@click.pass_context
def run_command(ctx: click.Context, agent_name: str | None, name: str | None, timeout: int | None,
                worktree: str | None, place: str | None, isolated: bool, detach: bool,
                prompt: tuple[str, ...]) -> None:
    """Run an agent on PROMPT in the background, in the project's VM; print the task's id.

    The prompt is the arguments after the options (`--` first if it starts with a dash), or standard
    input when there are none; it reaches the agent byte for byte as one argument of its non-interactive
    form (`claude -p`, `codex exec`, `gemini -p`, `kiro-cli chat --no-interactive`, ...; agents.NAME.taskArgs).
    At most tasks.maxConcurrent tasks run at once in a VM: the others wait, Queued, and start in order as
    slots free. Follow them with `agentbox tasks`, `logs ID -f`, `wait ID`; `cancel ID` stops one.
    """
    if isolated and place is None:
        place = "local"
    if place is not None and worktree is not None:
        raise UsageError("--on (an isolated task) and --worktree do not go together: an isolated task has a copy "
                         "of its own", hint="Drop one of them.")
    text = _prompt(prompt)
    if name is not None and (not name or name.isdigit() or any(ord(c) < 0x20 for c in name)):
        raise UsageError(f"--name {name!r} is not a task name: use letters, not only digits (ids are numbers)")
    if worktree:
        check_name(worktree)
    control = vm_control(ctx)
    agent = agent_named(control.config, agent_name)
    if place == "any":
        place = places.choose(control.config)
        note(f"--on any: {place}")
    ask = submit.TaskAsk(agent, text, name=name, timeout=timeout, worktree=worktree is not None,
                          worktree_name=worktree or None)
    if place is not None:
        task = jobs.submit(control, ask, place)
    else:
        task = submit.submit(control, ask)
    click.echo(task.id)
    where = f" in {task.worktree} (branch {task.branch})" if task.worktree else ""
    if task.isolated:
        where = " on a copy of the workspace (its changes come back as a proposal)"
    if task.remote:
        where = f" on {task.host}" + where
    note(f"{task.label}: {agent} is {task.state.lower()}{where}; `agentbox logs {task.id} -f` follows it, "
         f"`agentbox wait {task.id}` waits for it")


def _prompt(words: tuple[str, ...]) -> bytes:
    if words:
        text = " ".join(words).encode("utf-8", "surrogateescape")
    else:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no prompt: give it after the options, or on standard input",
                             hint="agentbox run -- 'fix the failing test'   or   agentbox run < prompt.txt")
        text = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    if not text.strip():
        raise UsageError("the prompt is empty")
    if b"\0" in text:
        raise UsageError("the prompt contains a NUL byte, which no program argument can carry")
    return text


# -- tasks ----------------------------------------------------------------------------------------


