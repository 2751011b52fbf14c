"""The project VM's lifecycle: find it, create it, start it, recover it.

Only this module asks lima.py to change a VM.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from agentbox import paths
from agentbox.config import naming
from agentbox.config.load import Config
from agentbox.errors import Interrupted, LimaError, RefusedError, StateError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.progress import Progress, note, warn
from agentbox.safetext import visible
from agentbox.vm import drift, effective, render, statefile, verified
from agentbox.vm.lima import BROKEN, MIN_START_TIMEOUT, NOT_CREATED, RUNNING, STOPPED, Instance, Lima

WORKSPACE_PARAM = "agentboxWorkspace"
POLL_INTERVAL = 2.0


class VmControl:
    """What one agentbox invocation needs to manage its VM."""

    def __init__(self, config: Config, lima: Lima, verbose: bool = False,
                 on_stopped: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.lima = lima
        self.verbose = verbose
        # What ends with a VM agentbox stopped (its tasks, its network proxy) is settled by the command layer.
        self.on_stopped = on_stopped or (lambda name: None)

    def instance(self, vm_name: str) -> Instance | None:
        return self.lima.get(vm_name)


def workspace_of(instance: Instance) -> str | None:
    """The workspace a project VM was made for; None for any other instance (a base VM's is empty)."""
    return instance.param.get(WORKSPACE_PARAM) or None


def is_agentbox_vm(instance: Instance) -> bool:
    return workspace_of(instance) is not None


def half_made(instance: Instance, config: Config) -> bool:
    """Whether the instance is one a first launch of this workspace began and did not finish (interrupted in
    `limactl clone` or `create`): agentbox's record says it was making it for this workspace and never finished,
    and the instance carries agentbox's workspace param, empty (the base's copy before its edits) or this
    workspace's. A Lima instance made by hand has no such param, so it stays foreign whatever the record says."""
    workspace = str(config.workspace)
    if instance.param.get(WORKSPACE_PARAM, None) not in ("", workspace):
        return False
    vm_record = statefile.read(instance.name)
    return bool(vm_record.get("creating")) and "created" not in vm_record and vm_record.get("workspace") == workspace


HALF_MADE = "{name} was left half-made by an interrupted first launch"


def check_ownership(instance: Instance, config: Config) -> None:
    """Refuse a VM recorded for another workspace, or one agentbox did not create."""
    recorded = workspace_of(instance)
    workspace = str(config.require_workspace())
    if half_made(instance, config):
        raise StateError(
            HALF_MADE.format(name=instance.name),
            hint=f"Run `agentbox start` to make it again, or `agentbox rm --yes` to discard {instance.name}.",
        )
    if recorded is None:
        raise StateError(
            f"the Lima instance {instance.name} exists but was not created by this agentbox "
            "(it records no workspace), so agentbox will not use it",
            hint=clash_hint(config, instance.name, foreign=True),
        )
    if recorded != workspace:
        raise StateError(
            f"the VM {instance.name} belongs to {recorded}, not to this workspace {workspace} "
            "(two projects with the same folder name?)",
            hint=clash_hint(config, instance.name),
        )


def clash_hint(config: Config, vm_name: str, foreign: bool = False) -> str:
    """The fix for a VM name that is taken, wherever the clash is reported: by another workspace's VM, or
    (foreign) by a Lima instance agentbox did not create."""
    own = f"give this workspace its own VM: {own_vm_instruction(config, vm_name)}"
    if foreign:
        return f"Recreate it with `agentbox start --recreate` (this deletes {vm_name}), or {own}"
    return own[0].upper() + own[1:]


def own_vm_instruction(config: Config, vm_name: str) -> str:
    """One copy-pasteable instruction that moves this workspace off the VM name `vm_name`."""


    free = naming.distinct_vm_name(config.workspace, paths.lima_home(), vm_name)
    if config.local_file is None:
        return visible(
            f"`agentbox -C {shlex.quote(str(config.workspace))} init --vm-name {free}` (it writes "
            f"{config.workspace / paths.LOCAL_CONFIG_NAME} with that name and trusts it)."
        )
    agent = next((a.name for a in config.agents.values() if a.vm_name == vm_name and vm_name != config.vm_name), None)
    where = f"`vmName: {free}` under `agents: {agent}:`" if agent else f"`name: {free}` under `vm:`"
    return visible(
        f"set {where} in {config.local_file}, "
        f"then run `agentbox -C {shlex.quote(str(config.local_file.parent))} trust`."
    )


_UNKNOWN: Any = object()


def check_workspace_matches(instance: Instance, config: Config) -> None:
    """For stop and rm: a VM recorded for another workspace is not this project's to touch."""
    if workspace_of(instance) is not None:
        check_ownership(instance, config)


def ensure_running(control: VmControl, vm_name: str, known: Instance | None = _UNKNOWN) -> Instance:
    """Make sure the project's VM exists, runs and runs with what agentbox rendered.

    `known` is the result of a `list` the caller already made, so no call is repeated: a VM that
    already runs costs that one `limactl list`, whose row also carries the config it is checked against.
    """
    instance = control.instance(vm_name) if known is _UNKNOWN else known
    if instance is not None and not half_made(instance, control.config):
        check_ownership(instance, control.config)
        if instance.status == RUNNING and verify_running(control, instance):
            return instance
    with statefile.lock(vm_name) as waited:
        if waited:  # another agentbox held the lock: it may have created or started the VM meanwhile
            instance = control.instance(vm_name)
        if instance is not None and half_made(instance, control.config):
            # Holding the lock, nobody else is making it: what an interrupt left is discarded and made anew.
            note(HALF_MADE.format(name=vm_name) + "; making it again")
            control.lima.delete(vm_name, force=True)
            instance = None
        if instance is None:
            try:
                return create_and_start(control, vm_name)
            except _AlreadyExists:
                instance = control.instance(vm_name)  # created by an agentbox that did not hold our lock yet
                if instance is None:
                    raise StateError(
                        f"limactl says {vm_name} already exists, but `limactl list` does not show it"
                    ) from None
        check_ownership(instance, control.config)
        if instance.status == RUNNING:
            if verify_running(control, instance):
                return instance
            # Refused earlier and started again outside agentbox: what it booted with is unknown.
            note(f"{vm_name} was refused earlier and has been started since; restarting it to check what it runs with")
            control.lima.stop(vm_name, force=True)
            return start(control, vm_name, instance.dir, instance)
        if instance.status == STOPPED:
            started = start(control, instance.name, instance.dir, instance)
        elif instance.status == BROKEN:
            started = recover(control, instance)
        else:
            return wait_for_settled(control, instance)
        note_stale_base(control.config, vm_name)
        return started


def note_stale_base(config: Config, vm_name: str) -> None:
    """One line when the VM was cloned from a base that is no longer current, said once per VM and base (the
    VM's state keeps which base it was said about). Never on a warm launch: the key costs a template render."""
    vm_record = statefile.read(vm_name)
    recorded = vm_record.get("base")
    if recorded and config.vm_base == "auto":
        # deferred: start-up (vm.golden: only a VM cloned from a base needs it, never the warm launch)
        from agentbox.vm import golden

        found = golden.stale_note(config, recorded)
        if found and vm_record.get("staleBaseNoted") != found[0]:
            note(found[1])
            statefile.update(vm_name, {"staleBaseNoted": found[0]})


def verify_running(control: VmControl, instance: Instance) -> bool:
    """Check a Running VM's effective config from its `list` row (no limactl call).

    A difference marks the VM refused, stops it and raises. False: the row is clean but the VM was
    refused before, so it may still run with what was refused and has to be restarted first.
    """
    vm_record = statefile.read(instance.name)
    expected = expected_config(instance.name, vm_record)
    if expected is not None and instance.config:
        found = effective.differences(instance.config, expected, instance.dir)
        if found:
            refuse(control, instance.name, found, running=True)
    return not vm_record.get("refused")


def expected_config(vm_name: str, vm_record: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What agentbox rendered for the VM, from its state; rebuilt once from the kept lima.yaml for older VMs."""
    vm_record = statefile.read(vm_name) if vm_record is None else vm_record
    expected = vm_record.get("expected")
    if effective.is_current(expected):
        return expected
    try:
        rendered = (paths.vm_state_dir(vm_name) / "lima.yaml").read_text()
    except OSError:
        return None  # created before agentbox kept its template: nothing to compare with
    expected = effective.expected_from_rendered(rendered)
    statefile.update(vm_name, {"expected": expected})
    return expected


def refuse(control: VmControl, vm_name: str, found: list[effective.Difference], running: bool) -> NoReturn:
    """Record the VM as refused (so the next command does not use it either), stop it, raise."""
    statefile.update(vm_name, {"refused": [difference.text for difference in found]})
    if running:
        try:
            control.lima.stop(vm_name, force=True)
        except LimaError as error:
            warn(f"could not stop {vm_name}: {error.message}; agentbox still refuses to use it")
    raise effective.refusal(vm_name, found, paths.lima_home(), stopped=running)


class _AlreadyExists(Exception):
    pass


def create_and_start(control: VmControl, vm_name: str) -> Instance:
    config = control.config
    template_text = render.render(config, vm_name)
    vm_record = private_dir(paths.vm_state_dir(vm_name))
    private_dir(paths.staging_dir(vm_name))
    private_dir(paths.vm_outbox(vm_name))
    template_path = vm_record / "lima.yaml"
    atomic_write(template_path, template_text, mode=0o600)
    # Before Lima makes anything: an interrupt can leave a clone that still has the base's (empty) workspace
    # param, and this record is what lets the next run know it as its own (half_made) rather than foreign.
    statefile.write(vm_name, {"workspace": str(config.require_workspace()), "creating": time.time()})
    cloned_from = None
    try:
        if config.vm_base == "auto":
            cloned_from = _clone_from_base(control, vm_name, template_text)
        if cloned_from is None:
            with Progress(f"Creating VM {vm_name}", verbose=control.verbose) as progress:
                control.lima.create(vm_name, template_path, on_output=progress.feed)
    except Interrupted:
        raise Interrupted(
            f"interrupted while creating {vm_name}",
            hint=f"Run the same command again to finish, or `agentbox rm --yes` to discard {vm_name}.",
        ) from None
    except LimaError as error:
        if any("already exists" in line and vm_name in line for line in error.stderr_lines):
            raise _AlreadyExists() from None
        # We hold the VM's lock, so anything left under this name is our own half-made VM.
        leftover = control.instance(vm_name)
        error.log_path = leftover.log_path if leftover is not None else None
        if leftover is not None:
            control.lima.delete(vm_name, force=True)
            error.hint = " ".join(filter(None, [error.hint, f"The half-created VM {vm_name} was removed; nothing else "
                                                             "changed."]))
        elif not error.hint:
            error.hint = "No VM was created; nothing changed."
        raise
    statefile.write(
        vm_name,
        {
            "workspace": str(config.require_workspace()),
            "created": time.time(),
            "reconnect": True,
            "fingerprint": drift.creation_fingerprint(config),
            "expected": effective.expected_from_rendered(template_text),
            **({"base": cloned_from} if cloned_from else {}),
        },
    )
    # A VM made from scratch installs its packages from the internet on its first boot: that boot is not held.
    return start(control, vm_name, str(paths.lima_home() / vm_name), hold_network=cloned_from is not None)


def _clone_from_base(control: VmControl, vm_name: str, template_text: str) -> dict[str, Any] | None:
    """Make the VM a clone of the base (built first when needed): returns what the VM keeps about its base,
    or None when this project's VM cannot be a clone (said once; the caller creates it from scratch)."""
    # deferred: start-up (vm.golden: only a VM cloned from a base needs it, never the warm launch)
    from agentbox.vm import golden

    plan = golden.clone_plan(control.config, template_text)
    if isinstance(plan, str):
        note(f"creating {vm_name} from scratch, not as a clone of the base VM: {plan}")
        return None
    with golden.lock() as waited:
        current = golden.ensure(control.lima, control.config, control.verbose, waited=waited)
        if plan.disk_note:
            note(plan.disk_note)
        try:
            golden.clone(control.lima, current, vm_name, plan.edits, control.verbose)
        except golden.CloneUnsupported as error:
            note(f"this Lima cannot clone a VM with edit flags ({error}); creating {vm_name} from scratch")
            return None
    return current.reference()


def start(control: VmControl, vm_name: str, instance_dir: str, row: Instance | None = None,
          hold_network: bool = True) -> Instance:
    """`limactl start`, checked before (mount locations; the `list` row of a stopped VM) and after. The VM's network
    is held on the host when its mode asks for it and its driver allows (agentbox.net.hold)."""
    expected = expected_config(vm_name)
    private_dir(paths.vm_outbox(vm_name))  # a mount location Lima needs to find
    if expected is not None:
        effective.check_mount_locations(vm_name, expected)
        if row is not None and row.config:
            found = effective.differences(row.config, expected, row.dir or instance_dir)
            if found:
                refuse(control, vm_name, found, running=False)
    apply_in_place(control, vm_name, row)
    timeout = max(MIN_START_TIMEOUT, control.config.startup_wait_sec)
    log_path = os.path.join(instance_dir, "ha.stderr.log")
    config = control.config
    # deferred: start-up (net.holdstart: only a start writes the VM's QEMU launcher; a warm launch starts nothing)
    from agentbox.net import holdstart

    held_env = holdstart.start_env(vm_name, config.network if hold_network else config.network._replace(mode="open"),
                              config.vm_type, config.arch)
    try:
        with Progress(f"Starting VM {vm_name}", verbose=control.verbose) as progress:
            control.lima.start(vm_name, timeout, on_output=progress.feed, env=held_env)
    except Interrupted:
        raise Interrupted(
            f"interrupted while starting {vm_name}; Lima may keep booting it in the background",
            hint="Run the same command again: agentbox waits for the VM to finish starting.",
        ) from None
    except LimaError as error:
        error.log_path = log_path
        if is_degraded(error):
            remember_degraded(vm_name, error)
            error.hint = (
                f"{vm_name} is running, but Lima reports it degraded: its provisioning did not finish (a readiness "
                "probe failed), or a mount or port forward failed. See why with `agentbox doctor` and "
                "`agentbox shell -- sudo tail -n 50 /var/log/cloud-init-output.log`; `agentbox restart` starts it "
                "again. Every launch says so until a start finishes cleanly."
            )
            raise
        error.hint = (
            f"{vm_name} was not deleted. Run the command again to retry, see Lima's log "
            f"{log_path}, or start over with `agentbox start --recreate`."
        )
        raise
    vm_record = statefile.read(vm_name)
    vm_record.pop("degraded", None)  # this start finished cleanly
    statefile.write(vm_name, {**vm_record, "booted": time.time()})
    instance = require_running(control, vm_name)
    if expected is not None and instance.config:
        found = effective.differences(instance.config, expected, instance.dir)
        if found:
            refuse(control, vm_name, found, running=True)
    statefile.clear_refusal(vm_name)
    return instance


def is_degraded(error: LimaError) -> bool:
    """Lima's start ended degraded (VM left running): its fatal `degraded, status={...}` or its DEGRADED line."""
    return any(line.startswith(("degraded", "DEGRADED")) for line in error.stderr_lines)


def remember_degraded(vm_name: str, error: LimaError) -> None:
    """Kept in the VM's state, so every launch says it (no limactl call) until a start finishes cleanly."""
    errors = [line for line in error.stderr_lines if not line.startswith(("degraded", "DEGRADED"))]
    statefile.update(vm_name, {"degraded": {"at": time.time(), "errors": errors[-3:]}})


def degraded_note(vm_name: str, vm_record: dict[str, Any]) -> str | None:
    """The line a launch says about a VM whose last start Lima reported degraded (read from its state)."""
    degraded = vm_record.get("degraded")
    if not degraded:
        return None

    errors = degraded.get("errors") if isinstance(degraded, dict) else None
    found = "; ".join(str(line)[:200] for line in errors) if isinstance(errors, list) and errors else ""
    return visible(
        f"Lima reported the last start of {vm_name} degraded{f' ({found})' if found else ''}: its provisioning, "
        "mounts or port forwards may not work. `agentbox doctor` says more; `agentbox restart` starts it again."
    )


def apply_in_place(control: VmControl, vm_name: str, row: Instance | None) -> None:
    """The stopped VM gets the cpus, memory and larger disk the config asks for (`limactl edit`, vm.inplace)."""
    # deferred: start-up (vm.inplace: only when cpus/memory/disk changed, never the warm launch)
    from agentbox.vm import inplace

    found = inplace.plan(statefile.read(vm_name).get("fingerprint"), control.config, row.disk if row is not None else 0)
    if found.kept:
        note(found.kept)
    if found.pending:
        try:
            with Progress(f"Applying {', '.join(found.changes)} to VM {vm_name}", verbose=control.verbose):
                control.lima.edit(vm_name, found.edits)
        except LimaError as error:
            error.hint = (
                f"{vm_name} was not changed and not started. Lima checks the VM's whole config with the change "
                f"({paths.lima_home() / vm_name / 'lima.yaml'}): fix what it names, or set vm.cpus, vm.memory and "
                "vm.disk back (`agentbox config --sources` shows where each is set), then run the command again."
            )
            raise
    if found.applied or found.settled:
        record_in_place(vm_name, {**found.settled, **found.applied}, applied=found.pending)


def settle_in_place(control: VmControl, instance: Instance, vm_record: dict[str, Any] | None = None) -> Instance:
    """A running VM whose cpus, memory or disk changed in the config (agentbox.vm.inplace): Lima changes them
    only while it is stopped. On a terminal, ask whether to restart it now; elsewhere say once that they apply
    at its next start. Returns the VM as it runs now. Costs no limactl call unless it restarts the VM."""
    name = instance.name
    vm_record = statefile.read(name) if vm_record is None else vm_record
    recorded = vm_record.get("fingerprint") or {}
    config = control.config
    if resources_as_recorded(config, vm_record):
        if "deferred" in vm_record:  # the config went back to what the VM has: nothing waits any more
            record_in_place(name, {}, applied=True)
        return instance  # the warm launch: nothing changed, nothing more to import
    # deferred: start-up (vm.inplace: only when cpus/memory/disk changed, never the warm launch)
    from agentbox.vm import inplace

    found = inplace.plan(recorded, config, instance.disk)
    if found is inplace.NOTHING:
        return instance
    if found.kept:
        note(found.kept)
    if found.settled:
        record_in_place(name, found.settled)
    if not found.pending or vm_record.get("deferred") == found.applied:
        return instance  # nothing to apply, or asked and said already
    what = ", ".join(found.changes)
    if sys.stdin.isatty() and sys.stderr.isatty():
        # deferred: start-up (click: the launch never imports it; only this terminal question does)
        import click

        if click.confirm(f"agentbox: {what} in the config: restart VM {name} now to apply? Sessions and background "
                         "tasks running in it end", default=False, err=True):
            return restart_to_apply(control, instance)
        note(f"{what} apply when {name} next starts (`agentbox restart`)")
    else:
        note(f"{what} in the config apply at the next `agentbox stop`/start of {name} "
             "(`agentbox restart` applies them now)")
    statefile.update(name, {"deferred": found.applied})
    return instance


def resources_as_recorded(config: Config, vm_record: dict[str, Any]) -> bool:
    """Whether the config's cpus, memory and disk are what the VM's record says it has."""
    recorded = vm_record.get("fingerprint") or {}
    return all(recorded.get(key, value) == value for key, value in
               (("cpus", config.cpus), ("memory", config.memory), ("disk", config.disk)))


def restart_to_apply(control: VmControl, instance: Instance) -> Instance:
    """Stop the running VM, apply what changed with `limactl edit`, start it (start does the edit)."""
    name = instance.name
    with statefile.lock(name):
        stop_now(control.lima, name, False, control.verbose)
        control.on_stopped(name)
        return start(control, name, instance.dir, instance)


def record_in_place(vm_name: str, values: dict[str, Any], applied: bool = False) -> None:
    """The VM now has these cpus, memory, disk (or keeps a larger disk): its record says so. `applied`: the
    edit waiting for the VM's next start was made, so nothing is deferred any more."""
    vm_record = statefile.read(vm_name)
    vm_record["fingerprint"] = {**(vm_record.get("fingerprint") or {}), **values}
    if applied:
        vm_record.pop("deferred", None)
    statefile.write(vm_name, vm_record)


def recover(control: VmControl, instance: Instance) -> Instance:
    """Lima's own recovery for a Broken VM: force-stop (clears stale pid/socket files), then start."""
    note(f"{instance.name} is Broken; trying Lima's recovery (limactl stop --force, then start)")
    try:
        control.lima.stop(instance.name, force=True)
        return start(control, instance.name, instance.dir, instance)
    except RefusedError:
        raise
    except (LimaError, StateError) as error:
        message = f"{instance.name} is still Broken after `limactl stop --force` and start: {error.message}"
        hint = (
            f"Lima's instance folder: {instance.dir}; its log: {instance.log_path}. "
            "To start over: `agentbox start --recreate`, or `agentbox rm --yes` and run again "
            "(this deletes the VM's disk; your workspace on the host is not touched)."
        )
        if isinstance(error, LimaError):  # keeps limactl's last lines for the error boundary
            raise LimaError(
                message, hint, stderr_lines=error.stderr_lines, tail=error.tail, log_path=error.log_path
            ) from None
        raise StateError(message, hint=hint) from None


def wait_for_settled(control: VmControl, instance: Instance) -> Instance:
    """Installing, Uninitialized or a status agentbox does not know: wait a bounded time, then explain."""
    deadline = time.monotonic() + control.config.startup_wait_sec
    status = instance.status
    note(f"{instance.name} is {status or 'in an unknown state'}; waiting up to {control.config.startup_wait_sec}s")
    while time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        current = control.instance(instance.name)
        if current is None:
            raise StateError(f"{instance.name} disappeared while agentbox was waiting for it")
        if current.status == RUNNING:
            return current
        if current.status == STOPPED:
            return start(control, current.name, current.dir, current)
        status = current.status
    detail = "its lima.yaml could not be loaded" if status == "" else f"status {status!r}"
    raise StateError(
        f"{instance.name} did not become usable ({detail}) within {control.config.startup_wait_sec}s",
        hint=f"Check `limactl list` and Lima's log {instance.log_path}; `agentbox start --recreate` starts over.",
    )


def require_running(control: VmControl, vm_name: str) -> Instance:
    instance = control.instance(vm_name)
    if instance is None:
        raise StateError(f"{vm_name} disappeared right after it was started", hint="Run the command again.")
    if instance.status != RUNNING:
        raise StateError(
            f"{vm_name} is {instance.status or 'unknown'} after `limactl start` succeeded",
            hint=f"See Lima's log {instance.log_path}.",
        )
    return instance


def stop(control: VmControl, vm_name: str, force: bool = False, known: Instance | None = _UNKNOWN) -> str | None:
    """Stop the VM. A step line reports a stop; the returned note says why nothing was done. `known`: the
    caller's `limactl list` row of it, so none is repeated."""
    instance = control.instance(vm_name) if known is _UNKNOWN else known
    if instance is None:
        return f"{vm_name} does not exist; nothing to stop"
    check_workspace_matches(instance, control.config)
    if instance.status == STOPPED and not force:
        return f"{vm_name} is already stopped"
    with statefile.lock(vm_name):
        stop_now(control.lima, vm_name, force or instance.status != RUNNING, control.verbose)
    control.on_stopped(vm_name)
    return None


def running_vms(lima: Lima) -> list[str]:
    """The agentbox VMs that run now."""
    return [i.name for i in lima.instances().values() if is_agentbox_vm(i) and i.status == RUNNING]


def stop_now(lima: Lima, vm_name: str, force: bool, verbose: bool) -> None:
    verified.forget(vm_name)
    with Progress(f"Stopping VM {vm_name}" + (" (forced)" if force else ""), verbose=verbose) as progress:
        lima.stop(vm_name, force=force, on_output=progress.feed)


def delete(control: VmControl, vm_name: str) -> None:
    """Delete the VM and its disk; agentbox's own state of it stays until vmstate.clear (the outbox is there)."""
    with statefile.lock(vm_name):
        verified.forget(vm_name)
        control.lima.delete(vm_name, force=True)


REMOVED = "{name} removed (its disk is gone; the workspace on the host is untouched)"


def conflict(instance: Instance | None, config: Config) -> dict[str, Any] | None:
    """When the VM of this name is not this workspace's: its name, its workspace (None when agentbox did
    not create it) and a name this workspace could use instead."""
    if instance is None or workspace_of(instance) == str(config.workspace) or half_made(instance, config):
        return None
    return {
        "vm": instance.name,
        "workspace": workspace_of(instance),
        "suggestedName": naming.distinct_vm_name(config.workspace, paths.lima_home(), instance.name),
    }


def describe(instance: Instance | None, vm_name: str, workspace: str | None) -> dict[str, Any]:
    if instance is None:
        return {
            "name": vm_name,
            "status": NOT_CREATED,
            "workspace": workspace,
            "cpus": None,
            "memory": None,
            "disk": None,
            "vmType": None,
            "arch": None,
            "dir": None,
        }
    return {
        "name": instance.name,
        "status": instance.status or "Unknown",
        "workspace": workspace_of(instance),
        "cpus": instance.cpus or None,
        "memory": instance.memory or None,
        "disk": instance.disk or None,
        "vmType": instance.vm_type or None,
        "arch": instance.arch or None,
        "dir": instance.dir or None,
    }
