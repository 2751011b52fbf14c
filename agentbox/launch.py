"""One launch: make sure the VM runs, refresh the staging folder, then one `limactl shell` that does the rest.

A warm launch therefore costs exactly two limactl calls: `list` and `shell`. Everything the session
needs (env, credentials, guards, bootstrap, the sandbox's description) reaches the VM through the
read-only staging mount (agentbox.staging describes it, and the command line of provision/launch.sh).
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox import bootstrap, context, drift, staging, timing, tripwire, vm
from agentbox.config import AgentConfig
from agentbox.errors import StateError
from agentbox.lima import Instance
from agentbox.progress import note

SSH_FAILED = 255  # limactl shell passes ssh's own exit code on: 255 when the connection failed


def run_in_vm(
    session: vm.Session,
    name: str,
    argv: list[str],
    interactive_shell: bool = False,
    agent: AgentConfig | None = None,
    running: Instance | None = None,
) -> int:
    """Run argv (or a login shell) in the VM `name`, creating or starting it as needed.

    `running` is the Running row of a `limactl list` the caller just made: it is checked, not listed again.
    """
    config = session.config
    workspace = config.require_workspace()
    scripts = bootstrap.plan(config, str(staging.folder(name)))
    with timing.phase("VM state (limactl list, start)"):
        instance = (
            vm.ensure_running(session, name, running) if running is not None else vm.ensure_running(session, name)
        )
    state = vm.read_state(name)
    seen = context.vm_facts(instance)
    if state.get("seen") != seen:  # what `agentbox describe` reports without asking Lima
        vm.update_state(name, {"seen": seen})
    with timing.phase("staging (credentials, env, guards)"):
        staging.refresh(config, name, agent, scripts, instance)
    changed = drift.changed_settings(state.get("fingerprint"), config)
    if changed:
        note(f"{', '.join(changed)} changed since {name} was created; `agentbox start --recreate` applies it")
    reconnect = bool(state.get("reconnect"))
    command = staging.launch_command(config, workspace, scripts, agent, staging.folder(name))
    command += ["--", *argv] if not interactive_shell else []
    with timing.phase("tripwire fingerprint"):
        before, unacknowledged = tripwire.begin_session(workspace)
    tripwire.remind(unacknowledged)
    with timing.phase("in-VM setup + agent (limactl shell)"):
        code = session.lima.shell(name, command, workdir=workdir_for(config.cwd, workspace), reconnect=reconnect)
    with timing.phase("tripwire check"):
        tripwire.report_session(*tripwire.end_session(workspace, before))
    if reconnect:
        vm.update_state(name, {"reconnect": False})
    if code in (1, 255) and session.instance(name) is None:
        raise StateError(
            f"the VM {name} disappeared while agentbox was starting the session",
            hint="Another process deleted it. Run the command again to create it anew.",
        )
    if code == SSH_FAILED:
        note(
            f"exit {SSH_FAILED} is how ssh reports that it could not reach {name} (unless the program itself "
            f"exited {SSH_FAILED}). `agentbox restart` restarts the VM; Lima's logs are in {instance.dir}"
            f" ({os.path.join(instance.dir, 'ha.stderr.log')})."
        )
    return code


def workdir_for(cwd: Path, workspace: Path) -> str:
    """The user's folder when it lies inside the workspace, else the workspace root."""
    resolved = Path(os.path.realpath(cwd))
    return str(resolved) if resolved == workspace or workspace in resolved.parents else str(workspace)
