"""What else of a project ran: the tripwire's question before it takes a change for the user's own edit.

A watched file in the workspace that changed since the last session's end was the user's when no task ran since
(the task records on the host say when each started and ended) and no session or task runs in a VM now (their
live markers, agentbox.livemarkers): any task and any VM of this machine, since another project's VM may mount
this workspace. The tripwire itself keeps the launches and the kept
sessions (agentbox.review.tripwire).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from agentbox import livemarkers, paths

if TYPE_CHECKING:
    from agentbox.config.load import Config


class ProjectActivity:
    """tripwire.Busy for one project's config."""

    def __init__(self, workspace: Path, vms: set[str]) -> None:
        self.workspace = workspace
        self.vms = vms

    @classmethod
    def of(cls, config: Config) -> ProjectActivity:
        return cls(config.require_workspace(), {config.vm_name, *(agent.vm_name for agent in config.agents.values())})

    def __call__(self, since: float) -> bool:
        # deferred: start-up (the task records: asked only when a watched file changed, tests/test_own_time.py)
        from agentbox.tasks import records
        from agentbox.tasks.transitions import ACTIVE

        # Every VM and every task of this machine, not only the project's: another project's VM may mount this
        # workspace (a parent folder's project) and write it. Cautious: the user's edit is then an alarm, as before.
        if any(self.vm_busy(vm) for vm in sorted(self.vms | _every_vm())):
            return True
        return any(task.state in ACTIVE or (task.ended or 0) >= since or (task.started or 0) >= since
                   for task in records.all_tasks())

    def vm_busy(self, vm_name: str) -> bool:
        return livemarkers.any_fresh(vm_name)


def _every_vm() -> set[str]:
    """The VMs agentbox keeps state for on this machine (their outboxes hold the live markers)."""
    try:
        return {entry.name for entry in os.scandir(paths.state_dir() / "vms") if entry.is_dir(follow_symlinks=False)}
    except OSError:
        return set()
