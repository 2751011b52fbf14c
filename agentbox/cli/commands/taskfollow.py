"""Following one background task: `logs`, `wait` and `cancel` (agentbox.tasks.records; a Job through its keeper,
agentbox.tasks.keeper, and its place's runtime). The listing, `agentbox tasks`, is agentbox.cli.commands.tasks.

Like the listing, they read the records on the host and the runners' files in the outbox, and make at most one
`limactl list` now and then (to tell whether the task's VM still runs).
"""

from __future__ import annotations

import codecs
import os
import sys
import time
from typing import TYPE_CHECKING

import click

from agentbox import runtime
from agentbox.cli.commands.tasks import duration
from agentbox.errors import AgentboxError
from agentbox.progress import note
from agentbox.remote.registry import UnknownHost
from agentbox.remote.ssh import Unreachable
from agentbox.safetext import visible, visible_text
from agentbox.tasks import keeper, records, transitions

if TYPE_CHECKING:
    from agentbox.tasks.records import Task

WAIT_TIMEOUT_EXIT = 75  # `agentbox wait --timeout` ran out before the task ended (the task goes on)
POLL_SECONDS = 0.25
VM_CHECK_SECONDS = 2.0  # while waiting or following, how often the VM's status is asked (one limactl list)
CHUNK = 1 << 16
CANCEL_WAIT = 15.0  # seconds `cancel` waits for the runner to confirm (grace period included)


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
