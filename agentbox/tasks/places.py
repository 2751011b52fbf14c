"""`--on any`: which place of tasks.hosts takes an isolated task (agentbox.tasks.jobs hands it over)."""

from __future__ import annotations

from agentbox.config.load import Config
from agentbox.errors import StateError
from agentbox.progress import note
from agentbox.remote import registry
from agentbox.remote.ssh import Transport, Unreachable
from agentbox.runtime import LOCAL
from agentbox.tasks import records


def choose(config: Config) -> str:
    """Where `--on any` sends a task: the first host of tasks.hosts (in order; `local` is a host like the others)
    with a free slot by this machine's own records, skipping a host that does not answer now; when every one is
    full, the first that answers (the task waits there, Queued). Says why it passed over a host."""
    entries = config.task_hosts or ()
    active = [task for task in records.all_tasks() if task.active]
    answering: list[str] = []
    for entry in entries:
        limit = entry.max_concurrent or config.tasks_max_concurrent
        if entry.name == LOCAL:
            used = sum(1 for task in active if task.host == LOCAL and task.workspace == str(config.workspace))
            answering.append(LOCAL)
        else:
            host = registry.get(entry.name)
            if host is None:
                note(f"tasks.hosts names {entry.name}, which `agentbox hosts add` did not add: passed over")
                continue
            try:
                code = Transport(host.target()).run(["true"], timeout=15).code
            except Unreachable as exc:
                registry.unreachable(host)
                note(f"{entry.name} does not answer ({exc.message}): passed over")
                continue
            if code != 0:
                note(f"{entry.name} answered `true` with exit {code}: passed over")
                continue
            registry.reached(host)
            answering.append(entry.name)
            used = sum(1 for task in active if task.host == entry.name)
        if used < limit:
            return entry.name
        note(f"{entry.name} has no free slot ({used} of {limit} in use)")
    if not answering:
        raise StateError("no host of tasks.hosts can take the task now (see above)",
                         hint="`agentbox hosts ls` shows each host; `--on NAME` makes the task wait for one.")
    note(f"every host is full: the task waits on {answering[0]}")
    return answering[0]
