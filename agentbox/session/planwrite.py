"""Saving a full launch's verified plan at its shell (agentbox.session.plan has the format and the checks).

Only a launch the plan can replay exactly saves one: an agent's session reached warm (the guest proved the VM),
live, not kept, not in a worktree, not a login, with nothing said before its shell, and every input read by a
path (agentbox.session.planrecorder). Anything else leaves the previous plan out of use: the key's plan is
removed, so that a launch that could not be planned never leaves an older plan to be taken for it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox import progress
from agentbox.agents.builtin import flag_subcommands, model_after
from agentbox.credentials import writeback
from agentbox.review import instructionfiles
from agentbox.session import plan, warm
from agentbox.session.planrecorder import Recorder

if TYPE_CHECKING:
    from agentbox.session.checkpointing import SessionCheckpoints
    from agentbox.session.prepare import Launch

LIMA_LOG = "ha.stderr.log"  # what agentbox.vm.forwards reads for ports Lima could not forward


def offer(recorder: Recorder, launch: Launch, points: SessionCheckpoints, shell_argv: list[str],
          command: list[str], handback: writeback.Plan | None) -> bool:
    """Save the plan of this launch when it can be replayed; whether it was."""
    decided = _decided(recorder, launch, points, shell_argv, command, handback)
    if decided is None or recorder.unprovable or progress.emitted != recorder.emitted_before:
        plan.forget(recorder.key)
        return False
    return plan.save(recorder.key, decided, [*recorder.entries(), *_own_code()])


def _decided(recorder: Recorder, launch: Launch, points: SessionCheckpoints, shell_argv: list[str],
             command: list[str], handback: writeback.Plan | None) -> dict[str, Any] | None:
    ask, agent, attempt = launch.ask, launch.agent, launch.attempt
    if (agent is None or attempt is None or attempt.mode != warm.PROVE or launch.isolated or launch.kept is not None
            or ask.worktree is not None or ask.login or ask.copy or not ask.steps.session_checkpoints
            or points.made_in is not None or launch.state.get("reconnect") or launch.instance is None):
        return None
    launch_part = shell_argv[:len(shell_argv) - len(command) - 1]
    if shell_argv[len(launch_part):] != ["--", *command]:
        return None
    slots = {attempt.nonce: plan.NONCE, str(attempt.started): plan.STARTED}
    if points.go is not None:
        slots[points.go] = plan.GO
    if handback is not None:
        slots[str(handback.returns.folder)] = plan.RETURNS
    lease = launch.lease
    busy = ask.busy
    log = str(Path(launch.instance.dir) / LIMA_LOG)
    return {
        "vm": launch.vm_name, "workspace": str(launch.workspace), "agent": agent.name, "token": attempt.token,
        "network": launch.config.network.mode,  # for the session's report
        "argv": [slots.get(part, part) for part in launch_part],
        "command": {"binary": agent.binary, "defaultArgs": list(agent.default_args), "model": agent.model,
                    "after": model_after(agent.name, agent.default_args),
                    "subcommands": flag_subcommands(agent.name)},
        "proxy": {"port": lease.port, "brokers": lease.brokers, "program": lease.program} if lease else None,
        "checkpoints": {"settings": list(points.settings), "tree": str(points.workspace), "verbose": points.verbose},
        "busy": sorted(getattr(busy, "vms", ())),
        "instructions": list(instructionfiles.quarantined(launch.config)),
        "returns": writeback.plan_to_json(handback) if handback is not None else None,
        "limaLog": [log, plan.signature(log, plan.FILE)],
    }


def _own_code() -> list[tuple[str, str, bool]]:
    """agentbox's own modules as this launch loaded them: a changed one may decide differently."""
    root = str(Path(plan.__file__).resolve().parent.parent)
    found = []
    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None)
        if source and source.startswith(root):
            found.append((source, plan.FILE, True))
    return found
