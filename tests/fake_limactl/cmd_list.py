"""`limactl list` (cmd/limactl/list.go): --json lines, --format yaml, Go templates, the table,
--quiet, and the warnings and exit codes for missing names."""

from __future__ import annotations

import json
import os
import sys

from constants import TEMPLATE_FIELDS
from context import Ctx, host_home, injected_failure, validate_inst_name
from gotemplate import render_template
from instances import Instance, format_data, inspect, instance_json, instance_names
from limayaml import bytes_size
from logrus import Fatal, NotExist, TemplateError, bq, out
from pflag import Flag, Parsed

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
