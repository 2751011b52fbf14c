"""What else of a project ran: the tripwire's question before it takes a change for the user's own edit.

A watched file that changed since the last session's end was the user's when no task of the workspace ran since
(the task records on the host say when each started and ended) and no session or task runs in one of the
project's VMs now (their live markers, agentbox.livemarkers). The tripwire itself keeps the launches and the kept
sessions (agentbox.review.tripwire).
"""

from __future__ import annotations

from agentbox import livemarkers
from agentbox.config.load import Config
from agentbox.tasks import records as tasks
from agentbox.tasks.state import ACTIVE


class ProjectActivity:
    """tripwire.Busy for one project's config."""

    def __init__(self, config: Config) -> None:
        self.workspace = config.require_workspace()
        self.vms = {config.vm_name, *(agent.vm_name for agent in config.agents.values())}

    def __call__(self, since: float) -> bool:
        if any(self.vm_busy(vm) for vm in sorted(self.vms)):
            return True
        return any(task.state in ACTIVE or (task.ended or 0) >= since or (task.started or 0) >= since
                   for task in tasks.of_workspace(tasks.all_tasks(), self.workspace))

    def vm_busy(self, vm: str) -> bool:
        return livemarkers.any_fresh(vm)
