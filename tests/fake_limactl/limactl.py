#!/usr/bin/env python3
"""A test double of Lima's ``limactl`` (v2.2.0) for agentbox's test-suite.

It keeps all state under ``$LIMA_HOME`` like the real tool, prints Lima's log lines and exit codes
(README.md in this folder lists the Lima facts it follows, with Lima's source paths), and really
runs what a VM runs: ``shell``
commands, the provisioning scripts and the readiness probes, inside bubblewrap (``bwrap``) with a
per-instance guest filesystem, as an unprivileged guest user with passwordless sudo (guest.py says
how). Without bwrap, shell commands run directly on the host (with a one-time warning) and
provisioning scripts are only recorded.

A start boots like a VM: Running at once, then the guest's boot scripts in the background
(cloud-init's caCerts on the first boot; Lima's `data`, `system` as root, `user` as the user, every
boot, each failure logged as "WARNING: Failed to execute ..." in the guest's
/var/log/cloud-init-output.log), /run/lima-boot-done last. `start` waits for it (up to --timeout),
then runs the probes: a failing probe is a degraded start (exit 1, instance left Running).
`system` scripts find stand-ins for apt-get, dpkg-query, curl and systemctl first on PATH
(guest_tools/tools.py): the guest has no network.

Instance layout (``$LIMA_HOME/NAME/``):
  lima.yaml, lima-version, protected     as real Lima (lima.yaml = the create input, verbatim)
  ssh.config                             written at every start (list reads the port from it)
  fake-state.json                        private state, see ``new_state()``
  boot-id                                this boot's /proc/sys/kernel/random/boot_id in the guest
  guestfs/{etc,usr-local,var,root,tmp,run,home}   the guest's own /etc (a copy of the host's),
                                         /usr/local, /var, /root, /tmp, /run (emptied at every
                                         start) and /home
  ha.stdout.log, ha.stderr.log           the host agent's events and log lines, recreated at every start;
                                         port forwarding writes to them (hostagent.py)
Every invocation appends {"argv", "cwd", "start", "duration", "exit", "cpu"} to $LIMA_HOME/_fake/calls.jsonl
("cpu": the call's user + system CPU seconds, its waited-for children's included), with
"proxy": true when agentbox's proxy process made it (its parent runs agentbox.credentials.broker.process or
agentbox.net.guard: a brokered proxy asks now and then whether its VM runs, at no moment a test chose; read_calls
leaves those out unless asked) (the background boot process, `limactl __boot`, the running guest's agent, `limactl __machine`, and `limactl __listeners NAME tcp:IP:PORT...`, which
stands for the guest agent reporting the guest's listening sockets, are the double's own and not logged).

Environment knobs (all optional):
  FAKE_LIMACTL_LATENCY="list=0.03,shell=0.15,*=0"  sleep per sub-command ("*" = any other one)
  FAKE_LIMACTL_LATENCY_MARKER=FILE     append the sub-command's name to FILE as its latency sleep begins
  FAKE_LIMACTL_FAIL_<SUBCMD>="msg"     make SUBCMD (START, CREATE, STOP, SHELL, COPY, DELETE, LIST,
                                       RESTART, CLONE, EDIT, ...) fatal with msg, after realistic
                                       progress lines (CLONE and EDIT up front: nothing changes)
  FAKE_LIMACTL_FAIL_<SUBCMD>_TIMES=N   ... only for the first N invocations (counted in $LIMA_HOME/_fake)
  FAKE_LIMACTL_FAIL_CREATE_STAGE=validate|write|prepare  default prepare: the Stopped instance is left
                                       behind, like a failed image download; write: the instance folder is left
                                       with an empty lima.yaml (a full disk: "has configuration errors"
                                       at start and shell)
  FAKE_LIMACTL_START_LEAVE_RUNNING=1   an injected start failure leaves the instance Running and
                                       booting (timeout-like); without it the instance keeps its
                                       previous status
  FAKE_LIMACTL_START_DEGRADED=1        start ends with DEGRADED + fatal, instance Running
  FAKE_LIMACTL_PROBE_FAIL="stderr"     every readiness probe (`probes:`) fails with this stderr: Lima's
                                       error line, DEGRADED and a fatal `degraded`, instance Running
  FAKE_LIMACTL_START_STEPS_DELAY=S     seconds between start progress lines
  FAKE_LIMACTL_CLONE_COPIED_DELAY=S    clone sleeps S seconds after copying the folder, before its edit flags
                                       (an interrupt then leaves the clone with the source's lima.yaml);
                                       "clone-copied" goes to FAKE_LIMACTL_LATENCY_MARKER as the sleep begins
  FAKE_LIMACTL_PROVISION_DELAY=S       the guest's boot scripts take S seconds longer (before `system`)
  FAKE_LIMACTL_PROVISION_HANG=1        ... never finish: /run/lima-boot-done is never written
  FAKE_LIMACTL_GUEST_OFFLINE=1         the stand-ins' downloads (apt-get update, curl) fail
  FAKE_LIMACTL_APT_LOCK_SECONDS=S[,D] another apt holds the apt-lists lock for S seconds after boot
                                       and the dpkg lock for D (default S) (unattended-upgrades on a
                                       first boot)
  FAKE_LIMACTL_LIST_MALFORMED=1        list --json prints a truncated JSON line first
  FAKE_LIMACTL_LIST_FAIL="msg"         list is fatal with msg
  FAKE_LIMACTL_SHELL_SSH_FAIL=1        shell/copy fail like an unreachable sshd (exit 255)
  FAKE_LIMACTL_NO_BWRAP=1              pretend bwrap is missing (run shell commands on the host)
  FAKE_LIMACTL_REFUSE_ROOT=1           refuse euid 0 like real limactl
  FAKE_LIMACTL_BOOT_CACHE=DIR          boots replay recorded results of their provisioning scripts when the
                                       guest, the scripts and the environment match a record in DIR, and
                                       record them when not (bootcache.py)
  FAKE_LIMACTL_SYSPATH=DIR[:DIR]       set by the shim: where PyYAML and jsonschema are (the double runs
                                       under python -S); taken out of the environment at start

This file is the entry point (global flags, dispatch, the call log). It is run by path, so its
folder is first on sys.path and the modules beside it are imported by their plain names:
  constants.py     Lima's version, limits and key orders      context.py    LIMA_HOME, names, state, knobs
  logrus.py        errors, Go quoting, log lines, stdout       pflag.py      flag and argument parsing
  goyaml.py        YAML as goccy/go-yaml decodes it            gotemplate.py the Go template subset
  limayaml.py      lima.yaml: merge, defaults, validation      instances.py  inspecting instances, list's objects
  cmd_list.py, cmd_create.py, cmd_start.py (and the boot), cmd_lifecycle.py (stop, restart, delete,
  protect, clone, rename), cmd_edit.py (edit), cmd_info.py (info, validate), cmd_shell.py (shell, copy)
                   the sub-commands
  editflags.py     Lima's edit flags as yq expressions, validation, ./lima.REJECTED.yaml
  yqsubset.py      the part of yq that --set may use (anything else fails loudly)
  guest.py         the guest machine: bubblewrap sandbox, identities, sudo, the boot's scripts
  machine.py       the running guest: one sandbox per boot that every guest process enters
  hostagent.py     tcp port forwarding of the guest's listeners (Lima's rules, events and warnings)
  bootcache.py     recorded provisioning results (the double's own speed-up for tests)
  ssh.py           the `ssh` that reaches a guest through ssh.config (`-N -L` port forwards only)
  guest_tools/     stand-ins run inside the guest (apt-get, curl, ..., sudo)
PyYAML and jsonschema are imported on first use: most calls (`list`, `shell`) never need them.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# constants comes first: it puts the folders of PyYAML and jsonschema on sys.path (python -S).
from constants import BOOT_SUBCOMMAND, LISTENERS_SUBCOMMAND, MACHINE_SUBCOMMAND, VERSION
from context import Ctx, injected_failure, resolve_lima_home, simulate_latency
from logrus import LEVELS, ChildExit, Fatal, Logger, bq, go_quote, out
from pflag import GLOBAL_FLAGS, ROOT_FLAGS, Flag, Parsed, parse_flags


@dataclass
class Command:
    """A sub-command; its module is imported only when it runs (a call pays for its own command only)."""

    module: str
    run: str
    flags: str | None
    usage: str
    interspersed: bool = True

    def load(self) -> tuple[Callable[[Ctx, Parsed], int], dict[str, Flag]]:
        module = importlib.import_module(self.module)
        return getattr(module, self.run), (getattr(module, self.flags) if self.flags else {})


COMMANDS: dict[str, Command] = {
    "list": Command("cmd_list", "cmd_list", "LIST_FLAGS", "list [flags] [INSTANCE]..."),
    "create": Command("cmd_create", "cmd_create", "CREATE_FLAGS", "create FILE.yaml|URL [flags]"),
    "start": Command("cmd_start", "cmd_start", "START_FLAGS", "start NAME|FILE.yaml|URL [flags]"),
    "stop": Command("cmd_lifecycle", "cmd_stop", "STOP_FLAGS", "stop INSTANCE [INSTANCE, ...] [flags]"),
    "restart": Command("cmd_lifecycle", "cmd_restart", "RESTART_FLAGS", "restart INSTANCE [flags]"),
    "delete": Command("cmd_lifecycle", "cmd_delete", "DELETE_FLAGS", "delete INSTANCE [INSTANCE, ...] [flags]"),
    "protect": Command("cmd_lifecycle", "cmd_protect_on", None, "protect INSTANCE [INSTANCE, ...]"),
    "unprotect": Command("cmd_lifecycle", "cmd_protect_off", None, "unprotect INSTANCE [INSTANCE, ...]"),
    "clone": Command("cmd_lifecycle", "cmd_clone", "CLONE_FLAGS", "clone OLDINST NEWINST [flags]"),
    "rename": Command("cmd_lifecycle", "cmd_rename", "RENAME_FLAGS", "rename OLDINST NEWINST [flags]"),
    "edit": Command("cmd_edit", "cmd_edit", "EDIT_FLAGS", "edit INSTANCE|FILE.yaml [flags]"),
    "info": Command("cmd_info", "cmd_info", "INFO_FLAGS", "info [flags]"),
    "validate": Command("cmd_info", "cmd_validate", "VALIDATE_FLAGS",
                        "validate FILE.yaml [FILE.yaml, ...] [flags]"),
    "shell": Command("cmd_shell", "cmd_shell", "SHELL_FLAGS", "shell [flags] INSTANCE [COMMAND...]",
                     interspersed=False),
    "copy": Command("cmd_shell", "cmd_copy", "COPY_FLAGS", "copy SOURCE ... TARGET [flags]"),
}
# Sub-commands whose FAKE_LIMACTL_FAIL_<SUBCMD> fails them up front (the others fail mid-way).
SIMPLE_FAILURES = ("restart", "protect", "unprotect", "clone", "rename", "edit", "info", "validate")
ALIASES = {"ls": "list", "rm": "delete", "remove": "delete", "cp": "copy"}
UNIMPLEMENTED = ("factory-reset", "prune", "disk", "snapshot", "template", "show-ssh",
                 "tunnel", "sudoers", "start-at-login", "autostart", "network", "watch", "guest-install",
                 "hostagent", "debug", "usernet", "generate-doc", "gen-schema", "screenshot", "completion")


def usage_text() -> str:
    names = "\n".join(f"  {n}" for n in sorted(COMMANDS))
    return (f"Lima: Linux virtual machines (fake limactl test double)\n\nUsage:\n  limactl [command]\n\n"
            f"Available Commands:\n{names}\n\nFlags:\n      --debug               debug mode\n"
            "  -h, --help                help for limactl\n      --log-format string   text|json\n"
            "      --log-level string    trace|debug|info|warn|error\n      --tty                 TUI\n"
            "  -v, --version             version for limactl\n  -y, --yes                 Alias of --tty=false\n")


def apply_global_flags(ctx: Ctx, p: Parsed) -> None:
    if p.get("debug"):
        ctx.log.level = LEVELS["debug"]
    level = p.get("log-level") or ""
    if level:
        norm = {"warn": "warning"}.get(level.lower(), level.lower())
        if norm not in LEVELS:
            raise Fatal(f"not a valid logrus Level: {go_quote(level)}")
        ctx.log.level = LEVELS[norm]
    fmt = p.get("log-format")
    if fmt not in ("text", "json"):
        raise Fatal(f"unsupported log-format: {bq(str(fmt))}")
    ctx.log.fmt = fmt
    if "yes" in p.changed and "tty" in p.changed:
        raise Fatal("cannot use both --tty and --yes flags at the same time")
    ctx.tty_changed = "tty" in p.changed
    ctx.tty = bool(p.get("tty")) if "tty" in p.changed else sys.stdout.isatty()
    if "yes" in p.changed and p.get("yes"):
        ctx.tty = False


def split_root_args(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Root flags before the sub-command, the sub-command, and the rest."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--" or not a.startswith("-") or a == "-":
            break
        name = a[2:].partition("=")[0] if a.startswith("--") else ""
        if name in ("log-level", "log-format") and "=" not in a:
            i += 1
        i += 1
    if i < len(argv) and argv[i] != "--":
        return argv[:i], argv[i], argv[i + 1:]
    return argv[:i], None, argv[i + 1:] if i < len(argv) else []


def dispatch(ctx: Ctx, argv: list[str]) -> int:
    root_args, sub, rest = split_root_args(argv)
    if os.environ.get("FAKE_LIMACTL_REFUSE_ROOT") == "1" and os.geteuid() == 0:
        sys.stderr.write("limactl: must not run as the root user\n")
        return 1
    if sub is None:
        p = parse_flags(root_args, ROOT_FLAGS)
        if p.get("version"):
            out(f"limactl version {VERSION.lstrip('v')}\n")
            return 0
        apply_global_flags(ctx, p)
        out(usage_text())
        return 0
    if sub == BOOT_SUBCOMMAND:
        from cmd_start import boot_process
        return boot_process(ctx, rest)
    if sub == LISTENERS_SUBCOMMAND:
        from hostagent import listeners_process
        return listeners_process(ctx, rest)
    if sub == MACHINE_SUBCOMMAND:
        from machine import machine_process
        return machine_process(ctx, rest)
    name = ALIASES.get(sub, sub)
    if name == "help":
        out(usage_text())
        return 0
    if name in UNIMPLEMENTED:
        parse_flags(root_args, GLOBAL_FLAGS)
        raise Fatal(f"fake limactl: `limactl {name}` is not implemented by the test double")
    command = COMMANDS.get(name)
    if command is None:
        parse_flags(root_args, GLOBAL_FLAGS)
        raise Fatal(f"unknown command {go_quote(sub)} for \"limactl\"")
    ctx.cmd = name
    run, flags = command.load()
    spec = dict(GLOBAL_FLAGS, **flags)
    p = parse_flags(root_args, GLOBAL_FLAGS)
    sub_p = parse_flags(rest, spec, interspersed=command.interspersed)
    merged = Parsed({**sub_p.values, **{k: p.values[k] for k in p.changed}},
                    sub_p.changed | p.changed, sub_p.args)
    if merged.get("help"):
        out(f"Usage:\n  limactl {command.usage}\n")
        return 0
    apply_global_flags(ctx, merged)
    simulate_latency(name)
    if name in SIMPLE_FAILURES:
        fail = injected_failure(ctx, name)
        if fail:
            raise Fatal(fail)
    return run(ctx, merged)


PROXY_PROGRAMS = (b"agentbox.credentials.broker.process", b"agentbox.net.guard")


def by_agentbox_proxy() -> bool:
    """Whether the caller is agentbox's proxy process (its command line runs one of PROXY_PROGRAMS)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return False
    return any(word in PROXY_PROGRAMS for word in words)


def append_call(lima_home: str, entry: dict[str, Any]) -> None:
    try:
        log_dir = os.path.join(lima_home, "_fake")
        os.makedirs(log_dir, exist_ok=True)
        fd = os.open(os.path.join(log_dir, "calls.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, (json.dumps(entry) + "\n").encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except OSError:
        pass


def cpu_seconds() -> float:
    """User and system CPU of this call so far: its own (the shim's bash included: it exec'd this interpreter)
    and its waited-for children's (a `shell`'s guest command). Benchmarks subtract it from the caller's tree.
    getrusage, not os.times: times() counts in clock ticks (10 ms), which lost 10-20 ms a call."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str]) -> int:
    # The shim stamps the moment it started, so the reported duration includes this interpreter's
    # own start-up: benchmarks subtract it from agentbox's wall time.
    try:
        started = float(os.environ.pop("FAKE_LIMACTL_T0", ""))
    except ValueError:
        started = time.time()
    log = Logger()
    lima_home: str | None = None
    code = 1
    try:
        try:
            lima_home = resolve_lima_home()
            code = dispatch(Ctx(lima_home=lima_home, log=log), argv)
        except Fatal as e:
            log.log("fatal", e.msg, **e.fields)
            code = 1
        except ChildExit as e:
            code = e.code
        except KeyboardInterrupt:
            code = 130
        sys.stdout.flush()
    except BrokenPipeError:
        # `limactl list | head -1`: Go dies of SIGPIPE (141); keep Python quiet at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    finally:
        cwd = None
        with contextlib.suppress(OSError):
            cwd = os.getcwd()
        # Never create a real ~/.lima just to log a call.
        # the double's own, not limactl's
        own = argv[:1] in ([BOOT_SUBCOMMAND], [LISTENERS_SUBCOMMAND], [MACHINE_SUBCOMMAND])
        if lima_home and (os.environ.get("LIMA_HOME") or os.path.isdir(lima_home)) and not own:
            entry = {"argv": argv, "cwd": cwd, "start": started, "duration": time.time() - started, "exit": code,
                     "cpu": cpu_seconds()}
            if by_agentbox_proxy():
                entry["proxy"] = True
            append_call(lima_home, entry)
    return code


if __name__ == "__main__":
    exit_code = main(sys.argv[1:])
    # Skip the interpreter's teardown (tens of ms for these modules): real limactl exits at once,
    # and benchmarks count everything after the logged duration as the caller's own time.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code if isinstance(exit_code, int) else 1)
