"""`limactl shell` and `limactl copy`: what goes over ssh into the guest. `shell` builds the exact
script Lima passes to ssh (cmd/limactl/shell.go) and runs it as the guest user (guest.py);
`copy` behaves like scp."""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import guest
import machine
from cmd_start import do_start
from constants import SHELL_ENV_BLOCK
from context import Ctx, injected_failure
from guest import GUEST_PATH
from instances import Instance, inspect
from limayaml import expand_tilde
from logrus import ChildExit, Fatal, NotExist, bq
from pflag import Flag, Parsed, not_implemented_flags, wrap_args_error

SSH_NO_STATUS = 255  # ssh's status when the remote command gave none: a signal ended it, or the connection went

SHELL_FLAGS = {"shell": Flag("str", default=""), "workdir": Flag("str", default=""), "reconnect": Flag("bool"),
               "preserve-env": Flag("bool"), "start": Flag("bool"), "instance": Flag("str", default=""),
               "sync": Flag("str", default="", unsupported=True)}


def cmd_shell(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, SHELL_FLAGS)
    args = list(p.args)
    if p.get("instance"):
        args = [p.get("instance")] + args
    else:
        if not args:
            raise Fatal("requires instance name as first argument")
        if len(args) >= 2 and args[1] == "--":
            del args[1]
    name, command = args[0], args[1:]
    if command and command[0] in ("create", "start", "delete", "shell"):
        ctx.log.warn(f"Perhaps you meant `limactl {' '.join(command)}`?")
    start = bool(p.get("start"))
    if ctx.tty and "start" not in p.changed:  # shell.go: askWhetherToStart, only when stdin is a terminal too
        start = _ask_whether_to_start(ctx, name)
    inst = _running_instance(ctx, name, start=start)
    fail = injected_failure(ctx, "shell")
    if fail:
        raise Fatal(fail)
    if inst.status != "Running" or os.environ.get("FAKE_LIMACTL_SHELL_SSH_FAIL"):
        sys.stderr.write(f"ssh: connect to host 127.0.0.1 port {inst.ssh_port()}: Connection refused\r\n")
        raise ChildExit(255)
    script = build_shell_script(inst, command, workdir=p.get("workdir"), shell=p.get("shell"),
                                preserve_env=bool(p.get("preserve-env")))
    return run_in_guest(ctx, inst, script)


def _running_instance(ctx: Ctx, name: str, *, start: bool) -> Instance:
    try:
        inst = inspect(ctx, name)
    except NotExist:
        raise Fatal(f"instance {bq(name)} does not exist, run `limactl create {name}` to create a new instance")
    if inst.errors:
        ctx.log.error(f"Instance {bq(name)} has configuration errors", error="\n".join(inst.errors))
    if inst.config is None:
        raise Fatal(f"instance {bq(name)} has no configuration")
    if inst.status == "Stopped":
        if not start:
            raise Fatal(f"instance {bq(name)} is stopped, run `limactl start {name}` to start the instance")
        do_start(ctx, inst, launching_shell=True)
        inst = inspect(ctx, name)
    return inst


def _ask_whether_to_start(ctx: Ctx, name: str) -> bool:
    """uiutil.Confirm("Do you want to start the instance now? ", true) for a stopped instance: a caller that
    leaves --tty at its default on a terminal gets this question instead of the `is stopped` error."""
    try:
        if inspect(ctx, name).status != "Stopped" or not sys.stdin.isatty():
            return False
    except NotExist:
        return False
    sys.stdout.write("? Do you want to start the instance now? (Y/n) ")
    sys.stdout.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("", "y", "yes")


_SHELL_UNSAFE = re.compile(r"[^\w@%+=:,./-]", re.ASCII)


def shell_quote(s: str) -> str:
    """al.essio.dev/pkg/shellescape.Quote."""
    if not s:
        return "''"
    if not _SHELL_UNSAFE.search(s):
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _getwd() -> str:
    """Go's os.Getwd: $PWD when it names the current directory."""
    pwd_env = os.environ.get("PWD", "")
    try:
        if pwd_env.startswith("/") and os.path.samestat(os.stat(pwd_env), os.stat(".")):
            return pwd_env
    except OSError:
        pass
    return os.getcwd()


def mounts_contain(mounts: list[dict[str, Any]], path: str) -> bool:
    resolved = os.path.realpath(path)
    for m in mounts:
        loc = os.path.realpath(expand_tilde(m["location"]))
        if resolved == loc or loc == "/" or resolved.startswith(loc + "/"):
            return True
    return False


def filtered_host_env() -> list[str]:
    def patterns(var: str) -> list[str]:
        items = [s.strip() for s in os.environ.get(var, "").lstrip("+").split(",") if s.strip()]
        for pat in items:
            if re.search(r"[^a-zA-Z0-9_*]", pat):
                raise Fatal(f"Invalid {var} pattern: pattern {bq(pat)} contains invalid character")
        return items

    block = SHELL_ENV_BLOCK
    if os.environ.get("LIMA_SHELLENV_BLOCK"):
        extra = patterns("LIMA_SHELLENV_BLOCK")
        block = SHELL_ENV_BLOCK + extra if os.environ["LIMA_SHELLENV_BLOCK"].startswith("+") else extra
    allow = patterns("LIMA_SHELLENV_ALLOW")

    def matches(name: str, pats: list[str]) -> bool:
        return any(name == pat or re.fullmatch(pat.replace("*", ".*"), name) for pat in pats)

    return [f"{k}={v}" for k, v in os.environ.items()
            if (allow and matches(k, allow)) or not matches(k, block)]


def build_shell_script(inst: Instance, command: list[str], *, workdir: str, shell: str, preserve_env: bool) -> str:
    """The exact script that `limactl shell` passes to ssh (cmd/limactl/shell.go)."""
    cfg = inst.config
    mounts = cfg.get("mounts", [])
    cwd, home = _getwd(), os.environ.get("HOME", "")
    if workdir:
        cd = f"cd {shell_quote(workdir)} || exit 1"
    elif mounts_contain(mounts, cwd):
        cd = f"cd {shell_quote(cwd)}" + (f" || cd {shell_quote(home)}" if home else "")
    elif home and mounts_contain(mounts, home):
        cd = f"cd {shell_quote(home)}"
    else:
        cd = "false"
    login_shell = shell_quote(shell) if shell else shell_quote(cfg["user"]["shell"])
    env_prefix = ""
    if preserve_env:
        kept = filtered_host_env()
        if kept:
            env_prefix = "env " + "".join(shell_quote(kv) + " " for kv in kept)
    script = f"{cd} ; exec {env_prefix}{login_shell} -l"
    if command:
        quoted, parsing_env = [], True
        for arg in command:
            if parsing_env and "=" in arg:
                key, _, value = arg.partition("=")
                quoted.append(f"{key}={shell_quote(value)}")
            else:
                parsing_env = False
                quoted.append(shell_quote(arg))
        script += " -c " + shell_quote(" ".join(quoted))
    return script


def run_in_guest(ctx: Ctx, inst: Instance, script: str) -> int:
    """Run `SHELL -c SCRIPT` as sshd would, as the guest user, with stdio passed straight through."""
    env = guest.guest_user_env(inst)
    user_shell = inst.config["user"]["shell"]
    # sshd runs the login shell with argv[0] = its basename ("bash: line 1: cd: ..." messages);
    # bwrap has no --argv0, so pass the basename when PATH finds that very shell.
    base = os.path.basename(user_shell)
    found = shutil.which(base, path=env["PATH"])
    argv0 = base if found and os.path.realpath(found) == os.path.realpath(user_shell) else user_shell
    guest.ensure_guestfs(inst)
    argv = [argv0, "-c", script]
    if guest.bwrap_path():
        machine.ensure(inst)  # an instance marked Running by hand gets its guest now
        if sys.stdout.isatty() and sys.stdin.isatty():
            # ssh -t: the command gets a terminal of the guest's own (its stdout and stderr merged on it, the
            # caller's terminal in raw mode so that Ctrl-C reaches the guest's foreground job). util-linux's
            # script(1) relays it as sshd would.
            argv = ["script", "-qfec", shlex.join(argv), "/dev/null"]
        # A command a signal ended exits 255, whether the guest goes on or powered off under it (stop, stop -f,
        # delete -f, restart, a crash): sshd reports a signal death as `exit-signal`, which ssh turns into no
        # status (OpenSSH session.c session_exit_message, clientloop.c client_input_channel_req), and when the
        # guest is gone, limactl's ssh, a ControlMaster client (pkg/sshutil/sshutil.go) at LogLevel=ERROR
        # (cmd/limactl/shell.go), loses its master and exits 255 saying nothing (OpenSSH mux.c); limactl passes
        # either on (osutil.HandleExitError).
        return guest.run(inst, argv, as_root=False, env=env, signal_status=SSH_NO_STATUS)
    _warn_no_bwrap(ctx)
    home_host = guest.guest_home_host_path(inst.dir, inst.config["user"]["home"])
    env["HOME"] = home_host
    return run_child(argv, env=env, cwd=home_host)


def _warn_no_bwrap(ctx: Ctx) -> None:
    marker = os.path.join(ctx.fake_dir, "warned-no-bwrap")
    if os.path.exists(marker):
        return
    sys.stderr.write("fake limactl: WARNING: bwrap not found; running shell commands directly on the host "
                     "(mounts and the guest filesystem are NOT enforced)\n")
    os.makedirs(ctx.fake_dir, exist_ok=True)
    with open(marker, "w", encoding="utf-8"):
        pass


def run_child(cmd: list[str], *, env: dict[str, str], cwd: str | None) -> int:
    """Run a child on the host with inherited stdio (no bwrap); return its exit code."""
    try:
        child = subprocess.Popen(cmd, env=env, cwd=cwd)
    except OSError as e:
        sys.stderr.write(f"fake limactl: cannot run {cmd[0]}: {e}\n")
        return 255
    return guest.wait(child.pid)


COPY_FLAGS = {"recursive": Flag("bool", "r"), "verbose": Flag("bool", "v"), "backend": Flag("str", default="auto")}


@dataclass
class CopyPath:
    arg: str
    display: str
    host: str | None
    writable: bool
    remote: bool
    inst: Instance | None = None


def cmd_copy(ctx: Ctx, p: Parsed) -> int:
    if len(p.args) < 2:
        raise wrap_args_error("copy", f"requires at least 2 arg(s), only received {len(p.args)}",
                              "copy SOURCE ... TARGET [flags]", "Copy files between host and guest")
    if p.get("backend") not in ("auto", "rsync", "scp"):
        raise Fatal(f"invalid backend {bq(p.get('backend'))}, must be one of: scp, rsync, auto")
    paths = [_copy_path(ctx, a) for a in p.args]
    if p.get("backend") == "rsync" and any(x.remote for x in paths) and not shutil.which("rsync", path=GUEST_PATH):
        raise Fatal("rsync not available on guest(s)")
    fail = injected_failure(ctx, "copy")
    if fail:
        raise Fatal(fail)
    if os.environ.get("FAKE_LIMACTL_SHELL_SSH_FAIL") and any(x.remote for x in paths):
        sys.stderr.write("ssh: connect to host 127.0.0.1 port 22: Connection refused\r\nscp: Connection closed\r\n")
        raise ChildExit(255)
    *sources, target = paths
    return scp_like_copy(sources, target, recursive=bool(p.get("recursive")), verbose=bool(p.get("verbose")))


def _copy_path(ctx: Ctx, arg: str) -> CopyPath:
    if ":" not in arg:
        return CopyPath(arg, arg, arg, True, False)
    name, _, gpath = arg.partition(":")
    if ":" in gpath:
        raise Fatal(f"path {bq(arg)} contains multiple colons")
    try:
        inst = inspect(ctx, name)
    except NotExist:
        raise Fatal(f"instance {bq(name)} does not exist, run `limactl create {name}` to create a new instance")
    if inst.status == "Stopped":
        raise Fatal(f"instance {bq(name)} is stopped, run `limactl start {name}` to start the instance")
    if inst.config is None:
        raise Fatal(f"instance {bq(name)} has no configuration")
    guest.ensure_guestfs(inst)
    host, writable = guest.resolve_guest_path(inst, gpath or ".")
    return CopyPath(arg, gpath, host, writable, True, inst)


def scp_like_copy(sources: list[CopyPath], target: CopyPath, *, recursive: bool, verbose: bool) -> int:
    code = 0

    def fail(msg: str) -> None:
        nonlocal code
        sys.stderr.write(f"scp: {msg}\n")
        code = 1

    target_is_dir = target.host is not None and os.path.isdir(target.host)
    if len(sources) > 1 and not target_is_dir:
        fail(f"{target.display}: Not a directory")
        return code
    for src in sources:
        if src.host is None or not os.path.lexists(src.host):
            fail(f"{src.display}: No such file or directory")
            continue
        is_dir = os.path.isdir(src.host)
        if is_dir and not recursive:
            fail(f"{src.display}: not a regular file")
            continue
        base = os.path.basename(src.host.rstrip("/"))
        dest = os.path.join(target.host, base) if target_is_dir else target.host
        dest_display = posixpath.join(target.display, base) if target_is_dir else target.display
        if dest is None or not target.writable or (
                target.inst is not None and not guest.user_may_write(target.inst, os.path.dirname(dest) or ".")):
            fail(f'dest open "{dest_display}": Permission denied')
            continue
        if not os.path.isdir(os.path.dirname(dest) or "."):
            fail(f'dest open "{dest_display}": No such file or directory')
            continue
        try:
            if is_dir:
                shutil.copytree(src.host, dest, symlinks=False, dirs_exist_ok=True)
            else:
                shutil.copyfile(src.host, dest)
                shutil.copymode(src.host, dest)
        except PermissionError:
            fail(f'dest open "{dest_display}": Permission denied')
        except OSError as e:
            fail(f"{dest_display}: {e.strerror}")
        else:
            if verbose:
                sys.stderr.write(f"Sending file modes: {src.display} -> {dest_display}\n")
    return code
