"""Command-line parsing: a small look-alike of spf13/pflag and cobra (flags before and after
arguments, `--flag=value`, grouped short flags, `--` ends the flags) and cobra's argument errors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from context import Ctx
from logrus import Fatal, go_quote


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


def edit_flags() -> dict[str, Flag]:
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


def wrap_args_error(cmd: str, err: str, usage: str, short: str) -> Fatal:
    return Fatal(f"`limactl {cmd}` {err}.\nSee `limactl {cmd} --help`.\n\nUsage:  limactl {usage}\n\n{short}")


def not_implemented_flags(ctx: Ctx, p: Parsed, spec: dict[str, Flag]) -> None:
    for name in sorted(p.changed):
        if name in spec and spec[name].unsupported:
            raise Fatal(f"fake limactl: flag --{name} of `limactl {ctx.cmd}` is not implemented by the test double")
