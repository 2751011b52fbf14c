"""The VM's attention watcher as a process: `python -m agentbox.tasks.watcher VM` (agentbox.session.attention).

It shows the events of the VM's sessions and tasks; a task's end also brings its record up to date at once, its
outputs moved to the host, rather than at the next command that looks.
"""

from __future__ import annotations

import sys

from agentbox.errors import AgentboxError
from agentbox.session import attention
from agentbox.tasks import records


def harvest(vm_name: str, task_id: str) -> None:
    """Bring the ended task's record up to date now (the next agentbox command that looks does it otherwise)."""
    task = records.get(int(task_id)) if task_id.isdigit() else None
    if task is not None and task.vm == vm_name:
        try:
            records.refresh([task], check_vms=False)
        except (OSError, ValueError, AgentboxError):
            pass


if __name__ == "__main__":
    sys.exit(attention.watch(sys.argv[1], harvest))
