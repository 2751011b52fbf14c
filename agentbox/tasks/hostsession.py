"""`agentbox AGENT --on HOST --detach`: an interactive session on another machine, and `agentbox attach` to it.

Such a session is an isolated task on a host (agentbox.tasks.jobs) whose program is the agent's interactive form:
its runner there (provision/task-runner.sh, `session=KEY` in its spec) starts it in the tmux session KEY of a
tmux server of its own in the remote VM, on the task's copy of the workspace, and the task ends when that session
does; the changes come home as a proposal like any isolated task's. `attach` joins the tmux session over the
host's multiplexed connection with a terminal (the far end's `attach` becomes `limactl shell VM -- tmux attach`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from agentbox.agents.argv import agent_argv
from agentbox.agents.builtin import flag_subcommands, model_after
from agentbox.errors import StateError
from agentbox.remote import registry
from agentbox.runtime.sshhost import SESSION_ENDED, SshRuntime
from agentbox.tasks import jobs, keeper, records
from agentbox.tasks.submit import TaskAsk

if TYPE_CHECKING:
    from agentbox.vm import lifecycle

ENDING_WAIT = 60.0  # seconds `attach` waits, once the session ended, for its task to end and come home
POLL = 0.3


def start(control: lifecycle.VmControl, agent_name: str, args: list[str], host_name: str) -> records.Task:
    """Submit the session to host_name (the agent's interactive form with its default args and ARGS)."""
    agent = control.config.agent(agent_name)
    control.config.require_workspace()
    argv = agent_argv(agent.binary, list(agent.default_args), args, agent.model,
                      model_after(agent_name, agent.default_args), flag_subcommands(agent_name))
    return jobs.submit(control, TaskAsk(agent_name, b"", session_argv=argv), host_name)


def find(spec: str) -> records.Task | None:
    """The remote session task named by id or name (None: no such task is a remote session)."""
    candidates = [task for task in records.all_tasks() if task.session and task.remote]
    try:
        return records.lookup(spec, candidates)
    except records.UnknownTask:
        return None


def attach(task: records.Task) -> tuple[int, records.Task]:
    """Join the session on this terminal until the user detaches or it ends. Returns the far end's exit status
    (0: detached, SESSION_ENDED: it ended) and the record as it is then (after an end: once it came home,
    or ENDING_WAIT passed)."""
    task = keeper.step(task.id) or task  # installs the far end when it is missing, too
    if not task.active:
        raise StateError(f"{task.label}, a session on {task.host}, already ended: {task.state}",
                         hint=f"`agentbox wait {task.id}` reports how it ended and what it changed.")
    if not task.handed:
        raise StateError(f"{task.label} waits for {task.host}, which has not taken it yet",
                         hint=f"`agentbox attach {task.id}` again once `agentbox tasks` shows it Running.")
    if task.state != records.RUNNING:
        raise StateError(f"{task.label} is {task.state} on {task.host}: its session has not started yet",
                         hint=f"`agentbox attach {task.id}` again once `agentbox tasks` shows it Running.")
    code = SshRuntime(registry.require(task.host)).attach(task.remote_key or "")
    if code != SESSION_ENDED:
        return code, keeper.step(task.id) or task
    deadline = time.monotonic() + ENDING_WAIT
    while True:
        task = keeper.step(task.id) or task
        if task.settled or time.monotonic() >= deadline:
            return code, task
        time.sleep(POLL)
