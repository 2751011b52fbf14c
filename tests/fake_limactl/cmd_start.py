"""`limactl start` (pkg/instance/start.go) and the guest's boot: the instance is Running at once,
the boot scripts run on in a background `limactl __boot` process, `start` waits for
/run/lima-boot-done, then runs the readiness probes (a failing one is a degraded start)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import fakeqemu
import guest
import hostagent
import machine
from constants import BOOT_SUBCOMMAND, PROXY_VARS, own_process
from context import Ctx, host_arch, injected_failure, lima_lock, read_state, validate_inst_name, write_state
from guest import hostname_of
from instances import Instance, format_data, inspect
from logrus import Fatal, NotExist, bq, go_quote
from pflag import Flag, Parsed, create_flags, not_implemented_flags, parse_duration, wrap_args_error

START_FLAGS = dict(create_flags(), name=Flag("str", default=""), timeout=Flag("str", default="10m0s"),
                   progress=Flag("bool"), foreground=Flag("bool"), **{"list-templates": Flag("bool"),
                                                                      "list-drivers": Flag("bool")})


def cmd_start(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, START_FLAGS)
    timeout = parse_duration(p.get("timeout"), "--timeout")
    if len(p.args) > 1:
        raise wrap_args_error("start", f"accepts at most 1 arg(s), received {len(p.args)}",
                              "start NAME|FILE.yaml|URL [flags]", "Start an instance of Lima")
    arg = p.args[0] if p.args else ""
    name = p.get("name") or ""
    if name:
        err = validate_inst_name(name)
        if err:
            raise Fatal(err)
    if arg and validate_inst_name(arg) is not None:
        raise Fatal(f"fake limactl: `limactl start {arg}` (creating from a template) is not supported by the "
                    f"test double; use `limactl create` and then `limactl start NAME`")
    if arg and name and name != arg:
        raise Fatal(f"instance name {bq(arg)} and CLI flag --name={bq(name)} cannot be specified together")
    name = arg or name or "default"
    try:
        inst = inspect(ctx, name)
    except NotExist:
        if name != "default":
            ctx.log.info(f"Creating an instance {bq(name)} from template:default (Not from template:{name})")
            ctx.log.warn(f"This form is deprecated. Use `limactl create --name={name} template:default` instead")
        raise Fatal("fake limactl: start of a non-existent instance would create a default Ubuntu VM")
    require_config(ctx, inst, quoting=go_quote)
    ctx.log.info(f"Using the existing instance {bq(name)}")
    inst = _apply_edit_flags(ctx, p, inst)
    if inst.errors:
        raise Fatal(f"errors inspecting instance: [{' '.join(inst.errors)}]")
    if inst.status == "Running":
        ctx.log.info(f"The instance {bq(name)} is already running. Run `{shell_cmd(name)}` to open the shell.")
        return 0
    if inst.status != "Stopped":
        ctx.log.warn(f"expected status `Stopped`, got {bq(inst.status)}")
    do_start(ctx, inst, progress=bool(p.get("progress")), timeout=timeout)
    return 0


def _apply_edit_flags(ctx: Ctx, p: Parsed, inst: Instance) -> Instance:
    """Edit flags on an existing instance change its lima.yaml for good (applyYQExpressionToExistingInstance
    in cmd/limactl/start.go): validated, but without the disk-shrinking check of edit and clone."""
    from editflags import apply, validate_edit, write_lima_yaml, yq_expressions
    exprs = yq_expressions(ctx, p, new_instance=False, params=(inst.config or {}).get("param", {}))
    if not exprs:
        return inst
    yq = " | ".join(exprs)
    with open(inst.yaml_path, "rb") as f:
        content = f.read()
    try:
        edited = apply(exprs, content, inst.yaml_path)
        validate_edit(ctx, edited, content, inst.yaml_path, check_shrink=False, warn=False)
    except Fatal as e:
        raise Fatal(f"failed to apply yq expression {bq(yq)} to instance {bq(inst.name)}: {e.msg}")
    write_lima_yaml(inst.yaml_path, edited)
    return inspect(ctx, inst.name)


def require_config(ctx: Ctx, inst: Instance, quoting: Callable[[str], str] = bq) -> None:
    if inst.config is None:
        err = "\n".join(inst.errors)
        ctx.log.error(f"Instance {quoting(inst.name)} has configuration errors", error=err)
        raise Fatal(f"instance {quoting(inst.name)} has configuration errors: {err}" if quoting is go_quote
                    else f"instance {quoting(inst.name)} has no configuration")


def shell_cmd(name: str) -> str:
    return "lima" if name == "default" else f"limactl shell {name}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _progress(ctx: Ctx, msg: str, *, hostagent: bool = True, level: str = "info") -> None:
    delay = float(os.environ.get("FAKE_LIMACTL_START_STEPS_DELAY") or 0)
    if delay > 0:
        time.sleep(delay)
    ctx.log.log(level, ("[hostagent] " if hostagent else "") + msg)


def _ssh_config_text(ctx: Ctx, inst: Instance, port: int) -> str:
    user = inst.config["user"]["name"]
    return (
        "# This SSH config file can be passed to 'ssh -F'.\n"
        "# This file is created by Lima, but not used by Lima itself currently.\n"
        "# Modifications to this file will be lost on restarting the Lima instance.\n"
        f"Host {hostname_of(inst.name)}\n"
        f'  IdentityFile "{ctx.identity_file}"\n'
        "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  NoHostAuthenticationForLocalhost yes\n"
        "  PreferredAuthentications publickey\n  Compression no\n  BatchMode yes\n  IdentitiesOnly yes\n"
        "  GSSAPIAuthentication no\n"
        f"  User {user}\n  ControlMaster auto\n"
        f'  ControlPath "{os.path.join(inst.dir, "ssh.sock")}"\n'
        f"  ControlPersist yes\n  Hostname 127.0.0.1\n  Port {port}\n")


def _boot(ctx: Ctx, inst: Instance) -> None:
    """The instant part of a boot: state -> Running, a fresh /run and boot id, ssh.config, mount dirs."""
    cfg = inst.config
    state = read_state(inst.dir)
    kill_boot(state)
    machine.stop(state)
    fakeqemu.end(inst.dir)
    port = cfg["ssh"].get("localPort") or free_port()
    state.update(status="Running", sshLocalPort=port, bootCount=int(state.get("bootCount", 0)) + 1,
                 forwards=[], guestListeners=[],
                 iid=f"iid-{int(time.time())}-{os.getpid()}", errors=[], bootPID=0,
                 hostAgentPID=os.getpid() + 1, driverPID=os.getpid() + 2, lastStartedAt=time.time(),
                 proxyEnv={k: os.environ[k] for k in PROXY_VARS if k in os.environ})
    guest.ensure_guestfs(inst)
    ids = guest.ids_of(cfg)
    run_dir = guest.guestfs(inst.dir, "run")
    for entry in os.listdir(run_dir):
        path = os.path.join(run_dir, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    os.makedirs(os.path.join(run_dir, "user"), exist_ok=True)
    guest.chown_guest(ids, os.path.join(run_dir, "user"), 0)
    user_run = os.path.join(run_dir, "user", str(cfg["user"]["uid"]))
    os.makedirs(user_run, mode=0o700, exist_ok=True)
    guest.chown_guest(ids, user_run, ids.uid)
    with open(os.path.join(run_dir, "lima-ssh-ready"), "w", encoding="utf-8") as f:
        f.write(state["iid"] + "\n")
    guest.chown_guest(ids, os.path.join(run_dir, "lima-ssh-ready"), 0)
    with open(os.path.join(inst.dir, guest.BOOT_ID_FILE), "w", encoding="utf-8") as f:
        f.write(str(uuid.uuid4()) + "\n")
    for m in cfg.get("mounts", []):
        with contextlib.suppress(OSError):
            os.makedirs(m["location"], exist_ok=True)
    with open(inst.ssh_config, "w", encoding="utf-8") as f:
        f.write(_ssh_config_text(ctx, inst, port))
    os.chmod(inst.ssh_config, 0o600)
    hostagent.reset_logs(inst, port)
    write_state(inst.dir, state)
    inst.state, inst.status = state, "Running"


def kill_boot(state: dict[str, Any]) -> None:
    """The guest's boot scripts of an earlier boot stop with the VM (only if that process is still
    this boot's `limactl __boot`: a finished one's pid may belong to someone else by now)."""
    pid = int(state.get("bootPID") or 0)
    if pid <= 0:
        return
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return
    if BOOT_SUBCOMMAND.encode() in argv and str(state.get("iid", "")).encode() in argv:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def do_start(ctx: Ctx, inst: Instance, *, launching_shell: bool = False, progress: bool = False,
             timeout: float = 600.0) -> None:
    cfg = inst.config
    assert cfg is not None
    ctx.log.info(f"Starting the instance {bq(inst.name)} with internal VM driver {bq(cfg['vmType'])}")
    previous = read_state(inst.dir)
    with lima_lock(ctx.lima_home):
        _boot(ctx, inst)
    port = inst.state["sshLocalPort"]
    _progress(ctx, f"hostagent socket created at {os.path.join(inst.dir, 'ha.sock')}")
    if cfg["vmType"] == "qemu":
        failed = fakeqemu.run(inst.dir, cfg.get("arch") or host_arch(), port)
        if failed:
            _abort_start(ctx, inst, previous)
            raise Fatal(f"fake limactl: {failed}")
    if cfg["vmType"] == "qemu" and os.environ.get("FAKE_LIMACTL_NO_KVM"):
        for _ in range(2):  # Lima 2.2 logs it twice (README, "limactl start")
            _progress(ctx, "/dev/kvm is not available. Disabling KVM. Expect very poor performance.", level="warning")
    driver = {"qemu": "QEMU", "vz": "VZ"}.get(cfg["vmType"], cfg["vmType"])
    serial = os.path.join(inst.dir, "serial*.log")
    _progress(ctx, f"Starting {driver} (hint: to watch the boot progress, see {bq(serial)})")
    _progress(ctx, f"SSH Local Port: {port}", hostagent=False)
    essential = ["ssh", "user session is ready for ssh", "Explicitly start ssh ControlMaster"]
    if cfg.get("plain"):
        essential = ["ssh", "Explicitly start ssh ControlMaster"]
    fail = injected_failure(ctx, "start")
    for i, desc in enumerate(essential, 1):
        _progress(ctx, f"Waiting for the essential requirement {i} of {len(essential)}: {bq(desc)}")
        if fail:
            if os.environ.get("FAKE_LIMACTL_START_LEAVE_RUNNING"):
                machine.ensure(inst)
                _start_boot(ctx, inst)  # like a start that timed out: the guest keeps booting
            else:
                _abort_start(ctx, inst, previous)
            raise Fatal(fail)
        _progress(ctx, f"The essential requirement {i} of {len(essential)} is satisfied")
    machine.ensure(inst)
    _start_boot(ctx, inst)
    if progress:
        ctx.log.info("Cloud-init provisioning started...")
    finished = _wait_for_boot(inst, time.monotonic() + (timeout or 600.0))
    if progress:
        _show_boot_log(ctx, inst)
        ctx.log.info("Cloud-init progress monitoring done.")
    optional = []
    if (cfg["containerd"]["system"] or cfg["containerd"]["user"]) and not cfg.get("plain"):
        optional += [("systemd must be available", None), ("containerd binaries to be installed", None)]
    optional += [(pr["description"], pr) for pr in cfg.get("probes", [])]
    probe_stderr = os.environ.get("FAKE_LIMACTL_PROBE_FAIL")
    errors: list[str] = []
    for i, (desc, probe) in enumerate(optional, 1):
        _progress(ctx, f"Waiting for the optional requirement {i} of {len(optional)}: {bq(desc)}")
        failure = _run_probe(inst, probe) if probe is not None and finished else None
        if probe is not None and probe_stderr is not None:
            failure = f"stdout=\"\", stderr={go_quote(probe_stderr)}: exit status 1"
        if failure is None:
            _progress(ctx, f"The optional requirement {i} of {len(optional)} is satisfied")
            continue
        errors.append(f"failed to satisfy the optional requirement {i} of {len(optional)} {go_quote(desc)}: "
                      f"{probe.get('hint', '')}: {failure}")
    _progress(ctx, "Waiting for the final requirement 1 of 1: `boot scripts must have finished`")
    if not finished:
        raise Fatal("did not receive an event with the `running` status")
    _progress(ctx, "The final requirement 1 of 1 is satisfied")
    if errors:  # pkg/instance/start.go watchHostAgentEvents: the errors, then DEGRADED
        ctx.log.error("[" + " ".join(errors) + "]")
    if errors or os.environ.get("FAKE_LIMACTL_START_DEGRADED"):
        ctx.log.warn("DEGRADED. The VM seems running, but file sharing and port forwarding may not work. "
                     f"(hint: see {bq(os.path.join(inst.dir, 'ha.stderr.log'))})")
        raise Fatal(f"degraded, status={{Running:true Degraded:true Exiting:false Errors:[{' '.join(errors)}] "
                    f"SSHLocalPort:{port}}}")
    if not launching_shell:
        if cfg.get("plain"):
            ctx.log.info(f"READY. Run `ssh -F {bq(inst.ssh_config)} {hostname_of(inst.name)}` to open the shell.")
        else:
            ctx.log.info(f"READY. Run `{shell_cmd(inst.name)}` to open the shell.")
    if cfg.get("message"):
        ctx.log.info(f"Message from the instance {bq(inst.name)}:")
        message = format_data(ctx, inst)["Message"]
        sys.stderr.write("".join(line + "\n" for line in message.splitlines()))
        sys.stderr.flush()


def _abort_start(ctx: Ctx, inst: Instance, previous: dict[str, Any]) -> None:
    with lima_lock(ctx.lima_home):
        state = read_state(inst.dir)
        state.update(status=previous.get("status", "Stopped"), errors=previous.get("errors", []))
        write_state(inst.dir, state)


def _start_boot(ctx: Ctx, inst: Instance) -> None:
    """The guest's boot scripts run on in the background, like cloud-init in a VM: `start` waits for
    them, and a start that is interrupted or times out leaves them running."""
    argv, env = own_process(BOOT_SUBCOMMAND, inst.name, inst.state["iid"])
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    with lima_lock(ctx.lima_home):
        state = read_state(inst.dir)
        if state.get("iid") == inst.state["iid"]:
            state["bootPID"] = child.pid
            write_state(inst.dir, state)
            inst.state = state


def _boot_done(inst: Instance) -> bool:
    try:
        with open(os.path.join(guest.guestfs(inst.dir, "run"), "lima-boot-done"), encoding="utf-8") as f:
            return f.read().strip() == inst.state["iid"]
    except OSError:
        return False


def _wait_for_boot(inst: Instance, deadline: float) -> bool:
    """True once /run/lima-boot-done holds this boot's id. The double gives up early when the boot
    script died without writing it (real Lima would wait for --timeout)."""
    pid = int(inst.state.get("bootPID") or 0)
    while not _boot_done(inst):
        if time.monotonic() >= deadline:
            return False
        if pid > 0:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    pid = 0
                    continue  # one more look: it may have written boot-done just before leaving
        if pid == 0:
            return _boot_done(inst)
        time.sleep(0.02)
    return True


def _show_boot_log(ctx: Ctx, inst: Instance) -> None:
    with contextlib.suppress(OSError), open(guest.guestfs(inst.dir, guest.CLOUD_INIT_LOG), encoding="utf-8",
                                            errors="replace") as f:
        for line in f.read().splitlines()[-200:]:
            ctx.log.info(f"[cloud-init] {line}")


def _run_probe(inst: Instance, probe: dict[str, Any]) -> str | None:
    """None when the probe passes, else the error as Lima's host agent words it."""
    if guest.bwrap_path() is None:
        return None  # nothing can run in the guest without bwrap
    code, stdout, stderr = guest.run_probe(inst, probe)
    if code == 0:
        return None
    return f"stdout={go_quote(stdout)}, stderr={go_quote(stderr)}: exit status {code}"


def boot_process(ctx: Ctx, args: list[str]) -> int:
    """`limactl __boot NAME IID` (the double's own): the guest's boot scripts, detached from `start`."""
    name, iid = args
    inst = inspect(ctx, name)
    if inst.state.get("iid") != iid or inst.config is None:
        return 0
    knobs: dict[str, Any] = {}
    if os.environ.get("FAKE_LIMACTL_GUEST_OFFLINE"):
        knobs["offline"] = True
    lists, _, dpkg = (os.environ.get("FAKE_LIMACTL_APT_LOCK_SECONDS") or "0").partition(",")
    knobs["aptListsLockedUntil"] = time.time() + float(lists or 0)
    knobs["dpkgLockedUntil"] = time.time() + float(dpkg or lists or 0)
    knobs["provisionDelay"] = os.environ.get("FAKE_LIMACTL_PROVISION_DELAY", "")
    knobs["provisionHang"] = bool(os.environ.get("FAKE_LIMACTL_PROVISION_HANG"))
    cfg = inst.config
    guest.write_etc_environment(inst, {k: v for k, v in guest.guest_user_env(inst).items()
                                       if k in cfg.get("env", {}) or k in (inst.state.get("proxyEnv") or {})})
    results: dict[str, list[Any]] = {"scripts": [], "data": []}
    if guest.bwrap_path() is None:
        return _boot_without_sandbox(ctx, inst, iid, results)
    recorded = []

    def record() -> None:
        if not recorded:
            recorded.append(True)
            _record_boot(ctx, inst, iid, results)

    try:
        guest.run_boot(inst, iid, knobs, results, before_done=record)
    except guest.BootAborted:
        return 1
    finally:
        record()
    return 0


def _boot_without_sandbox(ctx: Ctx, inst: Instance, iid: str, results: dict[str, list[Any]]) -> int:
    """Without bwrap nothing may run as guest root: data files are written, scripts only recorded."""
    log = guest.BootLog(inst)
    try:
        for i, p in sorted(enumerate(inst.config.get("provision", [])), key=lambda item: item[1]["mode"] != "data"):
            if p["mode"] == "data":
                guest.write_data_file(inst, p)
                results["data"].append(p["path"])
            else:
                log.lima(f"WARNING: fake limactl: bwrap is missing, so provision mode `{p['mode']}` was not run")
                results["scripts"].append({"index": i, "mode": p["mode"], "script": p.get("script", ""),
                                           "exit": None})
    except guest.BootAborted as e:
        log.lima(str(e))
        return 1
    finally:
        log.close()
        _record_boot(ctx, inst, iid, results)
    with open(os.path.join(guest.guestfs(inst.dir, "run"), "lima-boot-done"), "w", encoding="utf-8") as f:
        f.write(iid + "\n")
    return 0


def _record_boot(ctx: Ctx, inst: Instance, iid: str, results: dict[str, list[Any]]) -> None:
    """What the boot did, in the double's state (for tests): each script's exit code, data files."""
    with lima_lock(ctx.lima_home):
        state = read_state(inst.dir)
        if state.get("iid") != iid:
            return
        log = list(state.get("provisionLog") or [])
        log += [dict(entry, boot=state["bootCount"]) for entry in results["scripts"]]
        state.update(provisionLog=log, dataWritten=results["data"], caCertsApplied=True, bootPID=0)
        write_state(inst.dir, state)
