"""Command-line parsing: a small look-alike of spf13/pflag and cobra (flags before and after
arguments, `--flag=value`, grouped short flags, `--` ends the flags) and cobra's argument errors."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from context import Ctx
from logrus import Fatal, go_quote


@dataclass
class Flag:
    kind: str  # "bool" | "str" | "strs" (StringArray) | "slice" (StringSlice: CSV) | "int" | "uint16" | "float32"
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


# Lima's edit flags (cmd/limactl/editflags/editflags.go): RegisterEdit's for edit, clone, rename and
# restart; RegisterCreate adds the create-only ones for create and start. editflags.py turns them
# into yq expressions; the ones marked unsupported fail loudly.
_EDIT_FLAGS = {
    "cpus": Flag("int"), "dns": Flag("strs", unsupported=True), "memory": Flag("float32"),
    "mount": Flag("slice"), "mount-only": Flag("slice"), "mount-none": Flag("bool"),
    "mount-type": Flag("str"), "mount-writable": Flag("bool"), "mount-inotify": Flag("bool"),
    "network": Flag("slice", unsupported=True), "nested-virt": Flag("bool"),
    "rosetta": Flag("bool", unsupported=True), "set": Flag("strs"), "param": Flag("strs"),
    "ssh-port": Flag("uint16"), "video": Flag("bool"), "disk": Flag("float32"), "vm-type": Flag("str"),
    "shell": Flag("str"),
}
_CREATE_ONLY_FLAGS = {
    "arch": Flag("str"), "image-variant": Flag("str", unsupported=True),
    "arch-variant": Flag("str", unsupported=True), "containerd": Flag("str", unsupported=True),
    "plain": Flag("bool", unsupported=True), "port-forward": Flag("strs", unsupported=True),
    "audio-device": Flag("str", unsupported=True), "audio-interface": Flag("str", unsupported=True),
}


def edit_flags() -> dict[str, Flag]:
    """RegisterEdit: the flags of `edit`, `clone`, `restart`."""
    return dict(_EDIT_FLAGS)


def create_flags() -> dict[str, Flag]:
    """RegisterCreate: the edit flags plus the create-only ones (`create`, `start`)."""
    return dict(_EDIT_FLAGS, **_CREATE_ONLY_FLAGS)


def parse_go_int(val: str, flag: str, bits: int = 64, unsigned: bool = False) -> int:
    """strconv.ParseInt(val, 0, bits) / ParseUint, as pflag's Int and Uint16 call them."""
    fn = "ParseUint" if unsigned else "ParseInt"
    m = re.fullmatch(r"([+-]?)(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|0[0-7_]*|[1-9][0-9_]*)", val)
    if not m or (unsigned and m[1]) or "__" in val or val.endswith("_"):
        raise Fatal(f'invalid argument "{val}" for "{flag}" flag: strconv.{fn}: parsing {go_quote(val)}: '
                    "invalid syntax")
    digits = m[2].replace("_", "")
    if len(digits) > 1 and digits[0] == "0" and digits[1] in "0123456789_":
        n = int(digits, 8)
    else:
        n = int(digits, 0)
    n = -n if m[1] == "-" else n
    lo, hi = (0, 2 ** bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if not lo <= n <= hi:
        raise Fatal(f'invalid argument "{val}" for "{flag}" flag: strconv.{fn}: parsing {go_quote(val)}: '
                    "value out of range")
    return n


def parse_float32(val: str, flag: str) -> float:
    """strconv.ParseFloat(val, 32) for decimal input, rounded to a float32 as pflag keeps it."""
    import struct
    if not re.fullmatch(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", val):
        raise Fatal(f'invalid argument "{val}" for "{flag}" flag: strconv.ParseFloat: parsing {go_quote(val)}: '
                    "invalid syntax")
    try:
        value = float(struct.unpack("f", struct.pack("f", float(val)))[0])
        if math.isinf(value):
            raise OverflowError(val)
        return value
    except OverflowError:
        raise Fatal(f'invalid argument "{val}" for "{flag}" flag: strconv.ParseFloat: parsing {go_quote(val)}: '
                    "value out of range")


def format_float32(v: float) -> str:
    """strconv.FormatFloat(float64(v), 'g', -1, 32): the shortest digits that give back the float32,
    in %e form when the exponent is < -4 or >= 6 (strconv/ftoa.go: eprec 6 for the shortest form)."""
    import struct
    if v == 0:
        return "0"
    for prec in range(1, 10):
        s = f"{v:.{prec - 1}e}"
        if struct.unpack("f", struct.pack("f", float(s)))[0] == v:
            break
    mant, exp_s = s.split("e")
    exp = int(exp_s)
    neg = mant.startswith("-")
    digits = mant.lstrip("-").replace(".", "").rstrip("0") or "0"
    sign = "-" if neg else ""
    if exp < -4 or exp >= 6:
        frac = digits[1:]
        return f"{sign}{digits[0]}{'.' + frac if frac else ''}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    whole = digits[:exp + 1].ljust(exp + 1, "0")
    frac = digits[exp + 1:]
    return f"{sign}{whole}{'.' + frac if frac else ''}"


def read_as_csv(val: str, flag: str) -> list[str]:
    """pflag's StringSlice reads each value as one CSV record."""
    import csv
    if val == "":
        return []
    try:
        return next(csv.reader([val], strict=True))
    except csv.Error as e:
        raise Fatal(f'invalid argument "{val}" for "{flag}" flag: {e}')


def parse_bool(val: str, flag: str) -> bool:
    if val in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if val in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise Fatal(f'invalid argument "{val}" for "{flag}" flag: '
                f"strconv.ParseBool: parsing {go_quote(val)}: invalid syntax")


def parse_flags(argv: list[str], spec: dict[str, Flag], *, interspersed: bool = True) -> Parsed:
    shorts = {f.short: name for name, f in spec.items() if f.short}
    values: dict[str, Any] = {name: (list(f.default or []) if f.kind in ("strs", "slice") else f.default)
                              for name, f in spec.items()}
    changed: set[str] = set()
    args: list[str] = []

    def assign(name: str, value: Any) -> None:
        kind = spec[name].kind
        if kind == "strs":
            values[name].append(value)
        elif kind == "slice":
            values[name].extend(read_as_csv(value, "--" + name))
        elif kind == "int":
            values[name] = parse_go_int(value, "--" + name)
        elif kind == "uint16":
            values[name] = parse_go_int(value, "--" + name, 16, unsigned=True)
        elif kind == "float32":
            values[name] = parse_float32(value, "--" + name)
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
