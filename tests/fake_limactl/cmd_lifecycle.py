"""`limactl stop`, `restart`, `delete`, `protect`/`unprotect` and `clone` (pkg/instance/stop.go,
delete.go, clone.go)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time

import fakeqemu
import machine
from cmd_create import check_socket_path
from cmd_start import do_start, kill_boot, require_config
from constants import TMP_SUFFIXES
from context import Ctx, injected_failure, lima_lock, new_state, read_state, write_state
from editflags import apply, raw_params, validate_edit, write_lima_yaml, yq_expressions
from guest import guestfs, hostname_of
from instances import Instance, inspect
from logrus import Fatal, NotExist, bq
from pflag import Flag, Parsed, edit_flags, not_implemented_flags, wrap_args_error

STOP_FLAGS = {"force": Flag("bool", "f")}


def cmd_stop(ctx: Ctx, p: Parsed) -> int:
    errs: list[str] = []
    for name in p.args or ["default"]:
        try:
            inst = inspect(ctx, name)
        except NotExist as e:
            errs.append(str(e))
            continue
        except Fatal as e:
            errs.append(e.msg)
            continue
        if p.get("force"):
            stop_forcibly(ctx, inst)
            continue
        err = stop_gracefully(ctx, inst)
        if err:
            errs.append(err)
    if errs:
        raise Fatal("\n".join(errs))
    return 0


def stop_gracefully(ctx: Ctx, inst: Instance, *, restart: bool = False) -> str | None:
    if inst.status != "Running":
        if restart:
            ctx.log.warn("The instance is not running, continuing with the restart")
            return None
        return f"expected status `Running`, got {bq(inst.status)} (maybe use `limactl stop -f`?)"
    ctx.log.info(f"Sending SIGINT to hostagent process {inst.state.get('hostAgentPID', 0)}")
    ctx.log.info("Waiting for the host agent and the driver processes to shut down")
    fail = injected_failure(ctx, "stop")
    if fail:
        return fail
    ctx.log.info("[hostagent] Received SIGINT, shutting down the host agent")
    ctx.log.info("[hostagent] Shutting down the host agent")
    ctx.log.info("[hostagent] Shutting down QEMU with the power button")
    with lima_lock(ctx.lima_home):
        _set_stopped(inst)
    ctx.log.info("Waiting for the instance to shut down")
    ctx.log.info(f"The instance {inst.name} has shut down")
    return None


def _set_stopped(inst: Instance) -> None:
    state = read_state(inst.dir)
    kill_boot(state)
    machine.stop(state)  # the VM powers off: every guest process ends
    fakeqemu.end(inst.dir)
    # The host agent exits: its listeners close, so the forwarded host ports are free again.
    state.update(status="Stopped", errors=[], hostAgentPID=0, driverPID=0, bootPID=0, forwards=[], guestListeners=[])
    write_state(inst.dir, state)
    inst.state, inst.status = state, "Stopped"


def stop_forcibly(ctx: Ctx, inst: Instance) -> None:
    vm = (inst.config or {}).get("vmType", "")
    driver_pid, ha_pid = inst.state.get("driverPID", 0), inst.state.get("hostAgentPID", 0)
    alive = inst.status in ("Running", "Broken")
    if alive and driver_pid:
        ctx.log.info(f"Sending SIGKILL to the {vm} driver process {driver_pid}")
    else:
        ctx.log.info(f"The {vm} driver process seems already stopped")
    if alive and ha_pid:
        ctx.log.info(f"Sending SIGKILL to the host agent process {ha_pid}")
    else:
        ctx.log.info("The host agent process seems already stopped")
    ctx.log.info(f"Removing *.pid *.sock *.tmp under {bq(inst.dir)}")
    with lima_lock(ctx.lima_home):
        for entry in sorted(os.listdir(inst.dir)):
            path = os.path.join(inst.dir, entry)
            if entry.endswith(TMP_SUFFIXES) and not os.path.isdir(path):
                ctx.log.info(f"Removing {bq(path)}")
                with contextlib.suppress(OSError):
                    os.unlink(path)
        if inst.config is not None:
            _set_stopped(inst)


RESTART_FLAGS = dict(edit_flags(), force=Flag("bool", "f"), progress=Flag("bool"))


def cmd_restart(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, RESTART_FLAGS)
    if len(p.args) > 1:
        raise wrap_args_error("restart", f"accepts at most 1 arg(s), received {len(p.args)}",
                              "restart INSTANCE [flags]", "Restart a running instance")
    name = p.args[0] if p.args else "default"
    try:
        inst = inspect(ctx, name)
    except NotExist as e:
        raise Fatal(str(e))
    require_config(ctx, inst)
    with open(inst.yaml_path, "rb") as f:
        content = f.read()
    params = raw_params(content, inst.yaml_path) if "param" in p.changed else None
    exprs = yq_expressions(ctx, p, new_instance=False, params=params)
    edited = apply(exprs, content, inst.yaml_path)
    if edited != content:
        validate_edit(ctx, edited, content, inst.yaml_path, check_shrink=True)
        write_lima_yaml(inst.yaml_path, edited)
        ctx.log.info(f"Instance {bq(name)} configuration edited")
        inst = inspect(ctx, name)
    if p.get("force"):
        ctx.log.info("Restarting the instance forcibly")
        stop_forcibly(ctx, inst)
    else:
        err = stop_gracefully(ctx, inst, restart=True)
        if err:
            raise Fatal(err)
    do_start(ctx, inst, progress=bool(p.get("progress")))
    return 0


DELETE_FLAGS = {"force": Flag("bool", "f")}


def cmd_delete(ctx: Ctx, p: Parsed) -> int:
    if not p.args:
        raise wrap_args_error("delete", "requires at least 1 arg(s), only received 0",
                              "delete INSTANCE [INSTANCE, ...] [flags]", "Delete an instance of Lima")
    fail = injected_failure(ctx, "delete")
    if fail:
        raise Fatal(fail)
    errs: list[str] = []
    for name in p.args:
        try:
            inst = inspect(ctx, name)
        except NotExist:
            inst_dir = ctx.inst_dir(name)
            if not os.path.lexists(inst_dir):
                ctx.log.warn(f"Ignoring non-existent instance {bq(name)}")
            else:
                errs.append(f"instance {bq(name)} directory {bq(inst_dir)} exists but its `lima.yaml` could not "
                            "be read; it was NOT deleted, in case it is currently being cloned into. If no "
                            "`limactl` operation is using it, remove it manually")
            continue
        if inst.protected:
            raise Fatal(f"failed to delete instance {bq(name)}: instance is protected to prohibit accidental "
                        "removal (Hint: use `limactl unprotect`)")
        if not p.get("force") and inst.status != "Stopped":
            raise Fatal(f"failed to delete instance {bq(name)}: expected status `Stopped`, got {bq(inst.status)}")
        stop_forcibly(ctx, inst)
        with lima_lock(ctx.lima_home):
            shutil.rmtree(inst.dir, ignore_errors=True)
        ctx.log.info(f"Deleted {bq(name)} ({bq(inst.dir)})")
    if errs:
        raise Fatal("\n".join(errs))
    return 0


def cmd_protect_on(ctx: Ctx, p: Parsed) -> int:
    return cmd_protect(ctx, p, protect=True)


def cmd_protect_off(ctx: Ctx, p: Parsed) -> int:
    return cmd_protect(ctx, p, protect=False)


def cmd_protect(ctx: Ctx, p: Parsed, *, protect: bool = True) -> int:
    verb = "protect" if protect else "unprotect"
    if not p.args:
        raise wrap_args_error(verb, "requires at least 1 arg(s), only received 0",
                              f"{verb} INSTANCE [INSTANCE, ...] [flags]", f"{verb.capitalize()} an instance")
    errs: list[str] = []
    for name in p.args:
        try:
            inst = inspect(ctx, name)
        except (NotExist, Fatal) as e:
            errs.append(f"failed to inspect instance {bq(name)}: {getattr(e, 'msg', str(e))}")
            continue
        marker = os.path.join(inst.dir, "protected")
        if protect and inst.protected:
            ctx.log.warn(f"Instance {bq(name)} is already protected. Skipping.")
        elif not protect and not inst.protected:
            ctx.log.warn(f"Instance {bq(name)} isn't protected. Skipping.")
        elif protect:
            with open(marker, "wb"):
                pass
            os.chmod(marker, 0o400)
            ctx.log.info(f"Protected {bq(name)}")
        else:
            os.unlink(marker)
            ctx.log.info(f"Unprotected {bq(name)}")
    if errs:
        raise Fatal("\n".join(errs))
    return 0


CLONE_FLAGS = dict(edit_flags(), start=Flag("bool"))
RENAME_FLAGS = {name: Flag(flag.kind, flag.short, flag.default, unsupported=True)
                for name, flag in edit_flags().items()}
# pkg/limatype/filenames/filenames.go: SkipOnClone (the protection marker, the TPM state) and
# NullifyOnClone (the vz machine identifier, kept as an empty file).
SKIP_ON_CLONE = ("protected", "swtpm")
NULLIFY_ON_CLONE = ("vz-identifier",)


def _copy_or_move(ctx: Ctx, p: Parsed, verb: str) -> str:
    """clone.go's shared part of clone and rename: check both names, then copy (clone) or move (rename) the
    folder, leaving out what Lima skips and emptying what it nullifies. Returns the new name."""
    if len(p.args) != 2:
        raise wrap_args_error(verb, f"accepts 2 arg(s), received {len(p.args)}",
                              f"{verb} OLDINST NEWINST [flags]", f"{verb.capitalize()} an instance of Lima")
    old, new = p.args
    try:
        src = inspect(ctx, old)
    except NotExist:
        raise Fatal(f"instance {bq(old)} not found")
    if new == old:
        raise Fatal(f"new instance name {bq(new)} must be different from {bq(old)}")
    if src.status == "Running":
        raise Fatal(f"cannot {verb} a running instance")
    new_dir = ctx.inst_dir(new)
    with lima_lock(ctx.lima_home):
        if os.path.lexists(new_dir):
            raise Fatal(f"instance {bq(new)} already exists")
        check_socket_path(new, new_dir)  # pkg/instance/clone.go, for clone and rename alike
        if verb == "clone":
            subprocess.run(["cp", "-a", src.dir, new_dir], check=True)  # keeps the guest's owners
        else:
            os.rename(src.dir, new_dir)
        for entry in os.listdir(new_dir):
            path = os.path.join(new_dir, entry)
            if entry in SKIP_ON_CLONE and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif entry in SKIP_ON_CLONE or entry.endswith(TMP_SUFFIXES):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            elif entry in NULLIFY_ON_CLONE:
                with open(path, "wb"):
                    pass
        if verb == "clone":
            write_state(new_dir, new_state())
        with contextlib.suppress(OSError), open(guestfs(new_dir, "etc/hostname"), "w", encoding="utf-8") as f:
            f.write(hostname_of(new) + "\n")
    return new


def cmd_rename(ctx: Ctx, p: Parsed) -> int:
    """`limactl rename OLD NEW`: the folder moved whole (the protection is lost); edit flags refused by the double."""
    not_implemented_flags(ctx, p, RENAME_FLAGS)
    _copy_or_move(ctx, p, "rename")
    return 0


def _copied_delay() -> None:
    """FAKE_LIMACTL_CLONE_COPIED_DELAY: the pause a slow disk copy makes, here after the copy and before the edit
    flags, so that a test can interrupt a clone that exists with the source's lima.yaml (the marker line says
    when)."""
    delay = float(os.environ.get("FAKE_LIMACTL_CLONE_COPIED_DELAY") or 0)
    if delay <= 0:
        return
    marker = os.environ.get("FAKE_LIMACTL_LATENCY_MARKER")
    if marker:
        with open(marker, "a", encoding="utf-8") as f:
            f.write("clone-copied\n")
    time.sleep(delay)


def cmd_clone(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, CLONE_FLAGS)
    new = _copy_or_move(ctx, p, "clone")
    # From here on the clone exists: Lima applies the edit flags to it afterwards and leaves it
    # behind, with the source's lima.yaml, when a flag or the edited YAML is rejected.
    _copied_delay()
    inst = inspect(ctx, new)
    exprs = yq_expressions(ctx, p, new_instance=False, params=(inst.config or {}).get("param", {}))
    if exprs:
        with open(inst.yaml_path, "rb") as f:
            content = f.read()
        edited = apply(exprs, content, inst.yaml_path)
        validate_edit(ctx, edited, content, inst.yaml_path, check_shrink=True)
        write_lima_yaml(inst.yaml_path, edited)
        inst = inspect(ctx, new)
    if ctx.tty and "start" not in p.changed and sys.stdin.isatty():
        raise Fatal("fake limactl: `limactl clone` would ask whether to start the instance; pass --start or "
                    "--tty=false")
    if p.get("start"):
        do_start(ctx, inst)
    return 0
