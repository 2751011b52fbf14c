"""One launch: make sure the VM runs, refresh the staging folder, then one `limactl shell` that does the rest.

A warm launch therefore costs exactly two limactl calls: `list` and `shell`. Everything the session
needs (env, credentials, guards, bootstrap) reaches the VM through the read-only staging mount.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentbox import bootstrap, credentials, drift, render, resources, timing, tripwire, vm
from agentbox.config import AgentConfig, Config
from agentbox.errors import StateError
from agentbox.fsutil import private_dir, write_if_changed
from agentbox.lima import Instance
from agentbox.progress import note

GUEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SSH_FAILED = 255  # limactl shell passes ssh's own exit code on: 255 when the connection failed
GUARD_FILES = ("git", "gh", "pre-push", "hook-dispatch")


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
    scripts = bootstrap.plan(config, str(render.staging_dir(name)))
    with timing.phase("VM state (limactl list, start)"):
        instance = (
            vm.ensure_running(session, name, running) if running is not None else vm.ensure_running(session, name)
        )
    with timing.phase("staging (credentials, env, guards)"):
        refresh_staging(config, name, agent, scripts)
    state = vm.read_state(name)
    changed = drift.changed_settings(state.get("fingerprint"), config)
    if changed:
        note(f"{', '.join(changed)} changed since {name} was created; `agentbox start --recreate` applies it")
    reconnect = bool(state.get("reconnect"))
    command = launch_command(config, workspace, scripts, agent, render.staging_dir(name))
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


def launch_command(
    config: Config, workspace: Path, scripts: bootstrap.Plan, agent: AgentConfig | None, staging: Path
) -> list[str]:
    command = [
        "/bin/bash",
        str(staging / "launch.sh"),
        "--wait",
        str(config.startup_wait_sec),
        "--workspace",
        str(workspace),
    ]
    command += ["--guards", "off" if config.remote_write else "on"]
    if timing.enabled():
        command += ["--timing"]
    if agent is not None:
        command += ["--binary", agent.binary, "--install", agent.install or ""]
    for path in scripts.on_create:
        command += ["--on-create", path]
    for path in scripts.on_start:
        command += ["--on-start", path]
    return command


def refresh_staging(config: Config, name: str, agent: AgentConfig | None, scripts: bootstrap.Plan) -> Path:
    """The host side of the read-only staging mount: scripts, guards, credentials, the 0600 env file."""
    staging = private_dir(render.staging_dir(name))
    write_if_changed(staging / "launch.sh", resources.text("provision", "launch.sh").encode(), 0o700)
    guards = private_dir(staging / "guards")
    for guard in GUARD_FILES:
        write_if_changed(guards / guard, resources.path("wrappers", guard).read_bytes(), 0o700)
    bootstrap.stage(scripts, staging)
    extra_env: dict[str, str] = {}
    files: list[str] = []
    settings = config.credentials
    if settings.enabled:
        agents = [agent] if agent is not None else list(config.agents.values())
        files = [path for a in agents for path in a.credentials]
        if settings.gh:
            files += list(credentials.GH_FILES)
            if "GH_TOKEN" not in config.env:
                token = credentials.gh_token_from_keychain()
                if token:
                    extra_env["GH_TOKEN"] = token
        if settings.netrc:
            files.append(credentials.NETRC)
    _, warnings = credentials.refresh(staging, files, include_git_identity=settings.enabled and settings.git)
    credentials.warn(warnings)
    if (
        config.ca_cert is not None or os.environ.get("NODE_EXTRA_CA_CERTS")
    ) and "NODE_EXTRA_CA_CERTS" not in config.env:
        extra_env["NODE_EXTRA_CA_CERTS"] = GUEST_CA_BUNDLE
    write_env_file(staging, {**extra_env, **config.env})
    return staging


def write_env_file(staging: Path, env: dict[str, str]) -> None:
    env_file = staging / "env"
    if env:
        payload = b"".join(f"{key}={value}".encode() + b"\0" for key, value in env.items())
        write_if_changed(env_file, payload, 0o600)
    elif env_file.exists():
        env_file.unlink()


def workdir_for(cwd: Path, workspace: Path) -> str:
    """The user's folder when it lies inside the workspace, else the workspace root."""
    resolved = Path(os.path.realpath(cwd))
    return str(resolved) if resolved == workspace or workspace in resolved.parents else str(workspace)
