"""What stopping or removing a VM ends: its detached sessions (agentbox.session.detached) and the tasks that wait or
run in it (agentbox.tasks), and the one rule stop, restart, rm and start --recreate follow before ending them.

The rule: `--yes` goes on without asking. Otherwise, when running work would end (and always for what deletes a
disk), a terminal lists it and asks, and a script (no terminal to ask on) is refused with nothing changed, naming
the flag; both a refusal and a "no" exit 1. Either way the command says what ended.

The sessions are asked of the VM (one `limactl shell`, only when it runs and a session or task keeps its marker fresh
in the outbox: agentbox.livemarkers); the tasks come from the host's records.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple, NoReturn

import click

from agentbox import livemarkers, paths
from agentbox.errors import AgentboxError
from agentbox.progress import say, warn
from agentbox.safetext import visible
from agentbox.vm.lima import RUNNING

if TYPE_CHECKING:
    from agentbox.vm.lifecycle import VmControl
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


def of(control: VmControl, instance: Instance | None) -> Ending:
    """What runs in the VM now; nothing when it does not run (its sessions and tasks ended with it)."""
    if instance is None or instance.status != RUNNING:
        return Ending(instance.name if instance else "", (), ())
    return Ending(instance.name, _sessions(control, instance.name), _tasks(instance.name))


def _sessions(control: VmControl, name: str) -> tuple[str, ...]:
    # deferred: start-up (detached: only the commands here that use it)
    from agentbox.session import detached

    if not livemarkers.any_fresh(name):
        return ()  # no session keeps its marker fresh: none runs, and the VM is not asked
    code, output, _ = control.lima.shell_bytes(name, detached.script("list"), detached.LIST_LIMIT)
    if code != 0:  # a VM that cannot answer is stopped all the same
        warn(f"could not list the sessions of {name} (exit {code}); any that run end with it")
        return ()
    return tuple(visible(f"session {row.name} ({row.agent})") for row in detached.parse_list(output)
                 if row.state == detached.RUNNING)


def _tasks(name: str) -> tuple[str, ...]:
    if not paths.tasks_dir().is_dir():
        return ()
    # deferred: start-up (records: only the commands here that use it)
    from agentbox.tasks import records

    mine = [task for task in records.all_tasks() if task.vm == name and task.active]
    return tuple(visible(f"{task.label}: {task.state}") for task in records.refresh(mine, check_vms=False)
                 if task.active)


DECLINED_EXIT = 1  # a "no" on a terminal, and a script refused for want of --yes: nothing was changed


class Asked(NamedTuple):
    """How one command asks before it ends what runs in a VM."""

    question: str  # on a terminal: "Restart agentbox-x?"
    refusal: str  # in a script without --yes: "refusing to restart agentbox-x"
    command: str  # the command with the flag that goes on: "agentbox restart --yes"
    kept: str  # after a "no": "agentbox-x left running"
    always: bool = False  # ask even when nothing runs (what deletes a disk)


def go_ahead(ending: Ending, asked: Asked, yes: bool) -> bool:
    """Whether to go on: at once with `yes`, or when nothing would end (unless `asked.always`); else on a terminal
    the answer to the question, and in a script a refusal (raised: nothing was changed)."""
    if yes or not (ending.lines() or asked.always):
        return True
    if not on_terminal():
        raise refused([ending], asked)
    try:
        return click.confirm(question(ending, asked.question), default=False, err=True)
    except click.exceptions.Abort:  # ^D or ^C at the question: a no
        click.echo("", err=True)
        return False


def refused(endings: list[Ending], asked: Asked) -> AgentboxError:
    """The error of a script without --yes: why nothing was changed, what would have ended, the flag to add."""
    busy = [ending for ending in endings if ending.lines()]
    listed = "".join(f"\n{ending.vm} runs what would end with it:" + "".join(f"\n  {line}" for line in ending.lines())
                     for ending in busy)
    hint = f"Run `{asked.command}` to go on from a script"
    if busy:
        hint += " (what is listed ends), or let the sessions and tasks finish first (`agentbox sessions`, " \
                "`agentbox tasks`)"
    return AgentboxError(f"{asked.refusal} without confirmation (no terminal to ask on); nothing was changed"
                         + (":" if busy else "") + listed, hint=hint + ".")


def declined(asked: Asked) -> NoReturn:
    """After a "no": agentbox's own last line, and exit 1."""
    say(f"{asked.kept}; nothing was changed")
    raise click.exceptions.Exit(DECLINED_EXIT)


def question(ending: Ending, asked: str) -> str:
    """The question, with what it would end in front."""
    if not ending.lines():
        return asked
    listed = "\n".join(f"  {line}" for line in ending.lines())
    return f"{ending.vm} runs what ends with it:\n{listed}\n{asked}"


def said(ending: Ending, reason: str) -> None:
    """After the fact: the sessions that ended (the tasks say so themselves: common.settle_tasks)."""
    for line in ending.sessions:
        warn(f"{line} ended: {reason}")
