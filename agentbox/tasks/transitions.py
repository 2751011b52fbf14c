"""The states of a background task and the only moves between them.

    Pending -> Queued -> Running -> Completed | Failed | Timeout | Cancelled

Pending: recorded on the host, not yet handed to the VM. Queued: its runner waits in the VM for a
slot (tasks.maxConcurrent). Running: the agent runs. The four end states are final. A task can also
end before it runs: Pending or Queued -> Failed (the VM could not take it, or stopped) or Cancelled.
Any other move is refused (IllegalTransition): a record never goes back, and an ended task stays
ended whatever its runner or a second agentbox says later.
"""

from __future__ import annotations

from agentbox.errors import StateError

PENDING, QUEUED, RUNNING = "Pending", "Queued", "Running"
COMPLETED, FAILED, TIMEOUT, CANCELLED = "Completed", "Failed", "Timeout", "Cancelled"
STATES = (PENDING, QUEUED, RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED)
ACTIVE = frozenset({PENDING, QUEUED, RUNNING})
ENDED = frozenset({COMPLETED, FAILED, TIMEOUT, CANCELLED})

ALLOWED: dict[str, frozenset[str]] = {
    PENDING: frozenset({QUEUED, FAILED, CANCELLED}),
    QUEUED: frozenset({RUNNING, FAILED, CANCELLED}),
    RUNNING: ENDED,
    **{state: frozenset() for state in ENDED},
}

# `agentbox wait` exits with the task's own code; these are the codes of the states that have none.
TIMEOUT_EXIT = 124  # as timeout(1)
CANCELLED_EXIT = 130  # as a program stopped with Ctrl-C


class IllegalTransition(StateError):
    """A move the state machine does not have (an ended task, or a step backwards)."""


def check(current: str, new: str, task: str = "the task") -> None:
    """Refuse a move ALLOWED does not list."""
    if new not in ALLOWED.get(current, frozenset()):
        raise IllegalTransition(
            f"{task} is {current}; it cannot become {new}",
            hint="An ended task stays ended: `agentbox run` starts a new one." if current in ENDED else None,
        )


def path_to(current: str, target: str) -> list[str]:
    """The states a record goes through from current to target, in order (target included), for a runner
    seen only after it moved on (Queued when it was already Running, say). Empty when there is no way."""
    if target == current:
        return []
    order = [PENDING, QUEUED, RUNNING]
    if current in order and target in ALLOWED[current]:
        return [target]
    if current in order and target in order and order.index(target) > order.index(current):
        return order[order.index(current) + 1:order.index(target) + 1]
    if current in (PENDING, QUEUED) and target in ENDED:
        return [*path_to(current, RUNNING), target]
    return []
