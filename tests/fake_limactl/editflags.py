"""Lima's edit flags (cmd/limactl/editflags/editflags.go): each flag given becomes a yq expression,
in one fixed order whatever the command line's order, joined with " | " and evaluated on lima.yaml
(yqsubset.py); then the result is loaded and validated as an edited instance is
(cmd/limactl/edit.go, clone.go, restart.go, start.go): a rejected result is saved as
./lima.REJECTED.yaml in the current directory (saveRejectedYAML)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from context import Ctx, go_errno_text, host_home
from goyaml import dump_yaml, go_str, parse_yaml
from limayaml import load_config, ram_in_bytes, schema_errors, validate_config
from logrus import Fatal, LoadError, bq, go_quote
from pflag import Parsed, format_float32
from yqsubset import evaluate

REJECTED_YAML = "lima.REJECTED.yaml"
# Flags Lima skips, with a warning, on an instance that exists already (onlyValidForNewInstances).
NEW_INSTANCE_ONLY = ("image-variant", "arch-variant", "arch", "containerd", "plain")
EXPERIMENTAL = ("mount-inotify", "audio-device", "audio-interface")


def _expand(path: str) -> str:
    """localpathutil.Expand: `~` or `~/...` is the home, other `~...` is an error, then made absolute."""
    if path == "":
        raise ValueError("empty path")
    if path.startswith("~"):
        if path != "~" and not path.startswith("~/"):
            raise ValueError(f"unexpandable path {bq(path)}")
        path = host_home() + path[1:]
    from limayaml import clean_path
    return clean_path(os.path.join(os.getcwd(), path))


def _mount_list(specs: list[str]) -> str:
    items = []
    for s in specs:
        writable = s.endswith(":w")
        loc = _expand(s[:-2] if writable else s)
        items.append(f'{{"location": {go_quote(loc)}, "mountPoint": {go_quote(loc)}, '
                     f'"writable": {"true" if writable else "false"}}}')
    return "[" + ",".join(items) + "]"


def _bool(v: Any) -> str:
    return "true" if v else "false"


def yq_expressions(ctx: Ctx, p: Parsed, *, new_instance: bool, params: dict[str, Any] | None) -> list[str]:
    """YQExpressions: Lima's expression for each flag given, in Lima's order."""
    def mount(_: Any) -> list[str]:
        specs = list(reversed(p.get("mount")))
        expr = f".mounts = {_mount_list(specs)} + .mounts"
        if p.get("mount-only"):
            raise ValueError("flag `--mount` conflicts with `--mount-only`")
        return [expr]

    def mount_none(_: Any) -> list[str]:
        for other in ("mount", "mount-only"):
            if p.get(other):
                raise ValueError(f"flag `--mount-none` conflicts with `{other}`")
        return [".mounts = null"]

    def cpus(v: int) -> list[str]:
        if v < 0:
            raise ValueError("invalid value for number of cpus, must be >= 0")
        return [f".cpus = {v}"]

    def param(values: list[str]) -> list[str]:
        exprs = []
        for item in values:
            key, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"invalid parameter {bq(item)}, expected NAME=VALUE")
            if key not in (params or {}):
                raise ValueError(f"template does not define param {bq(key)}")
            exprs.append(f".param[{go_quote(key)}] = {go_quote(value)}")
        return exprs

    defs: list[tuple[str, Callable[[Any], list[str]]]] = [
        ("cpus", cpus),
        ("memory", lambda v: [f'.memory = "{format_float32(v)}GiB"']),
        ("mount", mount),
        ("mount-only", lambda v: [".mounts = " + _mount_list(v)]),
        ("mount-none", mount_none),
        ("mount-type", lambda v: [f".mountType = {go_quote(v)}"]),
        ("vm-type", lambda v: [f".vmType = {go_quote(v)}"]),
        ("mount-inotify", lambda v: [f".mountInotify = {_bool(v)}"]),
        ("mount-writable", lambda v: [f".mounts[].writable = {_bool(v)}"]),
        ("nested-virt", lambda v: [f".nestedVirtualization = {_bool(v)}"]),
        ("set", lambda v: list(v)),
        ("param", param),
        ("video", lambda v: ['.video.display = "default"' if v else '.video.display = "none"']),
        ("ssh-port", lambda v: [f".ssh.localPort = {v}"]),
        ("arch", lambda v: [f".arch = {go_quote(v)}"]),
        ("disk", lambda v: [f'.disk= "{format_float32(v)}GiB"']),
        ("shell", lambda v: [f".user.shell = {go_quote(v)}"]),
    ]
    exprs: list[str] = []
    for name, build in defs:
        if name not in p.changed:
            continue
        if name in EXPERIMENTAL:
            ctx.log.warn(f"`--{name}` is experimental")
        if name in NEW_INSTANCE_ONLY and not new_instance:
            value = p.get(name)
            shown = format_float32(value) if isinstance(value, float) else value
            ctx.log.warn(f"`--{name}` is not applicable to an existing instance (Hint: create a new instance with "
                         f"`limactl create --{name}={shown} --name=NAME`)")
            continue
        try:
            exprs += build(p.get(name))
        except ValueError as e:
            raise Fatal(f"error while processing flag {bq(name)}: {e}")
    return exprs


def apply(exprs: list[str], content: bytes, yaml_path: str) -> bytes:
    """yqutil.EvaluateExpression of the joined expressions. The double re-serialises the document
    (comments are lost); when the expressions change nothing, the bytes stay as they were."""
    if not exprs:
        return content
    try:
        doc = parse_yaml(content, f"main file {bq(yaml_path)}")
    except LoadError as e:
        raise Fatal(str(e))
    edited = evaluate(" | ".join(exprs), doc)
    if edited == doc:
        return content
    return dump_yaml(edited)


def raw_params(content: bytes, yaml_path: str) -> dict[str, Any]:
    """limayaml.Unmarshal(...).Param: the file's own `param` map (edit and restart check --param
    against it)."""
    try:
        raw = parse_yaml(content, f"main file {bq(yaml_path)}")
    except LoadError as e:
        raise Fatal(str(e))
    params = raw.get("param")
    return {str(k): v for k, v in params.items()} if isinstance(params, dict) else {}


def save_rejected(data: bytes, err: str) -> Fatal:
    """saveRejectedYAML: the rejected YAML goes to ./lima.REJECTED.yaml (the current directory)."""
    try:
        fd = os.open(REJECTED_YAML, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as e:
        return Fatal(f"the YAML is invalid, attempted to save the buffer as {bq(REJECTED_YAML)} but failed: "
                     f"open {REJECTED_YAML}: {go_errno_text(e)}\n{err}")
    return Fatal(f"the YAML is invalid, saved the buffer as {bq(REJECTED_YAML)}: {err}")


def shrink_error(ctx: Ctx, new: bytes, latest: bytes, yaml_path: str) -> str | None:
    """limayaml.ValidateAgainstLatestConfig: the new file's own `disk` must not be smaller than the
    current effective disk (defaults filled)."""
    try:
        _, latest_cfg = load_config(ctx, latest, yaml_path)
        new_raw = parse_yaml(new, "Unmarshal new YAML bytes")
    except LoadError as e:
        return str(e)
    if new_raw.get("disk") is None:
        return None
    new_disk, old_disk = go_str(new_raw["disk"]), latest_cfg["disk"]
    try:
        if ram_in_bytes(new_disk) < ram_in_bytes(old_disk):
            return f"field `disk`: shrinking the disk ({old_disk} --> {new_disk}) is not supported"
    except ValueError as e:
        return str(e)
    return None


def validate_edit(ctx: Ctx, new: bytes, latest: bytes, yaml_path: str, *, check_shrink: bool,
                  warn: bool = True) -> None:
    """Load (its errors are fatal as they are), then Validate and, for edit/clone/restart, the disk
    check: their errors save ./lima.REJECTED.yaml. The double's schema check counts as validation; it
    runs after Lima's checks, so what Lima rejects is rejected with Lima's text."""
    try:
        raw, cfg = load_config(ctx, new, yaml_path, warn=warn)
    except LoadError as e:
        raise Fatal(str(e))
    errs = validate_config(cfg, raw, ctx.log, True) or schema_errors(raw)
    if errs:
        raise save_rejected(new, "\n".join(errs))
    if check_shrink:
        err = shrink_error(ctx, new, latest, yaml_path)
        if err:
            raise save_rejected(new, err)


def write_lima_yaml(path: str, data: bytes) -> None:
    tmp = f"{path}.edit-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
