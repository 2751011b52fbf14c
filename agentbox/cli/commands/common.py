"""What the commands share: the merged config with its notices, the trust gate, a VM session.

Helpers live here, below the commands, so no command module imports from cli.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentbox import hosttools, paths, timing
from agentbox.agents.builtin import default_agent
from agentbox.config import load, trust
from agentbox.errors import ConfigError, UsageError
from agentbox.progress import warn
from agentbox.vm import lifecycle
from agentbox.vm.lima import Lima

if TYPE_CHECKING:
    import click

    from agentbox.config.load import Config, TrustedText
    from agentbox.vm.lifecycle import VmControl


def load_config(ctx: click.Context, describe: bool = False, vm_only: bool = False,
                trusted: TrustedText | None = None) -> Config:
    """The merged config for the folder agentbox runs in; its notices go to stderr.

    A config file agentbox will not use (see config.load) stops every command but the display ones
    (`describe`), which leave it out and say why. `vm_only` (config.load): a mount in error is left out, with a
    notice.
    """
    with timing.phase("config (find, parse, validate, merge)"):
        loaded = load.load(ctx.obj["cwd"], describe=describe, vm_only=vm_only, trusted=trusted)
    load.print_notices(loaded)
    hosttools.distrust_all(loaded.agent_writable())  # before any host tool is looked up
    return loaded


def agent_named(config: Config, wanted: str | None) -> str:
    """--agent NAME (run, start, restart): the name, when the config knows it; the default agent without one."""
    agents = config.agents
    if wanted is None:
        return default_agent(agents)
    if wanted not in agents:
        raise UsageError(f"--agent {wanted!r} is not an agent agentbox knows",
                         hint=f"One of: {', '.join(agents)} (or define it under agents: in agentbox.yml).")
    return wanted


def warn_if_untrusted(loaded: Config) -> None:
    """Display commands describe an untrusted config; they say so, once, on stderr."""
    if loaded.local_file is None:
        return
    risky = trust.risky_keys(loaded)
    if risky and not trust.is_trusted(loaded):
        keys = ", ".join(dict.fromkeys(item.split(" ")[0].rstrip(":") for item in risky))
        warn(f"{loaded.local_file} is UNTRUSTED; launches refuse it until `agentbox trust` ({keys})")


def vm_control(ctx: click.Context, needs_config: bool = True, acts: bool = True, needs_trust: bool = True,
            vm_only: bool = False) -> VmControl:
    """Config and limactl for a command. `acts` commands change a VM; those that start or configure it from the
    project's config (`needs_trust`) refuse an untrusted local config that needs trust.
    The others (stop, rm) need only the VM's name: they go on, but never where an untrusted file chose the VM.
    `vm_only` commands (stop, rm, status) need the VM's name and state, never the mounts: a mount the agent made
    unusable does not stop them (config.load)."""
    if vm_only:
        config: Config | None = _vm_only_config(ctx, acts)
    else:
        config = load_config(ctx, describe=not acts) if needs_config else None
    if config is not None and acts and not vm_only:
        if needs_trust:
            trust.require_trust(config)
        else:
            refuse_untrusted_identity(config)
    return lifecycle.VmControl(config=config, lima=Lima(debug=ctx.obj["debug"]), verbose=ctx.obj["verbose"],  # type: ignore[arg-type]
                      on_stopped=vm_stopped)


def _vm_only_config(ctx: click.Context, acts: bool) -> Config:
    """The config of a command that needs only the VM's name and state (stop, rm, status). When the local file
    cannot be used now (the agent can rewrite or break it, or change the keys that choose the VM), its content as
    the user last trusted it stands in, with a warning: the agent cannot keep the user from stopping its VM."""
    try:
        loaded = load_config(ctx, describe=not acts, vm_only=True)
        if acts:
            refuse_untrusted_identity(loaded)
        return loaded
    except ConfigError as error:
        path = load.local_file_for(ctx.obj["cwd"])
        stand_in = trust.as_last_trusted(path) if path is not None else None
        if stand_in is None:
            raise
        warn(error.message)
        warn(f"this command needs only the VM: it goes on with {path} as you last trusted it "
             "(`agentbox trust --show` shows what changed since)")
    loaded = load_config(ctx, describe=not acts, vm_only=True, trusted=stand_in)
    if acts:
        refuse_untrusted_identity(loaded)
    return loaded


def refuse_untrusted_identity(config: Config, chosen: str = "the VM this command acts on") -> None:
    """Refuse (exit 2) to act on a VM (or a folder) that an untrusted edit of the local file chose."""
    changed = trust.untrusted_identity(config)
    if changed:
        assert config.local_file is not None
        raise ConfigError(
            f"{config.local_file} sets {' and '.join(changed)}, which choose {chosen}, and the file changed "
            "since you trusted it; agentbox does not act on what an unreviewed edit chose",
            hint=f"Read the change (`agentbox trust --show`); if it is yours, run `agentbox -C "
                 f"{config.local_file.parent} trust`, else undo it. `agentbox ls` lists the VMs.",
        )


def vm_stopped(vm_name: str) -> None:
    """What ends with a VM agentbox stopped: its background tasks and its network proxy."""
    # deferred: start-up (guard: not on a warm launch)
    from agentbox.net import guard

    settle_tasks(vm_name, f"its VM {vm_name} was stopped")
    guard.stop(vm_name)  # its sessions ended with it


def settle_tasks(vm_name: str, reason: str) -> None:
    """The VM's background tasks end with it; their outputs move into their records (agentbox.tasks.records)."""
    if not paths.tasks_dir().is_dir():
        return
    # deferred: start-up (records: not on a warm launch)
    from agentbox.tasks import records

    for task in records.settle_vm(vm_name, reason):
        warn(f"{task.label} ended as {task.state}: {reason}")


def vm_name(control: VmControl, agent: str | None = None) -> str:
    """The project's VM, or the VM of one agent (agents.NAME.vmName)."""
    control.config.require_workspace()
    return control.config.agent(agent).vm_name if agent else control.config.vm_name
