"""One launch: make sure the VM runs, refresh the staging folder, then one `limactl shell` that does the rest.

A warm launch therefore costs exactly two limactl calls: `list` and `shell`.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox import drift, render, resources, vm
from agentbox.config import AgentConfig
from agentbox.errors import StateError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.progress import note

LAUNCH_SCRIPT = f"{render.STAGING_MOUNT_POINT}/launch.sh"


def run_in_vm(
    session: vm.Session,
    name: str,
    argv: list[str],
    interactive_shell: bool = False,
    agent: AgentConfig | None = None,
) -> int:
    config = session.config
    workspace = config.require_workspace()
    vm.ensure_running(session, name)
    refresh_staging(name, config.env)
    state = vm.read_state(name)
    changed = drift.changed_settings(state.get("fingerprint"), config)
    if changed:
        note(f"{', '.join(changed)} changed since {name} was created; `agentbox start --recreate` applies it")
    reconnect = bool(state.get("reconnect"))
    command = ["/bin/bash", LAUNCH_SCRIPT, "--wait", str(config.startup_wait_sec)]
    if agent is not None:
        command += ["--binary", agent.binary, "--install", agent.install or ""]
    command += ["--", *argv] if not interactive_shell else []
    code = session.lima.shell(name, command, workdir=workdir_for(config.cwd, workspace), reconnect=reconnect)
    if reconnect:
        vm.update_state(name, {"reconnect": False})
    if code in (1, 255) and session.instance(name) is None:
        raise StateError(
            f"the VM {name} disappeared while agentbox was starting the session",
            hint="Another process deleted it. Run the command again to create it anew.",
        )
    return code


def refresh_staging(name: str, env: dict[str, str]) -> Path:
    """The host side of the read-only staging mount: the launch script and the 0600 env file."""
    staging = private_dir(render.staging_dir(name))
    _write_if_changed(staging / "launch.sh", resources.text("provision", "launch.sh").encode(), 0o700)
    env_file = staging / "env"
    if env:
        payload = b"".join(f"{key}={value}".encode() + b"\0" for key, value in env.items())
        _write_if_changed(env_file, payload, 0o600)
    elif env_file.exists():
        env_file.unlink()
    return staging


def _write_if_changed(path: Path, data: bytes, mode: int) -> None:
    try:
        if path.read_bytes() == data and (os.stat(path).st_mode & 0o777) == mode:
            return
    except OSError:
        pass
    atomic_write(path, data, mode=mode)


def workdir_for(cwd: Path, workspace: Path) -> str:
    """The user's folder when it lies inside the workspace, else the workspace root."""
    resolved = Path(os.path.realpath(cwd))
    return str(resolved) if resolved == workspace or workspace in resolved.parents else str(workspace)
