"""Background tasks: `run` hands a prompt to an agent in the VM and returns; `tasks`, `logs`, `wait`,
`cancel` and `tasks prune` follow and tidy them (agentbox.tasks.records, agentbox.tasks.submit).

Only `run` needs the VM. The others read the records on the host and the runners' files in the outbox,
and make at most one `limactl list` (to tell whether the VMs of active tasks still run), so they answer
for a task whose VM was stopped or removed too.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import click

from agentbox import runtime, tables
from agentbox.cli.commands import ending
from agentbox.cli.commands.common import load_config
from agentbox.errors import AgentboxError
from agentbox.progress import note, warn
from agentbox.remote.registry import UnknownHost
from agentbox.remote.ssh import Unreachable
from agentbox.safetext import visible, visible_text
from agentbox.tasks import keeper, records, transitions
from agentbox.tasks.records import parse_duration

if TYPE_CHECKING:
    from agentbox.tasks.records import Task

WAIT_TIMEOUT_EXIT = 75  # `agentbox wait --timeout` ran out before the task ended (the task goes on)
POLL_SECONDS = 0.25
VM_CHECK_SECONDS = 2.0  # while waiting or following, how often the VM's status is asked (one limactl list)
CHUNK = 1 << 16
CANCEL_WAIT = 15.0  # seconds `cancel` waits for the runner to confirm (grace period included)
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


# -- logs, wait, cancel -----------------------------------------------------------------------------


def _one(spec: str) -> Task:
    task = records.lookup(spec)
    if task.job:
        return _look(task)
    return records.refresh([task])[0] if not task.settled else task


def _look(task: Task) -> Task:
    """A remote task, asked of its host now (its last known state when the host does not answer)."""
    if task.settled:
        return task
    return keeper.step(task.id) or task


@click.command("logs", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the task writes until it ends.")
@click.argument("task_id", metavar="ID")
def logs_command(follow: bool, task_id: str) -> None:
    """Print a task's output: its stdout on stdout, its stderr on stderr (control characters escaped on a
    terminal, the exact bytes otherwise)."""
    task = _one(task_id)
    streams = {"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer}
    if task.job:
        _job_logs(task, follow, {name: _Escaper(stream) for name, stream in streams.items()})
        return
    fds = {name: records.open_output(task, name) for name in streams}
    decoders = {name: _Escaper(stream) for name, stream in streams.items()}
    last_vm_check = time.monotonic()
    try:
        while True:
            for name in streams:
                fd = fds[name]
                if fd is None:
                    fds[name] = fd = records.open_output(task, name)
                if fd is not None:
                    while chunk := os.read(fd, CHUNK):
                        decoders[name].write(chunk)
            if not follow or not task.active:
                break
            time.sleep(POLL_SECONDS)
            check = time.monotonic() - last_vm_check > VM_CHECK_SECONDS
            if check:
                last_vm_check = time.monotonic()
            task = records.refresh([task], check_vms=check)[0]
            if not task.active:
                continue  # one more read: what it wrote last
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
        for decoder in decoders.values():
            decoder.flush()


def _job_logs(task: Task, follow: bool, decoders: dict[str, _Escaper]) -> None:
    """A Job's output: read from its place while it runs (a host over its connection), from the record once its
    keeper brought it home; each byte once."""
    offsets = dict.fromkeys(decoders, 0)
    said_unreachable = False
    try:
        while True:
            if task.harvested:
                for name, decoder in decoders.items():
                    fd = records.open_output(task, name)
                    if fd is None:
                        continue
                    try:
                        os.lseek(fd, offsets[name], os.SEEK_SET)
                        while chunk := os.read(fd, CHUNK):
                            decoder.write(chunk)
                    finally:
                        os.close(fd)
                return
            try:
                place = runtime.place(task.host) if task.handed and task.remote_key else None
            except UnknownHost:
                place = None
            if place is not None and task.remote_key:
                try:
                    for name, decoder in decoders.items():
                        while chunk := place.read(task.vm, task.remote_key, name, offsets[name], 1 << 20):
                            decoder.write(chunk)
                            offsets[name] += len(chunk)
                    said_unreachable = False
                except Unreachable as exc:
                    if not said_unreachable:
                        note(f"{task.label}: {exc.message}; {'waiting for it' if follow else 'its output so far'}")
                        said_unreachable = True
            if not follow or task.settled:
                return
            time.sleep(POLL_SECONDS)
            task = _look(task)
    finally:
        for decoder in decoders.values():
            decoder.flush()


class _Escaper:
    """Writes a task's output: as is when the stream is not a terminal, else with control characters
    escaped (the agent wrote it: it must not drive the user's terminal). Each write reaches the stream at once:
    sys.stdout.buffer holds bytes until it is full, on a terminal as in a pipe, and `logs -f` is read live."""

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.terminal = bool(getattr(stream, "isatty", lambda: False)())
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")

    def write(self, chunk: bytes) -> None:
        if self.terminal:
            chunk = visible_text(self.decoder.decode(chunk)).encode("utf-8", "surrogateescape")
        self.stream.write(chunk)  # type: ignore[attr-defined]
        self.stream.flush()  # type: ignore[attr-defined]

    def flush(self) -> None:
        self.stream.flush()  # type: ignore[attr-defined]


@click.command("wait", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--timeout", metavar="DURATION", callback=duration,
              help=f"Give up after this long (90s, 10m, ...), exiting {WAIT_TIMEOUT_EXIT}; the task goes on.")
@click.argument("task_id", metavar="ID")
@click.pass_context
def wait_command(ctx: click.Context, timeout: int | None, task_id: str) -> None:
    """Wait for a task to end; exit with its exit code (124 when it timed out, 130 when it was cancelled,
    1 when it failed without one)."""
    task = _one(task_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    last_vm_check = time.monotonic()
    said = None
    while task.active or (task.job and not task.settled):
        if deadline is not None and time.monotonic() >= deadline:
            note(f"{task.label} is still {task.state} after {timeout}s")
            ctx.exit(WAIT_TIMEOUT_EXIT)
        time.sleep(POLL_SECONDS)
        if task.job:
            task = _look(task)
            if task.unreachable_since is not None and said != task.unreachable_since:
                said = task.unreachable_since
                note(f"{task.host} does not answer; {task.label} goes on there, waiting for the host to answer")
            continue
        check = time.monotonic() - last_vm_check > VM_CHECK_SECONDS
        if check:
            last_vm_check = time.monotonic()
        task = records.refresh([task], check_vms=check)[0]
    ctx.exit(_report_end(task))


def _report_end(task: Task) -> int:
    reason = f": {visible(task.reason)}" if task.reason else ""
    note(f"{task.label} {task.state}{reason}")
    if task.isolated:
        _report_changes(task)
    if task.state == transitions.TIMEOUT:
        return transitions.TIMEOUT_EXIT
    if task.state == transitions.CANCELLED:
        return transitions.CANCELLED_EXIT
    if task.state == transitions.COMPLETED:
        return 0
    return task.exit_code if task.exit_code not in (None, 0) else 1


def _report_changes(task: Task) -> None:
    if task.proposal is not None:
        note(f"{task.label}: {visible(task.outcome or '')}; `agentbox review {task.proposal}` shows it, "
             f"`agentbox apply {task.proposal}` applies it")
    elif task.outcome:
        note(f"{task.label}: {visible(task.outcome)}: no proposal")


@click.command("cancel", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("task_id", metavar="ID")
def cancel_command(task_id: str) -> None:
    """Cancel a task: a queued one is dequeued; a running one gets TERM (its process group), then KILL
    after a grace period."""
    task = _one(task_id)
    if not task.active:
        raise AgentboxError(f"{task.label} already ended: {task.state}",
                            hint="`agentbox tasks prune` forgets ended tasks.")
    if task.job:
        keeper.cancel(task)
    else:
        records.request_cancel(task)
    deadline = time.monotonic() + CANCEL_WAIT
    task = _look(task) if task.job else records.refresh([task])[0]
    while task.active and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        task = _look(task) if task.job else records.refresh([task], check_vms=False)[0]
    if task.active:
        note(f"{task.label} was asked to stop and is still {task.state}; `agentbox wait {task.id}` waits for it")
        return
    note(f"{task.label} {task.state}")
