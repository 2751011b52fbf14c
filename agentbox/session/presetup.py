"""The first launch's setup, done by `agentbox start`: the staging folder and launch.sh's setup for the agent a launch
would most likely run, without running it (launch.sh --setup-only).

launch.sh records the setup it finished (provision/launch/current.sh), so the first `agentbox run` or launch of that
agent after the start finds its setup done and skips it; a launch of another agent, or after a change, sets up as
before. The VM is recorded as checked (agentbox.vm.verified), as after a launch's slow path, so that launch is also
warm: one `limactl shell`. An isolated VM has nothing to prepare: each of its launches sets up its own copy.
"""

from __future__ import annotations

from agentbox.config.load import AgentConfig
from agentbox.progress import Progress, emit
from agentbox.safetext import visible
from agentbox.session import prepare, staging, warm
from agentbox.vm import lifecycle
from agentbox.vm.lima import Instance

OUTPUT_LIMIT = 1 << 16  # launch.sh prints nothing on stdout with --setup-only


def set_up(control: lifecycle.VmControl, agent: AgentConfig, instance: Instance) -> int | None:
    """Run `agent`'s launch setup in the running VM `instance` (its row of the start's `limactl list`); launch.sh's
    exit code, or None when there is nothing to set up ahead (an isolated VM)."""
    launch = prepare.prepare(control, prepare.Ask(agent, steps=prepare.TASK))
    if launch.isolated:
        return None
    with prepare.proxied(launch) as launch:  # in allowlist mode the bootstrap scripts reach out through it
        launch = prepare.listed_reached(launch, instance)
        assert launch.instance is not None and launch.attempt is not None
        refreshed = staging.refresh(launch, launch.instance, launch.lease.port if launch.lease else None)
        staging.stage_context(launch, refreshed, launch.instance, None)
        command = staging.launch_command(launch, refreshed.folder, staging.LaunchOptions(setup_only=True))
        shell = warm.argv(launch.attempt, launch.workspace, launch.workdir, command)
        try:
            with Progress(f"Setting up VM {launch.vm_name} for the first launch of {agent.name}", control.verbose):
                code, _, said = control.lima.shell_bytes(launch.vm_name, shell, OUTPUT_LIMIT, stdin_data=b"")
                if code != 0:
                    raise _Failed  # the step's line says failed
        except _Failed:
            pass
    for line in said.splitlines():
        emit(visible(line))
    return code


class _Failed(Exception):
    """launch.sh's setup did not finish (its exit code and messages are set_up's)."""
