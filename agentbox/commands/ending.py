"""What stopping or removing a VM ends: its detached sessions (agentbox.session.detached) and the tasks that wait or
run in it (agentbox.tasks). On a terminal the command lists them and asks first (`--yes` does not ask); without one it
goes on; either way it says what ended.

The sessions are asked of the VM (one `limactl shell`, only when it runs and a session or task keeps its marker fresh
in the outbox: agentbox.livemarkers); the tasks come from the host's records.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple

import click

from agentbox.progress import warn

if TYPE_CHECKING:
    from agentbox.vm.lifecycle import Session
    from agentbox.vm.lima import Instance


class Ending(NamedTuple):
    vm: str
    sessions: tuple[str, ...]  # "session NAME (AGENT)", escaped
    tasks: tuple[str, ...]  # "task ID (NAME): STATE"

    def lines(self) -> list[str]:
        return [*self.sessions, *self.tasks]


def on_terminal() -> bool:
    """Whether there is someone to ask: stdin and stderr (where the question goes) are terminals."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def of(session: Session, instance: Instance | None) -> Ending:
    """What runs in the VM now; nothing when it does not run (its sessions and tasks ended with it)."""
    from agentbox.vm.lima import RUNNING

    if instance is None or instance.status != RUNNING:
        return Ending(instance.name if instance else "", (), ())
    return Ending(instance.name, _sessions(session, instance.name), _tasks(instance.name))


def _sessions(session: Session, name: str) -> tuple[str, ...]:
    from agentbox import livemarkers
    from agentbox.safetext import visible
    from agentbox.session import detached as sessions

    if not livemarkers.any_fresh(name):
        return ()  # no session keeps its marker fresh: none runs, and the VM is not asked
    code, output, _ = session.lima.shell_bytes(name, sessions.script("list"), sessions.LIST_LIMIT)
    if code != 0:  # a VM that cannot answer is stopped all the same
        warn(f"could not list the sessions of {name} (exit {code}); any that run end with it")
        return ()
    return tuple(visible(f"session {row.name} ({row.agent})") for row in sessions.parse_list(output)
                 if row.state == sessions.RUNNING)


def _tasks(name: str) -> tuple[str, ...]:
    from agentbox import paths

    if not paths.tasks_dir().is_dir():
        return ()
    from agentbox.safetext import visible
    from agentbox.tasks import records as tasks

    mine = [task for task in tasks.all_tasks() if task.vm == name and task.active]
    return tuple(visible(f"{task.label}: {task.state}") for task in tasks.refresh(mine, check_vms=False)
                 if task.active)


def ask(ending: Ending, action: str, yes: bool) -> bool:
    """On a terminal, list what `action` (`Stop agentbox-x`) ends and ask; without one, or with `yes`, go on."""
    if yes or not ending.lines() or not on_terminal():
        return True
    click.echo(f"{ending.vm} runs what ends with it:", err=True)
    for line in ending.lines():
        click.echo(f"  {line}", err=True)
    return click.confirm(f"{action}?", default=False, err=True)


def question(ending: Ending, asked: str) -> str:
    """A question that already asks (rm, start --recreate), with what it would end in front."""
    if not ending.lines():
        return asked
    listed = "\n".join(f"  {line}" for line in ending.lines())
    return f"{ending.vm} runs what ends with it:\n{listed}\n{asked}"


def said(ending: Ending, reason: str) -> None:
    """After the fact: the sessions that ended (the tasks say so themselves: common.settle_tasks)."""
    for line in ending.sessions:
        warn(f"{line} ended: {reason}")
