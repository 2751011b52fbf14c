#!/usr/bin/env python3
"""A test double of Lima's ``limactl`` (v2.2.0) for agentbox's test-suite.

It keeps all state under ``$LIMA_HOME`` like the real tool, prints Lima's log lines and exit codes
(see /work/shared/lima/CONTRACT.md and Lima's source), and really runs what a VM runs: ``shell``
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
Every invocation appends {"argv", "cwd", "start", "duration", "exit"} to $LIMA_HOME/_fake/calls.jsonl
(the background boot process, `limactl __boot`, is the double's own and not logged).

Environment knobs (all optional):
  FAKE_LIMACTL_LATENCY="list=0.03,shell=0.15,*=0"  sleep per sub-command ("*" = any other one)
  FAKE_LIMACTL_FAIL_<SUBCMD>="msg"     make SUBCMD (START, CREATE, STOP, SHELL, COPY, DELETE, LIST,
                                       RESTART, ...) fatal with msg, after realistic progress lines
  FAKE_LIMACTL_FAIL_<SUBCMD>_TIMES=N   ... only for the first N invocations (counted in $LIMA_HOME/_fake)
  FAKE_LIMACTL_FAIL_CREATE_STAGE=validate|prepare  default prepare: the Stopped instance is left
                                       behind, like a failed image download
  FAKE_LIMACTL_START_LEAVE_RUNNING=1   an injected start failure leaves the instance Running and
                                       booting (timeout-like); without it the instance keeps its
                                       previous status
  FAKE_LIMACTL_START_DEGRADED=1        start ends with DEGRADED + fatal, instance Running
  FAKE_LIMACTL_PROBE_FAIL="stderr"     every readiness probe (`probes:`) fails with this stderr: Lima's
                                       error line, DEGRADED and a fatal `degraded`, instance Running
  FAKE_LIMACTL_START_STEPS_DELAY=S     seconds between start progress lines
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
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import fcntl
import getpass
import hashlib
import json
import os
import platform
import posixpath
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import guest  # tests/fake_limactl/guest.py: the guest machine (this script's folder is on sys.path)
from guest import GUEST_PATH, guestfs, hostname_of

VERSION = "v2.2.0"
HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_PATH = os.path.join(os.path.dirname(HERE), "lima_schema.json")
STATE_FILE = "fake-state.json"
BOOT_SUBCOMMAND = "__boot"
ID_RE = re.compile(r"^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$")
USERNAME_RE = re.compile(r"^[a-z_][a-z0-9_-]*$")
PARAM_NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")
UNIX_PATH_MAX = 108 if sys.platform.startswith("linux") else 104
LONGEST_SOCK = "ssh.sock.1234567890123456"
TMP_SUFFIXES = (".pid", ".sock", ".tmp")
VM_TYPES = ("qemu", "vz", "wsl2", "krunkit")
ARCH_TYPES = ("x86_64", "aarch64", "armv7l", "ppc64le", "riscv64", "s390x")
OS_TYPES = ("Linux", "Darwin", "FreeBSD", "Windows")
SYSTEM_MOUNT_POINTS = ("/", "/bin", "/dev", "/etc", "/home", "/opt", "/sbin", "/tmp", "/usr", "/var")
PROXY_VARS = ("ftp_proxy", "http_proxy", "https_proxy", "no_proxy",
              "FTP_PROXY", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
SHELL_ENV_BLOCK = ["BASH*", "DISPLAY", "DYLD_*", "EUID", "FPATH", "GID", "GROUP", "HOME", "HOSTNAME",
                   "LD_*", "LOGNAME", "OLDPWD", "PATH", "PWD", "SHELL", "SHLVL", "SSH_*", "TERM",
                   "TERMINFO", "TMPDIR", "UID", "USER", "XAUTHORITY", "XDG_*", "ZDOTDIR", "ZSH*", "_*"]
# Key order of Go's limatype.LimaYAML (json output order of `config`).
CONFIG_ORDER = ["base", "minimumLimaVersion", "vmType", "vmOpts", "os", "arch", "images", "cpuType",
                "cpus", "memory", "disk", "additionalDisks", "mounts", "mountTypesUnsupported",
                "mountType", "mountInotify", "ssh", "firmware", "audio", "video", "provision",
                "upgradePackages", "containerd", "guestInstallPrefix", "probes", "portForwards",
                "copyToHost", "message", "networks", "env", "param", "dns", "hostResolver",
                "propagateProxyEnv", "caCerts", "rosetta", "plain", "timezone",
                "nestedVirtualization", "user", "tpm", "osOpts"]
PROVISION_ORDER = ["mode", "skipDefaultDependencyResolution", "script", "file", "playbook", "content",
                   "overwrite", "owner", "path", "permissions", "expression", "format"]
PORT_FORWARD_ORDER = ["guestIPMustBeZero", "guestIP", "guestPort", "guestPortRange", "guestSocket",
                      "hostIP", "hostPort", "hostPortRange", "hostSocket", "proto", "reverse",
                      "ignore", "static"]
TEMPLATE_FIELDS = ["Name", "Hostname", "Status", "Dir", "VMType", "Arch", "CPUs", "Memory", "Disk",
                   "Message", "AdditionalDisks", "Networks", "SSHLocalPort", "SSHConfigFile",
                   "HostAgentPID", "DriverPID", "Errors", "Config", "SSHAddress", "Protected",
                   "LimaVersion", "Param", "AutoStartedIdentifier"]


# --------------------------------------------------------------------------------------------
# Errors, Go-style quoting and logrus-style logging
# --------------------------------------------------------------------------------------------

class Fatal(Exception):
    """An error that limactl reports with logrus.Fatal (exit 1)."""

    def __init__(self, msg: str, **fields: str) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


class NotExist(Exception):
    """Mirrors errors.Is(err, os.ErrNotExist) from store.Inspect."""


class LoadError(Exception):
    """lima.yaml could not be loaded or validated."""


class TemplateError(Exception):
    pass


class ChildExit(Exception):
    """The exit code of a child (shell/copy); printed nothing, like osutil.HandleExitError."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
               "\v": "\\v", '"': '\\"', "\\": "\\\\"}


def go_quote(s: str) -> str:
    """Go's %q (strconv.Quote)."""
    out = []
    for ch in s:
        o = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif 0xDC80 <= o <= 0xDCFF:  # an undecodable byte smuggled in by surrogateescape
            out.append("\\x%02x" % (o - 0xDC00))
        elif 0xD800 <= o <= 0xDFFF:
            out.append("\\ufffd")
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x80:
            out.append("\\x%02x" % o)
        elif o < 0x10000:
            out.append("\\u%04x" % o)
        else:
            out.append("\\U%08x" % o)
    return '"' + "".join(out) + '"'


def bq(s: str) -> str:
    """Go's %#q: backticks when possible (strconv.CanBackquote), else %q."""
    for ch in s:
        o = ord(ch)
        if ch == "`" or ch == "\ufeff" or 0xD800 <= o <= 0xDFFF or (o < 0x20 and ch != "\t") or o == 0x7F:
            return go_quote(s)
    return "`" + s + "`"


_LOGRUS_SAFE = re.compile(r"[A-Za-z0-9\-._/@^+]*")
LEVELS = {"panic": 0, "fatal": 1, "error": 2, "warning": 3, "info": 4, "debug": 5, "trace": 6}


def rfc3339_now() -> str:
    s = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return s[:-6] + "Z" if s.endswith("+00:00") else s


class Logger:
    """logrus TextFormatter (non-TTY) / JSONFormatter lines on stderr."""

    def __init__(self) -> None:
        self.level = LEVELS["info"]
        self.fmt = "text"

    def log(self, level: str, msg: str, *, ts: str | None = None, **fields: Any) -> None:
        if LEVELS[level] > self.level:
            return
        ts = ts or rfc3339_now()
        if self.fmt == "json":
            data = {k: str(v) for k, v in fields.items()}
            data.update(level=level, msg=msg, time=ts)
            line = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
                line = line.replace(a, b)
        else:
            parts = [f"time={self._value(ts)}", f"level={level}", f"msg={self._value(msg)}"]
            parts += [f"{k}={self._value(str(v))}" for k, v in sorted(fields.items())]
            line = " ".join(parts)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    @staticmethod
    def _value(s: str) -> str:
        return s if _LOGRUS_SAFE.fullmatch(s) else go_quote(s)

    def info(self, msg: str, **fields: Any) -> None:
        self.log("info", msg, **fields)

    def warn(self, msg: str, **fields: Any) -> None:
        self.log("warning", msg, **fields)

    def error(self, msg: str, **fields: Any) -> None:
        self.log("error", msg, **fields)

    def debug(self, msg: str, **fields: Any) -> None:
        self.log("debug", msg, **fields)


# --------------------------------------------------------------------------------------------
# Command-line parsing (a small pflag/cobra look-alike)
# --------------------------------------------------------------------------------------------

@dataclass
class Flag:
    kind: str  # "bool" | "str" | "strs"
    short: str | None = None
    default: Any = None
    unsupported: bool = False  # a real limactl flag that the double does not implement


@dataclass
class Parsed:
    values: dict[str, Any]
    changed: set[str]
    args: list[str]

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


GLOBAL_FLAGS = {
    "tty": Flag("bool"),
    "yes": Flag("bool", "y"),
    "debug": Flag("bool"),
    "log-level": Flag("str", default=""),
    "log-format": Flag("str", default="text"),
    "help": Flag("bool", "h"),
}
ROOT_FLAGS = dict(GLOBAL_FLAGS, version=Flag("bool", "v"))


def _edit_flags() -> dict[str, Flag]:
    bools = ("mount-none", "mount-inotify", "mount-writable", "nested-virt", "rosetta", "video", "plain")
    strs = ("cpus", "memory", "mount-type", "vm-type", "audio-device", "audio-interface", "ssh-port",
            "image-variant", "arch-variant", "arch", "containerd", "disk", "shell")
    lists = ("dns", "mount", "mount-only", "network", "set", "param", "port-forward")
    flags = {n: Flag("bool", unsupported=True) for n in bools}
    flags.update({n: Flag("str", unsupported=True) for n in strs})
    flags.update({n: Flag("strs", unsupported=True) for n in lists})
    return flags


def parse_bool(val: str, flag: str) -> bool:
    if val in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if val in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise Fatal(f'invalid argument "{val}" for "{flag}" flag: '
                f"strconv.ParseBool: parsing {go_quote(val)}: invalid syntax")


def parse_flags(argv: list[str], spec: dict[str, Flag], *, interspersed: bool = True) -> Parsed:
    shorts = {f.short: name for name, f in spec.items() if f.short}
    values: dict[str, Any] = {name: (list(f.default or []) if f.kind == "strs" else f.default)
                              for name, f in spec.items()}
    changed: set[str] = set()
    args: list[str] = []

    def assign(name: str, value: Any) -> None:
        if spec[name].kind == "strs":
            values[name].append(value)
        else:
            values[name] = value
        changed.add(name)

    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if a == "--":
            args.extend(argv[i:])
            break
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            f = spec.get(name)
            if f is None:
                raise Fatal(f"unknown flag: --{name}")
            if f.kind == "bool":
                assign(name, parse_bool(val, "--" + name) if eq else True)
                continue
            if not eq:
                if i >= len(argv):
                    raise Fatal(f"flag needs an argument: --{name}")
                val = argv[i]
                i += 1
            assign(name, val)
        elif a.startswith("-") and a != "-":
            j = 1
            while j < len(a):
                c = a[j]
                name = shorts.get(c)
                if name is None:
                    raise Fatal(f"unknown shorthand flag: '{c}' in {a}")
                f = spec[name]
                if f.kind == "bool":
                    if a[j + 1:j + 2] == "=":
                        assign(name, parse_bool(a[j + 2:], f"-{c}, --{name}"))
                        break
                    assign(name, True)
                    j += 1
                    continue
                rest = a[j + 1:]
                rest = rest[1:] if rest.startswith("=") else rest
                if not rest:
                    if i >= len(argv):
                        raise Fatal(f"flag needs an argument: '{c}' in {a}")
                    rest = argv[i]
                    i += 1
                assign(name, rest)
                break
        else:
            args.append(a)
            if not interspersed:
                args.extend(argv[i:])
                break
    return Parsed(values, changed, args)


_DURATION_RE = re.compile(r"^[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+$")


def parse_duration(val: str, flag: str) -> float:
    if val == "0":
        return 0.0
    if not _DURATION_RE.match(val):
        raise Fatal(f'invalid argument "{val}" for "{flag}" flag: time: invalid duration {go_quote(val)}')
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    total = sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", val))
    return -total if val.startswith("-") else total


# --------------------------------------------------------------------------------------------
# Context, paths, state
# --------------------------------------------------------------------------------------------

def host_home() -> str:
    home = os.environ.get("HOME")
    if not home:
        raise Fatal("$HOME is not defined")
    return home


def resolve_lima_home() -> str:
    d = os.environ.get("LIMA_HOME") or os.path.join(host_home(), ".lima")
    return os.path.realpath(d) if os.path.exists(d) else d


def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


@dataclass
class Ctx:
    lima_home: str
    log: Logger
    tty: bool = False
    tty_changed: bool = False
    cmd: str = ""

    def inst_dir(self, name: str) -> str:
        err = validate_inst_name(name)
        if err:
            raise Fatal(err)
        return os.path.join(self.lima_home, name)

    @property
    def fake_dir(self) -> str:
        return os.path.join(self.lima_home, "_fake")

    @property
    def identity_file(self) -> str:
        return os.path.join(self.lima_home, "_config", "user")


def identifier_error(s: str) -> str | None:
    if s == "":
        return "identifier must not be empty"
    if len(s.encode("utf-8", "surrogateescape")) > 76:
        return f"identifier {bq(s)} greater than maximum length (76 characters)"
    if not ID_RE.fullmatch(s):
        return f"identifier {bq(s)} must match {ID_RE.pattern}"
    return None


def validate_inst_name(name: str) -> str | None:
    err = identifier_error(name)
    if err:
        return f"instance name {bq(name)} is not a valid identifier: {err}"
    if name.lower().endswith((".yml", ".yaml")):
        return f"instance name {bq(name)} must not end with .yml or .yaml suffix"
    return None


def go_errno_text(e: OSError) -> str:
    text = os.strerror(e.errno) if e.errno else str(e)
    return text[:1].lower() + text[1:]


def new_state() -> dict[str, Any]:
    return {
        "status": "Stopped",      # Stopped | Running | Broken
        "sshLocalPort": 0,        # port of the current/last boot
        "bootCount": 0,           # incremented by every successful-or-not start
        "iid": "",                # per-boot instance id (written to /run/lima-boot-done)
        "errors": [],             # error texts shown while Broken
        "hostAgentPID": 0, "driverPID": 0,   # fake pids (only used in log lines)
        "proxyEnv": {},           # host proxy variables captured at start (propagateProxyEnv)
        "provisionLog": [],       # scripts run at each boot: {"boot", "index", "mode", "script", "exit"}
                                  # (exit None: not run, without bwrap)
        "dataWritten": [],        # guest paths written by `mode: data` at the last start
        "bootPID": 0,             # the background boot process of the current boot (0 once done)
        "caCertsApplied": False,  # cloud-init's ca_certs ran (once per instance)
        "createdAt": time.time(),
    }


def read_state(inst_dir: str) -> dict[str, Any]:
    state = new_state()
    try:
        with open(os.path.join(inst_dir, STATE_FILE), encoding="utf-8") as f:
            state.update(json.load(f))
    except (OSError, ValueError):
        pass
    return state


def write_state(inst_dir: str, state: dict[str, Any]) -> None:
    tmp = os.path.join(inst_dir, ".fake-state.json.new")  # not *.tmp: `stop -f` deletes those
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, os.path.join(inst_dir, STATE_FILE))


@contextlib.contextmanager
def lima_lock(lima_home: str) -> Iterator[None]:
    os.makedirs(lima_home, exist_ok=True)
    fd = os.open(os.path.join(lima_home, ".fake.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def injected_failure(ctx: Ctx, sub: str) -> str | None:
    key = "FAKE_LIMACTL_FAIL_" + sub.upper().replace("-", "_")
    msg = os.environ.get(key)
    if not msg:
        return None
    times = os.environ.get(key + "_TIMES")
    if times:
        path = os.path.join(ctx.fake_dir, "fail-counts.json")
        with lima_lock(ctx.lima_home):
            try:
                with open(path, encoding="utf-8") as f:
                    counts = json.load(f)
            except (OSError, ValueError):
                counts = {}
            if counts.get(key, 0) >= int(times):
                return None
            counts[key] = counts.get(key, 0) + 1
            os.makedirs(ctx.fake_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(counts, f)
    return msg


def simulate_latency(sub: str) -> None:
    spec = os.environ.get("FAKE_LIMACTL_LATENCY", "")
    table: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, secs = item.partition("=")
        try:
            table[name.strip()] = float(secs)
        except ValueError:
            raise Fatal(f"fake limactl: invalid FAKE_LIMACTL_LATENCY entry {go_quote(item)}")
    delay = table.get(sub, table.get("*", 0.0))
    if delay > 0:
        time.sleep(delay)


# --------------------------------------------------------------------------------------------
# YAML (loaded lazily; YAML 1.2-like scalars as goccy/go-yaml, source text of numbers kept)
# --------------------------------------------------------------------------------------------

class SrcInt(int):
    src: str


class SrcFloat(float):
    src: str


_LOADER: Any = None


def _yaml_loader() -> Any:
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        m = seen[key]
                        raise yaml.constructor.ConstructorError(
                            None, None, f'mapping key "{key}" already defined at [{m.line + 1}:{m.column + 1}]',
                            key_node.start_mark)
                    seen[key] = key_node.start_mark
                except TypeError:
                    pass
            return super().construct_mapping(node, deep)

    dropped = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
               "tag:yaml.org,2002:timestamp"}
    Loader.yaml_implicit_resolvers = {
        k: [(t, r) for t, r in v if t not in dropped] for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                 re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:int",
                                 re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+.0123456789"))

    def construct_int(loader: Any, node: Any) -> SrcInt:
        s = loader.construct_scalar(node)
        v = int(s[2:], 8) if s.startswith("0o") else int(s, 16) if s.startswith("0x") else int(s)
        r = SrcInt(v)
        r.src = s
        return r

    def construct_float(loader: Any, node: Any) -> SrcFloat:
        s = loader.construct_scalar(node)
        r = SrcFloat(float(s.replace(".inf", "inf").replace(".Inf", "inf").replace(".INF", "inf")
                           .replace(".nan", "nan").replace(".NaN", "nan").replace(".NAN", "nan")))
        r.src = s
        return r

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_constructor("tag:yaml.org,2002:float", construct_float)
    _LOADER = Loader
    return Loader


def parse_yaml(data: bytes, comment: str) -> dict[str, Any]:
    import yaml
    try:
        doc = yaml.load(data, Loader=_yaml_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"[{mark.line + 1}:{mark.column + 1}] " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise LoadError(f"failed to unmarshal YAML ({comment}): {where}{problem}")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise LoadError(f"failed to unmarshal YAML ({comment}): [1:1] cannot unmarshal "
                        f"{type(doc).__name__} into Go value of type limatype.LimaYAML")
    return doc


def to_plain(v: Any) -> Any:
    """Strip the SrcInt/SrcFloat wrappers (for yaml/json output)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, dict):
        return {str(k): to_plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_plain(x) for x in v]
    return v


def go_str(v: Any) -> str:
    """How goccy/go-yaml decodes a scalar into a Go string field."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (SrcInt, SrcFloat)):
        return v.src
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    raise LoadError(f"cannot unmarshal {type(v).__name__} into Go value of type string")


# --------------------------------------------------------------------------------------------
# A tiny Go text/template subset ({{.Field}}, {{.Param.K}}, {{"lit"}}, {{json .X}}, trim markers)
# --------------------------------------------------------------------------------------------

class GoMap(dict):
    """A Go map: a missing key renders as <no value> (a struct's missing field is an error)."""


class _NoValue:
    pass


NO_VALUE = _NoValue()


def go_print(v: Any) -> str:
    if v is NO_VALUE:
        return "<no value>"
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, GoMap):
        return "map[" + " ".join(f"{k}:{go_print(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, dict):
        return "{" + " ".join(go_print(x) for x in v.values()) + "}"
    if isinstance(v, list):
        return "[" + " ".join(go_print(x) for x in v) + "]"
    return str(v)


def _template_operand(tok: str, data: Any) -> Any:
    if tok == ".":
        return data
    if tok.startswith('"'):
        try:
            return json.loads(tok)
        except ValueError:
            raise TemplateError(f"malformed string {tok}")
    if len(tok) >= 2 and tok[0] == tok[-1] == "`":
        return tok[1:-1]
    if tok.startswith(".") and re.fullmatch(r"(\.[A-Za-z_][A-Za-z0-9_]*)+", tok):
        cur = data
        for part in tok[1:].split("."):
            if isinstance(cur, GoMap):
                cur = cur.get(part, NO_VALUE)
            elif isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                raise TemplateError(f"can't evaluate field {part}")
        return cur
    raise TemplateError(f"unsupported template operand {tok}")


def render_template(text: str, data: Any, funcs: dict[str, Callable[[Any], str]] | None = None) -> str:
    out: list[str] = []
    pos = 0
    while True:
        i = text.find("{{", pos)
        if i < 0:
            out.append(text[pos:])
            return "".join(out)
        j = text.find("}}", i + 2)
        if j < 0:
            raise TemplateError("unclosed action")
        literal, inner = text[pos:i], text[i + 2:j]
        if inner.startswith("- "):
            literal, inner = literal.rstrip(" \t\r\n"), inner[2:]
        trim_right = inner.endswith(" -")
        if trim_right:
            inner = inner[:-2]
        out.append(literal)
        out.append(_template_action(inner.strip(), data, funcs or {}, i))
        pos = j + 2
        if trim_right:
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1


def _template_action(expr: str, data: Any, funcs: dict[str, Callable[[Any], str]], offset: int) -> str:
    if expr.startswith("/*") and expr.endswith("*/"):
        return ""
    tokens = expr.split()
    try:
        if len(tokens) == 1:
            return go_print(_template_operand(tokens[0], data))
        if len(tokens) == 2 and tokens[0] in funcs:
            return funcs[tokens[0]](_template_operand(tokens[1], data))
    except TemplateError as e:
        raise TemplateError(f"template: format:1:{offset + 2}: executing \"format\" at <{tokens[-1]}>: {e}"
                            + (" in type store.FormatData" if "can't evaluate" in str(e) else ""))
    raise TemplateError(f"fake limactl: unsupported template action {{{{{expr}}}}}")


# --------------------------------------------------------------------------------------------
# lima.yaml: merging default.yaml/override.yaml, filling defaults, validating
# --------------------------------------------------------------------------------------------

def _dict(m: Any, key: str) -> dict[str, Any]:
    v = m.get(key) if isinstance(m, dict) else None
    return v if isinstance(v, dict) else {}


def _list(m: Any, key: str) -> list[Any]:
    v = m.get(key) if isinstance(m, dict) else None
    return copy.deepcopy(v) if isinstance(v, list) else []


def _pick(key: str, o: dict[str, Any], y: dict[str, Any], d: dict[str, Any]) -> Any:
    """Scalar precedence of FillDefault: override > lima.yaml > default.yaml."""
    for src in (o, y, d):
        v = src.get(key)
        if v is not None:
            return v
    return None


def _pick_bool(key: str, o: dict[str, Any], y: dict[str, Any], d: dict[str, Any], default: bool) -> bool:
    v = _pick(key, o, y, d)
    return bool(v) if v is not None else default


def _str_map(*maps: Any) -> GoMap:
    out = GoMap()
    for m in maps:
        if isinstance(m, dict):
            for k, v in m.items():
                out[str(k)] = go_str(v)
    return out


_SIZE_UNITS = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4, "p": 1024 ** 5}


def ram_in_bytes(size: str) -> int:
    """go-units RAMInBytes: binary multiples; a bare number means bytes."""
    sep = max(size.rfind(c) for c in "0123456789. ")
    if sep == -1:
        raise ValueError(f"invalid size: '{size}'")
    num, sfx = (size[:sep + 1], size[sep + 1:]) if size[sep] != " " else (size[:sep], size[sep + 1:])
    if not re.fullmatch(r"[0-9]*\.?[0-9]+|[0-9]+\.", num):
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(num)}: invalid syntax")
    value = float(num)
    low = sfx.lower()
    if not low or low == "b":
        return int(value)
    if len(low) <= 3 and low[0] in _SIZE_UNITS and low[1:] in ("", "i", "b", "ib"):
        return int(value * _SIZE_UNITS[low[0]])
    raise ValueError(f"invalid suffix: '{low}'")


def bytes_size(n: float) -> str:
    """go-units BytesSize ("%.4g" + binary unit)."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"]
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return "%.4g%s" % (n, units[i])


def host_timezone() -> str:
    try:
        with open("/etc/timezone", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        zone = os.path.realpath("/etc/localtime")
    except OSError:
        return ""
    base = os.path.dirname(zone)
    while base not in ("/", ""):
        if os.path.exists(os.path.join(base, "Etc/UTC")):
            return zone[len(base) + 1:]
        base = os.path.dirname(base)
    return ""


# Real limactl refuses to run as root. Run as root, the double behaves as if an unprivileged
# user ran it: the guest user is `lima` (Lima's own fallback name) with this uid, never root.
ROOT_HOST_GUEST_UID = 1000


def default_guest_user(log: Logger | None) -> str:
    if os.geteuid() == 0:
        return "lima"
    name = getpass.getuser()
    if not USERNAME_RE.fullmatch(name):
        if log:
            log.warn(f"local username {bq(name)} is not a valid Linux username (must match "
                     f"{bq(USERNAME_RE.pattern)}); using `lima` instead")
        return "lima"
    if name == "admin":
        if log:
            log.warn("local username `admin` is reserved; using `lima` instead")
        return "lima"
    return name


def host_gecos() -> str:
    if os.geteuid() == 0:
        return "lima"
    try:
        return pwd.getpwuid(os.getuid()).pw_gecos.split(",")[0]
    except KeyError:
        return ""


def version_tuple(v: str) -> tuple[int, int, int, int] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+.*)?", v.strip())
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3]), 0 if m[4] else 1


def expand_tilde(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        return host_home() + path[1:]
    return path


def clean_path(path: str) -> str:
    """Go's filepath.Clean (posixpath.normpath keeps a leading "//")."""
    if not path:
        return "."
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def machine_id() -> str:
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(p, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            continue
    return ""


@dataclass
class TemplateVars:
    guest: dict[str, Any]
    host: dict[str, Any]


def _render_or_keep(text: str, data: dict[str, Any], what: str, log: Logger | None) -> str:
    try:
        return render_template(text, data)
    except TemplateError as e:
        if log:
            log.warn(f"Couldn't process {what} {bq(text)} as a template", error=str(e))
        return text


def fill_defaults(y: dict[str, Any], d: dict[str, Any], o: dict[str, Any], inst_dir: str,
                  log: Logger | None, warn: bool) -> dict[str, Any]:
    """FillDefault of pkg/limayaml/defaults.go (the parts that matter for a test double)."""
    name = os.path.basename(inst_dir)
    cfg: dict[str, Any] = {}
    os_name = go_str(_pick("os", o, y, d) or "")
    cfg["os"] = "Linux" if os_name in ("", "default") else os_name
    own_param = _str_map(y.get("param"))
    user = _fill_user(y, d, o, inst_dir, own_param, log if warn else None)
    cfg["user"] = user
    tv = TemplateVars(
        guest={"Name": name, "Hostname": hostname_of(name), "UID": user["uid"], "User": user["name"],
               "Home": user["home"], "Param": own_param},
        host={"Home": host_home(), "Name": name, "Instance": name, "Dir": inst_dir,
              "LimaHome": os.path.dirname(inst_dir), "User": getpass.getuser(), "UID": os.getuid(),
              "Param": own_param, "GlobalTempDir": "/tmp", "TempDir": os.environ.get("TMPDIR") or "/tmp"})

    cfg["vmType"] = go_str(_pick("vmType", o, y, d) or "qemu")
    arch = go_str(_pick("arch", o, y, d) or "")
    cfg["arch"] = host_arch() if arch in ("", "default") else arch
    cfg["images"] = [_fill_image(img, cfg["arch"]) for img in
                     _list(o, "images") + _list(y, "images") + _list(d, "images")]
    cpus = _pick("cpus", o, y, d)
    cfg["cpus"] = int(cpus) if cpus else 4
    cfg["memory"] = go_str(_pick("memory", o, y, d)) or "4GiB"
    cfg["disk"] = go_str(_pick("disk", o, y, d)) or "100GiB"
    cfg["additionalDisks"] = [{"name": go_str(x)} if not isinstance(x, dict) else x for x in
                              _list(o, "additionalDisks") + _list(y, "additionalDisks") + _list(d, "additionalDisks")]
    for key in ("minimumLimaVersion", "cpuType", "rosetta"):
        if y.get(key) is not None:
            cfg[key] = copy.deepcopy(y[key])
    cfg["audio"] = {k: go_str(_pick(k, _dict(o, "audio"), _dict(y, "audio"), _dict(d, "audio")) or "")
                    for k in ("device", "interface")}
    video = {"display": go_str(_pick("display", _dict(o, "video"), _dict(y, "video"), _dict(d, "video"))) or "none"}
    vnc = _pick("display", *(_dict(_dict(m, "video"), "vnc") for m in (o, y, d)))
    if vnc is not None:
        video["vnc"] = {"display": go_str(vnc)}
    cfg["video"] = video
    cfg["firmware"] = {
        "legacyBIOS": _pick_bool("legacyBIOS", _dict(o, "firmware"), _dict(y, "firmware"), _dict(d, "firmware"), False),
        "images": [_fill_image(i, cfg["arch"]) for i in
                   _list(_dict(o, "firmware"), "images") + _list(_dict(y, "firmware"), "images")
                   + _list(_dict(d, "firmware"), "images")]}
    tz = _pick("timezone", o, y, d)
    cfg["timezone"] = go_str(tz) if tz is not None else host_timezone()
    cfg["ssh"] = _fill_ssh(o, y, d)
    hr = [_dict(m, "hostResolver") for m in (o, y, d)]
    cfg["hostResolver"] = {"enabled": _pick_bool("enabled", *hr, True), "ipv6": _pick_bool("ipv6", *hr, False),
                           "hosts": _str_map(*(_dict(m, "hosts") for m in reversed(hr)))}
    cfg["provision"] = [_fill_provision(p, cfg["os"], tv, log) for p in
                        _list(o, "provision") + _list(y, "provision") + _list(d, "provision")]
    cfg["guestInstallPrefix"] = go_str(_pick("guestInstallPrefix", o, y, d) or "/usr/local")
    cfg["upgradePackages"] = _pick_bool("upgradePackages", o, y, d, False)
    containerd_user_default = cfg["os"] == "Linux" and cfg["arch"] in ("x86_64", "aarch64")
    cd = [_dict(m, "containerd") for m in (o, y, d)]
    cfg["containerd"] = {"system": _pick_bool("system", *cd, False),
                         "user": _pick_bool("user", *cd, containerd_user_default),
                         "archives": _list(cd[0], "archives") + _list(cd[1], "archives") + _list(cd[2], "archives")}
    probes = _list(o, "probes") + _list(y, "probes") + _list(d, "probes")
    cfg["probes"] = [_fill_probe(p, i, len(probes), tv, log) for i, p in enumerate(probes)]
    cfg["portForwards"] = [_fill_port_forward(p, inst_dir, tv, log) for p in
                           _list(o, "portForwards") + _list(y, "portForwards") + _list(d, "portForwards")]
    cfg["copyToHost"] = [_fill_copy_to_host(c, tv, log) for c in
                         _list(o, "copyToHost") + _list(y, "copyToHost") + _list(d, "copyToHost")]
    message = _pick("message", o, y, d)
    if message:
        cfg["message"] = go_str(message)
    cfg["propagateProxyEnv"] = _pick_bool("propagateProxyEnv", o, y, d, True)
    cfg["networks"] = _fill_networks(d, y, o, os.path.join(inst_dir, "lima.yaml"))
    cfg["mountTypesUnsupported"] = [go_str(x) for x in _list(o, "mountTypesUnsupported")
                                    + _list(y, "mountTypesUnsupported") + _list(d, "mountTypesUnsupported")]
    cfg["mountType"] = go_str(_pick("mountType", o, y, d) or _default_mount_type(cfg))
    cfg["mountInotify"] = _pick_bool("mountInotify", o, y, d, False)
    cfg["mounts"] = _fill_mounts(d, y, o, tv, log)
    dns = next((_list(m, "dns") for m in (o, y, d) if _list(m, "dns")), [])
    cfg["dns"] = [go_str(x) for x in dns]
    cfg["env"] = _str_map(d.get("env"), y.get("env"), o.get("env"))
    cfg["param"] = _str_map(d.get("param"), y.get("param"), o.get("param"))
    cfg["vmOpts"] = {**_dict(d, "vmOpts"), **_dict(y, "vmOpts"), **_dict(o, "vmOpts")}
    cfg["osOpts"] = {**_dict(d, "osOpts"), **_dict(y, "osOpts"), **_dict(o, "osOpts")}
    ca = [_dict(m, "caCerts") for m in (o, y, d)]
    cfg["caCerts"] = {"removeDefaults": _pick_bool("removeDefaults", *ca, False),
                      "files": _unique(_list(ca[2], "files") + _list(ca[1], "files") + _list(ca[0], "files")),
                      "certs": _unique(_list(ca[2], "certs") + _list(ca[1], "certs") + _list(ca[0], "certs"))}
    for key in ("nestedVirtualization", "plain", "tpm"):
        cfg[key] = _pick_bool(key, o, y, d, False)
    if cfg["plain"]:
        cfg["mounts"] = []
        cfg["containerd"].update(system=False, user=False)
        cfg["portForwards"] = [p for p in cfg["portForwards"] if p.get("static")]
    ordered = {k: cfg[k] for k in CONFIG_ORDER if k in cfg}
    return prune_config(to_plain(ordered))


def _unique(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def _default_mount_type(cfg: dict[str, Any]) -> str:
    vm = cfg["vmType"]
    if vm in ("vz", "krunkit"):
        return "virtiofs"
    if vm == "wsl2":
        return "wsl2"
    return "reverse-sshfs" if "9p" in cfg["mountTypesUnsupported"] else "9p"


def _fill_user(y: dict[str, Any], d: dict[str, Any], o: dict[str, Any], inst_dir: str,
               param: GoMap, log: Logger | None) -> dict[str, Any]:
    yu, du, ou = _dict(y, "user"), _dict(d, "user"), _dict(o, "user")
    name = _pick("name", ou, yu, du)
    name = go_str(name) if name is not None else default_guest_user(log)
    comment = _pick("comment", ou, yu, du)
    home = _pick("home", ou, yu, du)
    if home is None:
        created_by = ""
        try:
            with open(os.path.join(inst_dir, "lima-version"), encoding="utf-8") as f:
                created_by = f.read().strip()
        except OSError:
            created_by = VERSION
        vt = version_tuple(created_by)
        old = created_by == "" or (vt is not None and vt < (2, 1, 0, 0))
        home = "/home/{{.User}}.linux" if old else "/home/{{.User}}.guest"
    uid = _pick("uid", ou, yu, du)
    uid = int(uid) if uid is not None else (os.getuid() or ROOT_HOST_GUEST_UID)
    inst_name = os.path.basename(inst_dir)
    data = {"Name": inst_name, "Hostname": hostname_of(inst_name), "UID": uid, "User": name,
            "Home": go_str(home), "Param": param}
    return {
        "name": name,
        "comment": go_str(comment) if comment is not None else host_gecos(),
        "home": _render_or_keep(go_str(home), data, "`user.home` value", log),
        "shell": go_str(_pick("shell", ou, yu, du) or "/bin/bash"),
        "uid": uid,
        "passwordlessSudo": _pick_bool("passwordlessSudo", ou, yu, du, True),
    }


def _fill_image(img: Any, arch: str) -> Any:
    if not isinstance(img, dict):
        return img
    img = dict(img)
    img["arch"] = img.get("arch") or arch
    for sub in ("kernel", "initrd"):
        if isinstance(img.get(sub), dict) and not img[sub].get("arch"):
            img[sub] = dict(img[sub], arch=img["arch"])
    return img


def _fill_ssh(o: dict[str, Any], y: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    s = [_dict(m, "ssh") for m in (o, y, d)]
    port = _pick("localPort", *s)
    ssh = {"localPort": int(port) if port is not None else 0}
    for key in ("loadDotSSHPubKeys", "forwardAgent", "forwardX11", "forwardX11Trusted", "overVsock"):
        ssh[key] = _pick_bool(key, *s, False)
    return ssh


def _fill_provision(p: Any, os_name: str, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    p = {k: (go_str(v) if k in ("script", "content", "owner", "path", "permissions", "expression", "format", "mode")
                            and v is not None else v) for k, v in (p if isinstance(p, dict) else {}).items()}
    mode = p.get("mode") or "system"
    p["mode"] = mode
    if mode == "dependency" and p.get("skipDefaultDependencyResolution") is None:
        p["skipDefaultDependencyResolution"] = False
    if mode == "data":
        content = p.get("content")
        p["content"] = _render_or_keep(content, tv.guest, "data content", log) if content is not None else ""
        if p.get("overwrite") is None:
            p["overwrite"] = True
    if mode == "yq":
        if p.get("expression") is not None:
            p["expression"] = _render_or_keep(p["expression"], tv.guest, "expression", log)
        p.setdefault("format", "auto")
    if mode in ("data", "yq"):
        if p.get("owner") is None:
            p["owner"] = "root:wheel" if os_name in ("Darwin", "FreeBSD") else "root:root"
        else:
            p["owner"] = _render_or_keep(p["owner"], tv.guest, "owner", log)
        if p.get("path") is not None:
            p["path"] = _render_or_keep(p["path"], tv.guest, "path", log)
        if p.get("permissions") is None:
            p["permissions"] = "644"
    script = p.get("script") or ""
    p["script"] = _render_or_keep(script, tv.guest, "provisioning script", log) if script else ""
    return {k: p[k] for k in PROVISION_ORDER if k in p}


def _fill_probe(p: Any, i: int, n: int, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    p = dict(p) if isinstance(p, dict) else {}
    out = {"mode": p.get("mode") or "readiness", "description": p.get("description") or f"user probe {i + 1}/{n}",
           "script": _render_or_keep(go_str(p.get("script")), tv.guest, "probing script", log)}
    for key in ("file", "hint"):
        if p.get(key):
            out[key] = p[key]
    return out


def _fill_port_forward(p: Any, inst_dir: str, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    r = dict(p) if isinstance(p, dict) else {}
    r["proto"] = r.get("proto") or "any"
    must_be_zero = r.get("guestIPMustBeZero")
    if r.get("guestIP") is None:
        r["guestIP"] = "0.0.0.0" if must_be_zero else "127.0.0.1"
    if must_be_zero is None:
        r["guestIPMustBeZero"] = r["guestIP"] == "0.0.0.0"
    r.setdefault("hostIP", "127.0.0.1")
    gp, hp = int(r.get("guestPort") or 0), int(r.get("hostPort") or 0)
    if not r.get("guestPortRange") or list(r["guestPortRange"]) == [0, 0]:
        r["guestPortRange"] = [1, 65535] if gp == 0 else [gp, gp]
    if r.get("guestSocket"):
        r["guestSocket"] = _render_or_keep(go_str(r["guestSocket"]), tv.guest, "guestSocket", log)
    if r.get("hostSocket"):
        hs = _render_or_keep(go_str(r["hostSocket"]), tv.host, "hostSocket", log)
        r["hostSocket"] = hs if hs.startswith("/") else os.path.join(inst_dir, "sock", hs)
    elif not r.get("hostPortRange") or list(r["hostPortRange"]) == [0, 0]:
        r["hostPortRange"] = list(r["guestPortRange"]) if hp == 0 else [hp, hp]
    for key in ("guestPort", "hostPort"):
        if not r.get(key):
            r.pop(key, None)
    for key in ("reverse", "ignore", "static"):
        if not r.get(key):
            r.pop(key, None)
    return {k: r[k] for k in PORT_FORWARD_ORDER if k in r}


def _fill_copy_to_host(c: Any, tv: TemplateVars, log: Logger | None) -> dict[str, Any]:
    c = dict(c) if isinstance(c, dict) else {}
    if c.get("guest"):
        c["guest"] = _render_or_keep(go_str(c["guest"]), tv.guest, "guest", log)
    if c.get("host"):
        c["host"] = _render_or_keep(go_str(c["host"]), tv.host, "host", log)
    return c


def _fill_networks(d: dict[str, Any], y: dict[str, Any], o: dict[str, Any], file_path: str) -> list[dict[str, Any]]:
    nets: list[dict[str, Any]] = []
    by_iface: dict[str, int] = {}
    for nw in _list(d, "networks") + _list(y, "networks") + _list(o, "networks"):
        nw = dict(nw) if isinstance(nw, dict) else {}
        iface = nw.get("interface") or ""
        if iface and iface in by_iface:
            cur = nets[by_iface[iface]]
            cur.update({k: v for k, v in nw.items() if v not in (None, "")})
            continue
        if iface:
            by_iface[iface] = len(nets)
        nets.append(nw)
    for i, nw in enumerate(nets):
        if not nw.get("macAddress"):
            sha = hashlib.sha256((machine_id() + f"{file_path}#{i}").encode()).digest()
            nw["macAddress"] = "52:55:55:" + ":".join("%02x" % b for b in sha[:3])
        nw.setdefault("interface", f"lima{i}")
        if not nw["interface"]:
            nw["interface"] = f"lima{i}"
        if nw.get("metric") is None:
            nw["metric"] = 100
    return nets


def _fill_mounts(d: dict[str, Any], y: dict[str, Any], o: dict[str, Any], tv: TemplateVars,
                 log: Logger | None) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    by_point: dict[str, int] = {}
    for m in _list(d, "mounts") + _list(y, "mounts") + _list(o, "mounts"):
        m = dict(m) if isinstance(m, dict) else {}
        loc = clean_path(_render_or_keep(go_str(m.get("location")), tv.host, "mount location", log))
        m["location"] = expand_tilde(loc)
        mp = m.get("mountPoint")
        mp = m["location"] if mp is None else _render_or_keep(go_str(mp), tv.guest, "mount point", log)
        m["mountPoint"] = mp
        if mp in by_point:
            cur = mounts[by_point[mp]]
            for sub in ("sshfs", "9p", "virtiofs"):
                for k, v in _dict(m, sub).items():
                    if v is not None:
                        cur.setdefault(sub, {})[k] = v
            if m.get("writable") is not None:
                cur["writable"] = m["writable"]
            continue
        by_point[mp] = len(mounts)
        mounts.append({"location": m["location"], "mountPoint": mp, "writable": m.get("writable"),
                       "sshfs": dict(_dict(m, "sshfs")), "9p": dict(_dict(m, "9p")),
                       "virtiofs": dict(_dict(m, "virtiofs"))})
    for m in mounts:
        m["writable"] = bool(m["writable"]) if m["writable"] is not None else False
        sshfs, ninep = m["sshfs"], m["9p"]
        for k, v in (("cache", True), ("followSymlinks", False), ("sftpDriver", "")):
            if sshfs.get(k) is None:
                sshfs[k] = v
        for k, v in (("securityModel", "none"), ("protocolVersion", "9p2000.L"), ("msize", "128KiB"),
                     ("cache", "mmap" if m["writable"] else "fscache")):
            if ninep.get(k) is None:
                ninep[k] = v
        m["sshfs"] = {k: sshfs[k] for k in ("cache", "followSymlinks", "sftpDriver")}
        m["9p"] = {k: go_str(ninep[k]) for k in ("securityModel", "protocolVersion", "msize", "cache")}
    return mounts


def prune_config(v: Any) -> Any:
    """Go's omitempty for the config: drop nil, empty slices and empty maps."""
    if isinstance(v, dict):
        out = type(v)() if isinstance(v, GoMap) else {}
        for k, x in v.items():
            x = prune_config(x)
            if x is None or (isinstance(x, (list, dict)) and not x):
                continue
            out[k] = x
        return out
    if isinstance(v, list):
        return [prune_config(x) for x in v]
    return v


def strip_empty_objects(v: Any) -> Any:
    """yq's `del(.. | select(tag == "!!map" and length == 0))`, repeated until stable."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            x = strip_empty_objects(x)
            if isinstance(x, dict) and not x:
                continue
            out[k] = x
        return out
    if isinstance(v, list):
        items = [strip_empty_objects(x) for x in v]
        return [x for x in items if not (isinstance(x, dict) and not x)]
    return v


def check_param_used(y: dict[str, Any]) -> None:
    """validateParamIsUsed: every `param` key must be referenced somewhere."""
    params = y.get("param")
    if not isinstance(params, dict):
        return
    texts: list[str] = []
    for p in _list(y, "provision"):
        if isinstance(p, dict):
            texts += [go_str(p[k]) for k in ("script", "content", "expression", "owner", "path", "permissions")
                      if p.get(k) is not None and not isinstance(p[k], (dict, list))]
    texts += [go_str(p.get("script")) for p in _list(y, "probes") if isinstance(p, dict) and p.get("script")]
    for c in _list(y, "copyToHost"):
        if isinstance(c, dict):
            texts += [go_str(c.get("guest")), go_str(c.get("host"))]
    for p in _list(y, "portForwards"):
        if isinstance(p, dict):
            texts += [go_str(p.get("guestSocket")), go_str(p.get("hostSocket"))]
    for m in _list(y, "mounts"):
        if isinstance(m, dict):
            texts += [go_str(m.get("location")), go_str(m.get("mountPoint"))]
    for key in params:
        key = str(key)
        if key == "internal_netplanOptional":
            continue
        try:
            rx = re.compile(r"{{[^}]*\.Param\." + key + r"[^}]*}}|\bPARAM_" + key + r"\b", re.ASCII)
        except re.error as e:
            raise LoadError(f"field to compile regexp for key {bq(key)}: {e}")
        if not any(rx.search(t) for t in texts):
            raise LoadError(f"field `param` key {bq(key)} is not used in any provision, probe, copyToHost, "
                            "or portForward")


def validate_config(cfg: dict[str, Any], raw: dict[str, Any], log: Logger | None, warn: bool) -> list[str]:
    """pkg/limayaml/validate.go Validate(): returns the error texts (joined with \\n by callers)."""
    errs: list[str] = []
    mlv = cfg.get("minimumLimaVersion")
    if mlv is not None:
        want, have = version_tuple(go_str(mlv)), version_tuple(VERSION)
        if want is None:
            errs.append(f"field `minimumLimaVersion` must be a semvar value, got {bq(go_str(mlv))}: "
                        f"{go_str(mlv)} is not in dotted-tri format")
        elif have is not None and want > have:
            errs.append(f"template requires Lima version {bq(go_str(mlv))}; this is only {bq(VERSION)}")
    if cfg["vmType"] not in VM_TYPES:
        errs.append(f"vmType {bq(cfg['vmType'])} is not a registered driver")
    if cfg["os"] not in OS_TYPES:
        errs.append(f"field `os` must be one of [{' '.join(map(bq, OS_TYPES))}]; got {bq(cfg['os'])}")
    if cfg["arch"] not in ARCH_TYPES:
        errs.append(f"field `arch` must be one of [{' '.join(ARCH_TYPES)}]; got {bq(cfg['arch'])}")
    shell = cfg["user"].get("shell", "")
    if not shell.startswith("/"):
        errs.append(f"field `user.shell` must be an absolute path, got {bq(shell)}")
    if not cfg.get("images") and raw.get("base") is None:
        errs.append("field `images` must be set")
    for key in ("memory", "disk"):
        try:
            ram_in_bytes(cfg[key])
        except ValueError as e:
            errs.append(f"field `{key}` has an invalid value: {e}")
    errs += _validate_mounts(cfg, log, warn)
    port = cfg["ssh"].get("localPort", 0)
    if port:
        err = _port_error("ssh.localPort", port)
        if err:
            errs.append(err)
    if cfg["mountType"] not in ("reverse-sshfs", "9p", "virtiofs", "wsl2"):
        errs.append("field `mountType` must be `reverse-sshfs` or `9p` or `virtiofs`, or `wsl2`, "
                    f"got {bq(cfg['mountType'])}")
    errs += _validate_provision(cfg, log)
    for i, p in enumerate(cfg.get("probes", [])):
        if p.get("script") and not p["script"].startswith("#!"):
            errs.append(f"field `probe[{i}].script` must start with a '#!' line")
        if p.get("mode") != "readiness":
            errs.append(f"field `probe[{i}].mode` can only be `readiness`")
    if cfg["hostResolver"].get("enabled") and cfg.get("dns"):
        errs.append("field `dns` must be empty when field `HostResolver.Enabled` is true")
    for key, value in cfg.get("param", {}).items():
        if not PARAM_NAME_RE.fullmatch(key):
            errs.append(f"param {bq(key)} name does not match regex {bq(PARAM_NAME_RE.pattern)}")
        bad = next((ch for ch in value if not ch.isprintable() and ch not in "\t "), None)
        if bad is not None:
            errs.append(f"param {bq(key)} value contains unprintable character {bq(bad)}")
    if not cfg["user"].get("passwordlessSudo", True) and not cfg.get("plain"):
        errs.append("`user.passwordlessSudo: false` requires `plain: true`")
    return errs


def _port_error(name: str, port: int) -> str | None:
    if port < 0:
        return f"field `{name}` must be > 0"
    if port == 22:
        return f"field `{name}` must not be 22"
    if port > 65535:
        return f"field `{name}` must be < 65536"
    return None


def _validate_mounts(cfg: dict[str, Any], log: Logger | None, warn: bool) -> list[str]:
    errs: list[str] = []
    for i, m in enumerate(cfg.get("mounts", [])):
        loc = m["location"]
        if not loc.startswith("/") and not loc.startswith("~"):
            errs.append(f"field `mounts[{i}].location` must be an absolute path, got {bq(loc)}")
        if loc.startswith("~") and not (loc == "~" or loc.startswith("~/")):
            errs.append(f"field `mounts[{i}].location` refers to an unexpandable path: {bq(loc)}: "
                        f"unexpandable path {bq(loc)}")
        try:
            st = os.stat(loc)
        except FileNotFoundError:
            if warn and log:
                log.warn(f"field `mounts[{i}].location` refers to a non-existent directory: {bq(loc)}:")
        except OSError as e:
            errs.append(f"field `mounts[{i}].location` refers to an inaccessible path: {bq(loc)}: "
                        f"stat {loc}: {go_errno_text(e)}")
        else:
            if not stat.S_ISDIR(st.st_mode):
                # Lima formats a nil error with %w here, hence the odd suffix.
                errs.append(f"field `mounts[{i}].location` refers to a non-directory path: {bq(loc)}: %!w(<nil>)")
        mp = m["mountPoint"]
        if mp in SYSTEM_MOUNT_POINTS:
            errs.append(f"field `mounts[{i}].mountPoint` must not be a system path such as /etc or /usr")
        elif mp == cfg["user"]["home"]:
            errs.append(f"field `mounts[{i}].mountPoint` is the reserved internal home directory {bq(mp)}")
        if mp.startswith("~"):
            errs.append(f"field `mounts[{i}].mountPoint` must not start with `~`")
        try:
            ram_in_bytes(m["9p"]["msize"])
        except ValueError as e:
            errs.append(f"field `msize` has an invalid value: {e}")
    return errs


def _validate_provision(cfg: dict[str, Any], log: Logger | None) -> list[str]:
    errs: list[str] = []
    modes = ("system", "user", "boot", "data", "dependency", "ansible", "yq")
    for i, p in enumerate(cfg.get("provision", [])):
        mode = p.get("mode")
        if mode not in modes:
            errs.append(f"field `provision[{i}].mode` must one of `system`, `user`, `boot`, `data`, "
                        f"`dependency`, `ansible`, or `yq`")
        if mode != "dependency" and p.get("skipDefaultDependencyResolution") is not None:
            errs.append(f"field `provision[{i}].mode` cannot set skipDefaultDependencyResolution, "
                        f"only valid on scripts of type `dependency`")
        if mode in ("data", "yq"):
            if p.get("path") is None:
                errs.append(f"field `provision[{i}].path` must not be empty when mode is {bq(mode)}")
                return errs
            if not p["path"].startswith("/"):
                errs.append(f"field `provision[{i}].path` must be an absolute path")
            if mode == "yq" and p.get("expression") is None:
                errs.append(f"field `provision[{i}].expression` must not be empty when mode is `yq`")
            if not re.fullmatch(r"[+-]?(0[oO])?[0-7]+", p.get("permissions", "")):
                errs.append(f"field `provision[{i}].permissions` must be an octal number: strconv.ParseInt: "
                            f"parsing {go_quote(p.get('permissions', ''))}: invalid syntax")
            continue
        if not p.get("script") and mode != "ansible":
            errs.append(f"field `provision[{i}].script` must not be empty")
        for key, allowed in (("content", "`data`"), ("overwrite", "`data`"), ("owner", "`data`"),
                             ("path", "`data`, or `yq`"), ("permissions", "`data`, or `yq`"), ("format", "`yq`")):
            if p.get(key) is not None:
                errs.append(f"field `provision[{i}].{key}` can only be set when mode is {allowed}")
        if "LIMA_CIDATA" in p.get("script", "") and log:
            log.warn("provisioning scripts should not reference the LIMA_CIDATA variables")
    return errs


def schema_errors(raw: dict[str, Any]) -> list[str]:
    """Validate the user's YAML against tests/lima_schema.json (stricter than Lima, on purpose)."""
    if not os.path.exists(SCHEMA_PATH):
        return []
    try:
        import jsonschema
    except ImportError:
        return []
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        schema = json.load(f)
    validator = jsonschema.Draft202012Validator(schema)
    errs = []
    for e in sorted(validator.iter_errors(to_plain(raw)), key=lambda e: [str(p) for p in e.absolute_path]):
        e = _most_specific(e, jsonschema)
        path = _json_path(list(e.absolute_path))
        if e.validator == "additionalProperties":
            allowed = set((e.schema or {}).get("properties", {}))
            for key in [k for k in e.instance if k not in allowed]:
                errs.append(f"field `{_json_path(list(e.absolute_path) + [key])}` is not a known field "
                            f"(unknown field {go_quote(str(key))})")
        else:
            errs.append(f"field `{path or '.'}` is invalid: {e.message}")
    return errs


def _most_specific(e: Any, jsonschema: Any) -> Any:
    """For `anyOf: [Struct, null]` report why Struct failed, not "not valid under any schema"."""
    while e.context:
        useful = [c for c in e.context if not (c.validator == "type" and c.validator_value == "null")]
        e = jsonschema.exceptions.best_match(useful or e.context)
    return e


def _json_path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + str(p))
    return out


def load_aux_config(ctx: Ctx, filename: str, what: str) -> dict[str, Any]:
    path = os.path.join(ctx.lima_home, "_config", filename)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise LoadError(f"open {path}: {go_errno_text(e)}")
    return parse_yaml(data, f"{what} file {bq(path)}")


class SchemaError(LoadError):
    """The YAML does not match tests/lima_schema.json (checked by create/validate only)."""


def load_config(ctx: Ctx, data: bytes, yaml_path: str, *, warn: bool = False,
                strict: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """limayaml.Load: parse, check params, merge default/override and fill defaults.
    strict: also check the JSON schema right after parsing."""
    raw = parse_yaml(data, f"main file {bq(yaml_path)}")
    if strict:
        errs = schema_errors(raw)
        if errs:
            raise SchemaError("\n".join(errs))
    d = load_aux_config(ctx, "default.yaml", "default")
    o = load_aux_config(ctx, "override.yaml", "override")
    check_param_used(raw)
    try:
        cfg = fill_defaults(raw, d, o, os.path.dirname(yaml_path), ctx.log, warn)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise LoadError(f"failed to unmarshal YAML (main file {bq(yaml_path)}): {e}")
    return raw, cfg


# --------------------------------------------------------------------------------------------
# Instances
# --------------------------------------------------------------------------------------------

@dataclass
class Instance:
    name: str
    dir: str
    status: str = ""
    raw: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    error_objs: list[Any] = field(default_factory=list)  # how Go's json encodes the errors
    state: dict[str, Any] = field(default_factory=new_state)
    protected: bool = False
    lima_version: str = ""
    has_yaml: bool = True

    @property
    def yaml_path(self) -> str:
        return os.path.join(self.dir, "lima.yaml")

    @property
    def ssh_config(self) -> str:
        return os.path.join(self.dir, "ssh.config")

    def ssh_port(self) -> int:
        if self.config is None:
            return 0
        if self.status == "Running" and self.state.get("sshLocalPort"):
            return int(self.state["sshLocalPort"])
        if self.config["ssh"].get("localPort"):
            return int(self.config["ssh"]["localPort"])
        try:
            with open(self.ssh_config, encoding="utf-8") as f:
                for line in f:
                    if line.strip().startswith("Port "):
                        return int(line.strip()[5:])
        except (OSError, ValueError):
            pass
        return 0


def inspect(ctx: Ctx, name: str) -> Instance:
    """store.Inspect: raises NotExist when lima.yaml is missing, Fatal for an invalid name."""
    inst = Instance(name=name, dir=ctx.inst_dir(name))
    try:
        with open(inst.yaml_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise NotExist(f"open {inst.yaml_path}: no such file or directory")
    except OSError as e:
        inst.errors.append(f"open {inst.yaml_path}: {go_errno_text(e)}")
        inst.error_objs.append({"Op": "open", "Path": inst.yaml_path, "Err": e.errno})
        return inst
    try:
        inst.raw, cfg = load_config(ctx, data, inst.yaml_path)
        errs = validate_config(cfg, inst.raw, None, False)
        if errs:
            raise LoadError("\n".join(errs))
    except LoadError as e:
        inst.errors.append(str(e))
        inst.error_objs.append({})
        return inst
    inst.config = cfg
    inst.state = read_state(inst.dir)
    inst.status = inst.state.get("status") or "Stopped"
    if inst.status == "Broken":
        errors = inst.state.get("errors") or ["host agent is running but driver is not"]
        inst.errors += errors
        inst.error_objs += [{} for _ in errors]
    inst.protected = os.path.lexists(os.path.join(inst.dir, "protected"))
    try:
        with open(os.path.join(inst.dir, "lima-version"), encoding="utf-8") as f:
            inst.lima_version = f.read().strip()
    except OSError:
        pass
    return inst


def instance_names(ctx: Ctx) -> list[str]:
    try:
        entries = sorted(os.listdir(ctx.lima_home))
    except FileNotFoundError:
        return []
    return [e for e in entries if not e.startswith((".", "_")) and os.path.isdir(os.path.join(ctx.lima_home, e))]


def format_data(ctx: Ctx, inst: Instance) -> dict[str, Any]:
    """store.FormatData as a Go struct (template field names)."""
    cfg = inst.config or {}
    port = inst.ssh_port() if inst.config is not None else 0
    memory = disk = 0
    if inst.config is not None:
        for key in ("memory", "disk"):
            try:
                value = ram_in_bytes(cfg[key])
            except ValueError:
                value = 0
            memory, disk = (value, disk) if key == "memory" else (memory, value)
    data = {
        "Name": inst.name, "Hostname": hostname_of(inst.name) if inst.has_yaml else "",
        "Status": inst.status, "Dir": inst.dir, "VMType": cfg.get("vmType", ""), "Arch": cfg.get("arch", ""),
        "CPUs": cfg.get("cpus", 0), "Memory": memory, "Disk": disk, "Message": "",
        "AdditionalDisks": cfg.get("additionalDisks", []), "Networks": cfg.get("networks", []),
        "SSHLocalPort": port,
        "SSHConfigFile": inst.ssh_config if inst.config is not None else "",
        "HostAgentPID": 0, "DriverPID": 0, "Errors": list(inst.errors), "Config": inst.config,
        "SSHAddress": "127.0.0.1" if inst.config is not None else "", "Protected": inst.protected,
        "LimaVersion": inst.lima_version, "Param": GoMap(cfg.get("param", {})), "AutoStartedIdentifier": "",
        "HostOS": "linux", "HostArch": host_arch(), "LimaHome": ctx.lima_home, "IdentityFile": ctx.identity_file,
    }
    if cfg.get("message"):
        try:
            data["Message"] = render_template(cfg["message"], data)
        except TemplateError as e:
            inst.errors.append(f"cannot execute template {bq(cfg['message'])}: {e}")
            inst.status = data["Status"] = "Broken"
    return data


def instance_json(ctx: Ctx, inst: Instance) -> dict[str, Any]:
    fd = format_data(ctx, inst)
    obj: dict[str, Any] = {"name": fd["Name"], "hostname": fd["Hostname"], "status": fd["Status"], "dir": fd["Dir"],
                           "vmType": fd["VMType"], "arch": fd["Arch"]}
    optional = [("cpus", fd["CPUs"]), ("memory", fd["Memory"]), ("disk", fd["Disk"]), ("message", fd["Message"]),
                ("additionalDisks", fd["AdditionalDisks"]), ("network", fd["Networks"]),
                ("sshLocalPort", fd["SSHLocalPort"]), ("sshConfigFile", fd["SSHConfigFile"]),
                ("errors", inst.error_objs), ("config", inst.config), ("sshAddress", fd["SSHAddress"])]
    obj.update((k, v) for k, v in optional if v)
    obj["protected"] = fd["Protected"]
    obj["limaVersion"] = fd["LimaVersion"]
    if fd["Param"]:
        obj["param"] = dict(fd["Param"])
    obj.update(HostOS=fd["HostOS"], HostArch=fd["HostArch"], LimaHome=fd["LimaHome"], IdentityFile=fd["IdentityFile"])
    return strip_empty_objects(obj)


# --------------------------------------------------------------------------------------------
# Sub-commands
# --------------------------------------------------------------------------------------------

def wrap_args_error(cmd: str, err: str, usage: str, short: str) -> Fatal:
    return Fatal(f"`limactl {cmd}` {err}.\nSee `limactl {cmd} --help`.\n\nUsage:  limactl {usage}\n\n{short}")


def not_implemented_flags(ctx: Ctx, p: Parsed, spec: dict[str, Flag]) -> None:
    for name in sorted(p.changed):
        if name in spec and spec[name].unsupported:
            raise Fatal(f"fake limactl: flag --{name} of `limactl {ctx.cmd}` is not implemented by the test double")


def out(text: str) -> None:
    sys.stdout.write(text)


LIST_FLAGS = {"format": Flag("str", "f", "table"), "list-fields": Flag("bool"), "json": Flag("bool"),
              "quiet": Flag("bool", "q"), "all-fields": Flag("bool"),
              "yq": Flag("strs", unsupported=True), "filter": Flag("strs", "l", unsupported=True)}


def cmd_list(ctx: Ctx, p: Parsed) -> int:
    fmt = "json" if p.get("json") else p.get("format")
    if p.get("json") and "format" in p.changed:
        raise Fatal("option --json conflicts with option --format")
    if p.get("list-fields") and "format" in p.changed:
        raise Fatal("option --list-fields conflicts with option --format")
    if p.get("quiet") and fmt != "table":
        raise Fatal("option --quiet can only be used with '--format table'")
    if p.get("list-fields"):
        out("\n".join(sorted(TEMPLATE_FIELDS)) + "\n")
        return 0
    fail = os.environ.get("FAKE_LIMACTL_LIST_FAIL") or injected_failure(ctx, "list")
    if fail:
        raise Fatal(fail)
    all_names = instance_names(ctx)
    for n in all_names:
        if not os.path.exists(os.path.join(ctx.lima_home, n, "lima.yaml")):
            ctx.log.warn(f"The directory {bq(ctx.lima_home)} does not look like a valid Lima directory: "
                         f"stat {os.path.join(ctx.lima_home, n, 'lima.yaml')}: no such file or directory")
            break
    if not p.args and not all_names:
        ctx.log.warn("No instance found. Run `limactl create` to create an instance.")
        return 0
    names, unmatched = _select_names(ctx, p.args, all_names)
    if p.get("quiet"):
        out("".join(n + "\n" for n in names))
        if unmatched:
            raise Fatal("unmatched instances")
        return 0
    instances = [_inspect_for_list(ctx, n) for n in names]
    for inst in instances:
        if inst.errors:
            ctx.log.warn(f"instance {bq(inst.name)} has errors", errors="[" + " ".join(inst.errors) + "]")
    _print_instances(ctx, instances, fmt, p.get("all-fields"))
    if unmatched:
        raise Fatal("unmatched instances")
    return 0


def _select_names(ctx: Ctx, args: list[str], all_names: list[str]) -> tuple[list[str], bool]:
    if not args:
        return all_names, False
    names, unmatched = [], False
    for arg in args:
        if arg in all_names:
            names.append(arg)
        else:
            ctx.log.warn(f"No instance matching {arg} found.")
            unmatched = True
    return names, unmatched


def _inspect_for_list(ctx: Ctx, name: str) -> Instance:
    err = validate_inst_name(name)
    if err:
        raise Fatal(f"unable to load instance {name}: {err}")
    try:
        return inspect(ctx, name)
    except NotExist as e:
        yaml_path = os.path.join(ctx.lima_home, name, "lima.yaml")
        return Instance(name=name, dir=os.path.join(ctx.lima_home, name), status="Broken", has_yaml=False,
                        errors=[str(e)], error_objs=[{"Op": "open", "Path": yaml_path, "Err": 2}])


def _print_instances(ctx: Ctx, instances: list[Instance], fmt: str, all_fields: bool) -> None:
    pretty = bool(os.environ.get("_LIMA_OUTPUT_IS_TTY")) or sys.stdout.isatty()
    if fmt == "json":
        if os.environ.get("FAKE_LIMACTL_LIST_MALFORMED"):
            first = json.dumps(instance_json(ctx, instances[0]) if instances else {"name": ""},
                               ensure_ascii=False, separators=(",", ":"))
            out(first[:max(1, len(first) // 2)] + "\n")
        for inst in instances:
            obj = instance_json(ctx, inst)
            out(json.dumps(obj, ensure_ascii=False, indent=4 if pretty else None,
                           separators=None if pretty else (",", ":")) + "\n")
    elif fmt == "yaml":
        import yaml
        for inst in instances:
            out("---\n" + yaml.safe_dump(instance_json(ctx, inst), sort_keys=False, allow_unicode=True))
    elif fmt == "table":
        _print_table(ctx, instances)
    else:
        funcs = {"json": lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")),
                 "yaml": lambda v: __import__("yaml").safe_dump(v, sort_keys=False)}
        lines = []
        for inst in instances:
            data = format_data(ctx, inst)
            data["Message"] = data["Message"].rstrip("\n")
            try:
                lines.append(render_template(fmt, data, funcs) + "\n")
            except TemplateError as e:
                raise Fatal(str(e))
        out("".join(lines))


def _print_table(ctx: Ctx, instances: list[Instance]) -> None:
    rows = [["NAME", "STATUS", "SSH", "VMTYPE", "ARCH", "CPUS", "MEMORY", "DISK", "DIR"]]
    home = host_home()
    for inst in instances:
        fd = format_data(ctx, inst)
        d = fd["Dir"].replace(home, "~", 1) if fd["Dir"].startswith(home) else fd["Dir"]
        rows.append([fd["Name"], fd["Status"], f"127.0.0.1:{fd['SSHLocalPort']}", fd["VMType"], fd["Arch"],
                     str(fd["CPUs"]), bytes_size(fd["Memory"]), bytes_size(fd["Disk"]), d])
    # text/tabwriter(minwidth=4, tabwidth=8, padding=4): every cell but the last is padded.
    widths = [max(4, max(len(r[i]) for r in rows) + 4) for i in range(len(rows[0]) - 1)]
    for r in rows:
        out("".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + r[-1] + "\n")


CREATE_FLAGS = dict(_edit_flags(), name=Flag("str", default=""), **{"list-templates": Flag("bool"),
                                                                   "list-drivers": Flag("bool")})


def _list_templates(ctx: Ctx) -> list[tuple[str, str]]:
    dirs = (os.environ["LIMA_TEMPLATES_PATH"].split(":") if os.environ.get("LIMA_TEMPLATES_PATH")
            else [os.path.join(ctx.lima_home, "_templates")])
    found: dict[str, str] = {}
    for base in dirs:
        for root, _, files in os.walk(base):
            for f in sorted(files):
                if f.endswith(".yaml"):
                    rel = os.path.relpath(os.path.join(root, f), base)[:-5]
                    found.setdefault(rel, os.path.join(root, f))
    return sorted(found.items())


def _read_template_arg(ctx: Ctx, arg: str, name: str) -> tuple[str, bytes]:
    """limatmpl.Read: returns (instance name, template bytes)."""
    if arg == "-":
        return name, sys.stdin.buffer.read()
    m = re.match(r"^template:(?://)?(.+)$", arg)
    if m:
        tname = m[1]
        if arg.startswith("template://"):
            ctx.log.warn(f"Template locator {bq(arg)} should be written {bq('template:' + tname)} since Lima v2.0")
        name = name or _name_from_yaml_path(tname)
        for t, path in _list_templates(ctx):
            if t == tname:
                with open(path, "rb") as f:
                    return name, f.read()
        raise Fatal(f"template {bq(tname + '.yaml')} not found")
    if re.match(r"^https?://", arg):
        raise Fatal(f"fake limactl: creating from a URL ({arg}) is not supported by the test double")
    path = arg[len("file://"):] if arg.startswith("file://") else arg
    if arg.startswith("file://") and not path.startswith("/"):
        raise Fatal(f"file URL {bq(arg)} is not an absolute path")
    name = name or _name_from_yaml_path(path)
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as f:
            return name, f.read()
    except OSError as e:
        verb = "read" if isinstance(e, IsADirectoryError) else "open"
        raise Fatal(f"{verb} {path}: {go_errno_text(e)}")


def _name_from_yaml_path(path: str) -> str:
    s = os.path.basename(path).lower()
    s = s[:-4] if s.endswith(".yml") else s
    s = s[:-5] if s.endswith(".yaml") else s
    err = identifier_error(s)
    if err:
        raise Fatal(f"filename {bq(path)} is invalid: {err}")
    return s


def cmd_create(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, CREATE_FLAGS)
    if p.get("list-templates"):
        out("".join(t + "\n" for t, _ in _list_templates(ctx) if not t.startswith("_")))
        return 0
    if p.get("list-drivers"):
        out("qemu\n")
        return 0
    if len(p.args) > 1:
        raise wrap_args_error("create", f"accepts at most 1 arg(s), received {len(p.args)}",
                              "create FILE.yaml|URL [flags]", "Create an instance of Lima")
    arg = p.args[0] if p.args else ""
    name = p.get("name") or ""
    if name:
        err = validate_inst_name(name)
        if err:
            raise Fatal(err)
    tty = ctx.tty
    if arg == "-":
        if not name:
            raise Fatal("must pass instance name with --name when reading template from stdin")
        if ctx.tty_changed and ctx.tty:
            raise Fatal("cannot use --tty=true when reading template from stdin")
        tty = False
    if arg == "" or validate_inst_name(arg) is None:
        target = arg or name or "default"
        if arg and name and name != arg:
            raise Fatal(f"instance name {bq(arg)} and CLI flag --name={bq(name)} cannot be specified together")
        if os.path.exists(os.path.join(ctx.lima_home, target, "lima.yaml")):
            raise Fatal(f"instance {bq(target)} already exists")
        raise Fatal(f"fake limactl: `limactl create {arg}` would create {bq(target)} from template:default "
                    f"(an Ubuntu VM); pass a YAML file or `-` to the test double")
    name, data = _read_template_arg(ctx, arg, name)
    if os.path.exists(os.path.join(ctx.lima_home, name, "lima.yaml")):
        raise Fatal(f"instance {bq(name)} already exists")
    if tty:
        raise Fatal("fake limactl: `limactl create` with --tty=true would open an interactive menu; pass --tty=false")
    ctx.log.info("Terminal is not available, proceeding without opening an editor")
    create_instance(ctx, name, data)
    ctx.log.info(f"Run `limactl start {name}` to start the instance.")
    return 0


def create_instance(ctx: Ctx, name: str, data: bytes) -> str:
    """instance.Create + Prepare. Builds everything in a staging dir, then renames it under the lock."""
    inst_dir = ctx.inst_dir(name)
    sock = os.path.join(inst_dir, LONGEST_SOCK)
    if len(sock) >= UNIX_PATH_MAX:
        raise Fatal(f"instance name {bq(name)} too long: {bq(sock)} must be less than "
                    f"UNIX_PATH_MAX={UNIX_PATH_MAX} characters, but is {len(sock)}")
    if os.path.lexists(inst_dir):
        raise Fatal(f"instance {bq(name)} already exists ({bq(inst_dir)})")
    if not data:
        raise Fatal("got empty instConfig")
    yaml_path = os.path.join(inst_dir, "lima.yaml")
    try:
        raw, cfg = load_config(ctx, data, yaml_path, warn=True, strict=True)
        errs = validate_config(cfg, raw, ctx.log, True)
    except LoadError as e:
        raise Fatal(str(e))
    if errs:
        raise Fatal("\n".join(errs))
    if os.environ.get("FAKE_LIMACTL_FAIL_CREATE_STAGE") == "validate":
        fail = injected_failure(ctx, "create")
        if fail:
            raise Fatal(fail)
    os.makedirs(ctx.fake_dir, exist_ok=True)
    staging = os.path.join(ctx.fake_dir, f"staging-{name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging, mode=0o700)
    try:
        with open(os.path.join(staging, "lima.yaml"), "wb") as f:
            f.write(data)
        with open(os.path.join(staging, "lima-version"), "w", encoding="utf-8") as f:
            f.write(VERSION)
        write_state(staging, new_state())
        guest.init_guestfs(staging, name, cfg)
        with lima_lock(ctx.lima_home):
            if os.path.lexists(inst_dir):
                if os.path.exists(yaml_path):
                    raise Fatal(f"instance {bq(name)} already exists")
                raise Fatal(f"instance {bq(name)} already exists ({bq(inst_dir)})")
            os.rename(staging, inst_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    images = [i for i in cfg.get("images", []) if isinstance(i, dict) and i.get("arch") == cfg["arch"]]
    if images:
        ctx.log.info("Attempting to download the image", arch=images[0]["arch"],
                     digest=images[0].get("digest", ""), location=images[0].get("location", ""))
    if os.environ.get("FAKE_LIMACTL_FAIL_CREATE_STAGE", "prepare") == "prepare":
        fail = injected_failure(ctx, "create")
        if fail:
            raise Fatal(fail)  # like a failed image download: the Stopped instance stays behind
    return inst_dir


START_FLAGS = dict(_edit_flags(), name=Flag("str", default=""), timeout=Flag("str", default="10m0s"),
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
    if inst.errors:
        raise Fatal(f"errors inspecting instance: [{' '.join(inst.errors)}]")
    if inst.status == "Running":
        ctx.log.info(f"The instance {bq(name)} is already running. Run `{shell_cmd(name)}` to open the shell.")
        return 0
    if inst.status != "Stopped":
        ctx.log.warn(f"expected status `Stopped`, got {bq(inst.status)}")
    do_start(ctx, inst, progress=bool(p.get("progress")), timeout=timeout)
    return 0


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
    _kill_boot(state)
    port = cfg["ssh"].get("localPort") or free_port()
    state.update(status="Running", sshLocalPort=port, bootCount=int(state.get("bootCount", 0)) + 1,
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
    write_state(inst.dir, state)
    inst.state, inst.status = state, "Running"


def _kill_boot(state: dict[str, Any]) -> None:
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
                _start_boot(ctx, inst)  # like a start that timed out: the guest keeps booting
            else:
                _abort_start(ctx, inst, previous)
            raise Fatal(fail)
        _progress(ctx, f"The essential requirement {i} of {len(essential)} is satisfied")
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
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), BOOT_SUBCOMMAND, inst.name,
                              inst.state["iid"]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, env=os.environ.copy())
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
    try:
        guest.run_boot(inst, iid, knobs, results)
    except guest.BootAborted:
        return 1
    finally:
        _record_boot(ctx, inst, iid, results)
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
    _kill_boot(state)
    state.update(status="Stopped", errors=[], hostAgentPID=0, driverPID=0, bootPID=0)
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


RESTART_FLAGS = dict(_edit_flags(), force=Flag("bool", "f"), progress=Flag("bool"))


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


CLONE_FLAGS = dict(_edit_flags(), start=Flag("bool"))


def cmd_clone(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, CLONE_FLAGS)
    if len(p.args) != 2:
        raise wrap_args_error("clone", f"accepts 2 arg(s), received {len(p.args)}",
                              "clone OLDINST NEWINST [flags]", "Clone an instance of Lima")
    old, new = p.args
    try:
        src = inspect(ctx, old)
    except NotExist:
        raise Fatal(f"instance {bq(old)} not found")
    if new == old:
        raise Fatal(f"new instance name {bq(new)} must be different from {bq(old)}")
    if src.status == "Running":
        raise Fatal("cannot clone a running instance")
    new_dir = ctx.inst_dir(new)
    with lima_lock(ctx.lima_home):
        if os.path.lexists(new_dir):
            raise Fatal(f"instance {bq(new)} already exists")
        subprocess.run(["cp", "-a", src.dir, new_dir], check=True)  # keeps the guest's owners
        for entry in os.listdir(new_dir):
            if entry == "protected" or entry.endswith(TMP_SUFFIXES):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(new_dir, entry))
        write_state(new_dir, new_state())
        with contextlib.suppress(OSError), open(guestfs(new_dir, "etc/hostname"), "w", encoding="utf-8") as f:
            f.write(hostname_of(new) + "\n")
    if p.get("start"):
        do_start(ctx, inspect(ctx, new))
    return 0


def cmd_info(ctx: Ctx, p: Parsed) -> int:
    default_template = fill_defaults({}, load_aux_config(ctx, "default.yaml", "default"),
                                     load_aux_config(ctx, "override.yaml", "override"),
                                     os.path.join(ctx.lima_home, "default"), None, False)
    info = {
        "version": VERSION,
        "templates": [{"name": n, "location": loc} for n, loc in _list_templates(ctx)],
        "defaultTemplate": default_template,
        "limaHome": ctx.lima_home,
        "vmTypes": ["qemu"],
        "vmTypesEx": {"qemu": {}},
        "guestAgents": {},
        "shellEnvBlock": SHELL_ENV_BLOCK,
        "hostOS": "linux",
        "hostArch": host_arch(),
        "identityFile": ctx.identity_file,
        "plugins": [],
        "libexecPaths": [],
        "sharePaths": [],
    }
    out(json.dumps(info, indent=4, ensure_ascii=False) + "\n")
    return 0


def cmd_validate(ctx: Ctx, p: Parsed) -> int:
    if not p.args:
        raise wrap_args_error("validate", "requires at least 1 arg(s), only received 0",
                              "validate FILE.yaml [FILE.yaml, ...] [flags]", "Validate YAML templates")
    for arg in p.args:
        name, data = _read_template_arg(ctx, arg, "")
        path = os.path.join(ctx.lima_home, name + ".yaml")
        try:
            raw, cfg = load_config(ctx, data, path, strict=True)
        except SchemaError as e:
            raise Fatal(f"failed to validate YAML file {bq(arg)}: {e}")
        except LoadError as e:
            raise Fatal(str(e))
        errs = validate_config(cfg, raw, ctx.log, False)
        if errs:
            raise Fatal(f"failed to validate YAML file {bq(arg)}: " + "\n".join(errs))
        ctx.log.info(f"{bq(arg)}: OK")
        if p.get("fill"):
            import yaml
            text = yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True)
            out(f"---\n{text}...\n" if len(p.args) > 1 else text)
    return 0


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
    inst = _running_instance(ctx, name, start=bool(p.get("start")))
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
    if guest.bwrap_path():
        return guest.run(inst, [argv0, "-c", script], as_root=False, env=env)
    _warn_no_bwrap(ctx)
    home_host = guest.guest_home_host_path(inst.dir, inst.config["user"]["home"])
    env["HOME"] = home_host
    return run_child([argv0, "-c", script], env=env, cwd=home_host)


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


# --------------------------------------------------------------------------------------------
# Dispatch, global flags, call log
# --------------------------------------------------------------------------------------------

@dataclass
class Command:
    run: Callable[[Ctx, Parsed], int]
    flags: dict[str, Flag]
    usage: str
    interspersed: bool = True


COMMANDS: dict[str, Command] = {
    "list": Command(cmd_list, LIST_FLAGS, "list [flags] [INSTANCE]..."),
    "create": Command(cmd_create, CREATE_FLAGS, "create FILE.yaml|URL [flags]"),
    "start": Command(cmd_start, START_FLAGS, "start NAME|FILE.yaml|URL [flags]"),
    "stop": Command(cmd_stop, STOP_FLAGS, "stop INSTANCE [INSTANCE, ...] [flags]"),
    "restart": Command(cmd_restart, RESTART_FLAGS, "restart INSTANCE [flags]"),
    "delete": Command(cmd_delete, DELETE_FLAGS, "delete INSTANCE [INSTANCE, ...] [flags]"),
    "protect": Command(lambda c, p: cmd_protect(c, p, protect=True), {}, "protect INSTANCE [INSTANCE, ...]"),
    "unprotect": Command(lambda c, p: cmd_protect(c, p, protect=False), {}, "unprotect INSTANCE [INSTANCE, ...]"),
    "clone": Command(cmd_clone, CLONE_FLAGS, "clone OLDINST NEWINST [flags]"),
    "info": Command(cmd_info, {"yq": Flag("str", default=".", unsupported=True)}, "info [flags]"),
    "validate": Command(cmd_validate, {"fill": Flag("bool")}, "validate FILE.yaml [FILE.yaml, ...] [flags]"),
    "shell": Command(cmd_shell, SHELL_FLAGS, "shell [flags] INSTANCE [COMMAND...]", interspersed=False),
    "copy": Command(cmd_copy, COPY_FLAGS, "copy SOURCE ... TARGET [flags]"),
}
# Sub-commands whose FAKE_LIMACTL_FAIL_<SUBCMD> fails them up front (the others fail mid-way).
SIMPLE_FAILURES = ("restart", "protect", "unprotect", "clone", "info", "validate")
ALIASES = {"ls": "list", "rm": "delete", "remove": "delete", "cp": "copy"}
UNIMPLEMENTED = ("rename", "edit", "factory-reset", "prune", "disk", "snapshot", "template", "show-ssh",
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
        return boot_process(ctx, rest)
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
    spec = dict(GLOBAL_FLAGS, **command.flags)
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
    return command.run(ctx, merged)


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
        if lima_home and (os.environ.get("LIMA_HOME") or os.path.isdir(lima_home)) and argv[:1] != [BOOT_SUBCOMMAND]:
            append_call(lima_home, {"argv": argv, "cwd": cwd, "start": started,
                                    "duration": time.time() - started, "exit": code})
    return code


if __name__ == "__main__":
    exit_code = main(sys.argv[1:])
    # Skip the interpreter's teardown (tens of ms for this big module): real limactl exits at once,
    # and benchmarks count everything after the logged duration as the caller's own time.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code if isinstance(exit_code, int) else 1)
