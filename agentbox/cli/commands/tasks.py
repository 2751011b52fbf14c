"""Background tasks: `run` hands a prompt to an agent in the VM and returns; `tasks` lists them and `tasks prune`
tidies them (agentbox.tasks.records, agentbox.tasks.submit); `logs`, `wait` and `cancel` follow one
(agentbox.cli.commands.taskfollow).

Only `run` needs the VM. The others read the records on the host and the runners' files in the outbox,
and make at most one `limactl list` (to tell whether the VMs of active tasks still run), so they answer
for a task whose VM was stopped or removed too.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import click

from agentbox import tables
from agentbox.cli.commands import ending
from agentbox.cli.commands.common import load_config
from agentbox.progress import note, warn
from agentbox.safetext import visible
from agentbox.tasks import records, transitions
from agentbox.tasks.records import parse_duration

if TYPE_CHECKING:
    from agentbox.tasks.records import Task

FAILED_STATES = frozenset({transitions.FAILED, transitions.TIMEOUT})  # their outputs say why: pruned only when asked


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@click.group("tasks", invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, help="One JSON array, one object per task (fields below).")
@click.option("--all", "show_all", is_flag=True, help="Tasks of every workspace, not only this one's.")
@click.option("--refresh", is_flag=True, help="Ask the hosts of remote tasks now (else: their last known state).")
@click.pass_context
def tasks_command(ctx: click.Context, as_json: bool, show_all: bool, refresh: bool) -> None:
    """List the background tasks of this workspace (`--all`: of every workspace), oldest first.

    --json fields: id, name, state (Pending, Queued, Running, Completed, Failed, Timeout, Cancelled),
    exitCode, reason, agent, vm, workspace, cwd, argv (without the prompt), prompt (its first line),
    timeoutSec, created, started, ended (UTC, ISO 8601, or null), transitions ([{state, time}]),
    checkpoint, worktree, branch, base, stdout and stderr (where the outputs are), host (where it runs: local
    or a host's name), isolated (it works on a copy: `run --on`), proposal (the proposal its changes became, or
    null), session (an interactive session, `agentbox AGENT --on HOST --detach`: `agentbox attach ID` joins it),
    seen and unreachableSince (a remote task: when its host last answered; since when it has not), forwardPort
    (the host's port on which its VM reaches this machine's proxy, or null).
    """
    if ctx.invoked_subcommand is None:
        _list_tasks(ctx, as_json, show_all, refresh)


@tasks_command.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, as `agentbox tasks --json`.")
@click.option("--all", "show_all", is_flag=True, help="Tasks of every workspace, not only this one's.")
@click.option("--refresh", is_flag=True, help="Ask the hosts of remote tasks now.")
@click.pass_context
def tasks_ls_command(ctx: click.Context, as_json: bool, show_all: bool, refresh: bool) -> None:
    """List the background tasks: the same as `agentbox tasks`."""
    parent = ctx.parent.params if ctx.parent else {}
    _list_tasks(ctx, as_json or bool(parent.get("as_json")), show_all or bool(parent.get("show_all")),
                refresh or bool(parent.get("refresh")))


def _list_tasks(ctx: click.Context, as_json: bool, show_all: bool, refresh: bool = False) -> None:
    found = _selected(ctx, show_all)
    found = _asked(records.refresh(found), hosts=refresh)  # this machine's Jobs are always asked: no host to wait for
    if as_json:
        click.echo(json.dumps([task.to_json() for task in found], indent=2))
    elif not found:
        click.echo("No tasks" + ("" if show_all else " in this workspace") + ": `agentbox run PROMPT` starts one.",
                   err=True)
    else:
        _table(found)
    if not refresh:
        _keep_following(found)


def _unsettled_jobs(found: list[Task]) -> list[Task]:
    """The Jobs a keeper still follows: active, or their results not home yet."""
    return [task for task in found if task.job and not task.settled]


KEEPERS_PER_LISTING = 8  # keepers a listing starts again at most (the next listing starts the others)


def _keep_following(found: list[Task]) -> None:
    """A remote task whose keeper is gone (this machine restarted) gets one again, after the listing was printed:
    it asks the host in the background, so that the listing itself never waits for a host."""
    wanted = _unsettled_jobs(found)
    if not wanted:
        return
    # deferred: start-up (tasks.keeper, ~25 ms of a listing's CPU: only a listing with a Job in it runs it)
    from agentbox.tasks import keeper

    started = 0
    for task in wanted:
        if started < KEEPERS_PER_LISTING and not keeper.running(task.id):
            keeper.start(task.id)
            started += 1


def _asked(found: list[Task], hosts: bool) -> list[Task]:
    """Each Job that is active (or whose results are not home yet) asked of its place, in parallel: this
    machine's always, a host's only when `hosts`."""
    wanted = [task for task in _unsettled_jobs(found) if hosts or not task.remote]
    if not wanted:
        return found
    # deferred: start-up (tasks.keeper, concurrent.futures, ~25 ms of a listing's CPU: only with a Job in it)
    from concurrent.futures import ThreadPoolExecutor

    from agentbox.tasks import keeper

    with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
        answers = list(pool.map(lambda task: keeper.step(task.id), wanted))
    asked = {task.id: fresh for task, fresh in zip(wanted, answers, strict=True)}
    return [asked.get(task.id) or task for task in found]


def _selected(ctx: click.Context, show_all: bool) -> list[Task]:
    everything = records.all_tasks()
    if show_all:
        return everything
    workspace = load_config(ctx, describe=True).require_workspace()
    return records.of_workspace(everything, workspace)


def _table(found: list[Task]) -> None:
    rows = [("ID", "NAME", "AGENT", "STATE", "EXIT", "STARTED", "TIME", "PROMPT")]
    now = time.time()
    for task in found:
        took = ""
        if task.started:
            took = _span((task.ended or now) - task.started)
        state = task.state
        if task.isolated and task.proposal is not None:
            state += f", proposal {task.proposal}"
        elif task.isolated and task.outcome and not task.active:
            state += f", {task.outcome if task.outcome == 'no changes' else 'no proposal'}"
        if task.remote:
            state += f" on {task.host}"
            since = task.unreachable_since
            if task.active and not task.handed:
                state += " (waiting for the host" + (f", unreachable since {tables.local_time(since)})" if since
                                                     else ")")
            elif task.active and since is not None:
                state += f" (unreachable since {tables.local_time(since)}"
                state += f"; seen {tables.local_time(task.seen)})" if task.seen else ")"
        summary = "(session)" if task.session else visible(task.summary)  # `agentbox attach ID` joins it
        rows.append((str(task.id), visible(task.name or ""), task.agent, state,
                     "" if task.exit_code is None else str(task.exit_code),
                     tables.local_time(task.started) if task.started else "", took, summary))
    tables.echo(rows, flexible=(-1, 1, 3))  # cut first PROMPT, then NAME, last STATE (a proposal, a host away)


def _span(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@tasks_command.command("prune")
@click.option("--all", "show_all", is_flag=True, help="Ended tasks of every workspace.")
@click.option("--yes", is_flag=True, help="Remove failed and timed-out tasks too without asking (for scripts).")
@click.pass_context
def prune_command(ctx: click.Context, show_all: bool, yes: bool) -> None:
    """Forget ended tasks: their records, outputs and worktrees (their branches stay).

    Completed and cancelled tasks go without a question. Failed and timed-out ones keep what tells why: on a
    terminal they are listed and you are asked first; without one they stay unless --yes is given.
    """
    ended = [task for task in records.refresh(_selected(ctx, show_all)) if not task.active]
    failed = [task for task in ended if task.state in FAILED_STATES]
    chosen = [task for task in ended if task.state not in FAILED_STATES]
    if failed and yes:
        chosen += failed
    elif failed and ending.on_terminal():
        click.echo("Ended without success (their outputs say why):", err=True)
        for task in failed:
            click.echo(f"  {visible(task.label)}: {_ended_how(task)}", err=True)
        if click.confirm(f"Remove {_count(failed, 'this task', 'these tasks')} and their outputs?", default=False,
                         err=True):
            chosen += failed
        else:
            note(f"kept {_count(failed, 'the failed task', 'the failed tasks')}")
    elif failed:
        them = _count(failed, "it", "them")
        warn(f"kept {', '.join(visible(task.label) for task in failed)}: {_count(failed, 'it', 'they')} ended "
             f"without success, and there is no terminal to ask whether to remove {them}; `agentbox tasks prune "
             f"--yes` removes {them} too")
    gone = records.prune(sorted(chosen, key=lambda task: task.id))
    for task in gone:
        extra = f"; its branch {task.branch} stays" if task.branch else ""
        note(f"removed {visible(task.label)} ({task.state}){extra}")
    if not gone and not failed:
        note("no ended task to remove")


def _count(found: list[Task], one: str, several: str) -> str:
    return one if len(found) == 1 else several


def _ended_how(task: Task) -> str:
    how = task.state + (f" (exit {task.exit_code})" if task.exit_code not in (None, 0) else "")
    return how + (f": {visible(task.reason)}" if task.reason else "")
