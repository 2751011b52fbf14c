"""`limactl edit [INSTANCE]` with edit flags (cmd/limactl/edit.go): a stopped instance's lima.yaml
is rewritten in place; without flags and without a terminal nothing happens. Editing a template
file (`edit FILE.yaml`) and the interactive editor are refused."""

from __future__ import annotations

import sys

from cmd_start import do_start
from context import Ctx, validate_inst_name
from editflags import apply, raw_params, validate_edit, write_lima_yaml, yq_expressions
from instances import inspect
from logrus import Fatal, NotExist, bq
from pflag import Flag, Parsed, edit_flags, not_implemented_flags, wrap_args_error

EDIT_FLAGS = dict(edit_flags(), start=Flag("bool"))


def cmd_edit(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, EDIT_FLAGS)
    if len(p.args) > 1:
        raise wrap_args_error("edit", f"accepts at most 1 arg(s), received {len(p.args)}",
                              "edit INSTANCE|FILE.yaml [flags]", "Edit an instance of Lima or a template")
    arg = p.args[0] if p.args else "default"
    if validate_inst_name(arg) is not None:
        raise Fatal(f"fake limactl: `limactl edit {arg}` (editing a template file) is not implemented by the "
                    "test double")
    try:
        inst = inspect(ctx, arg)
    except NotExist:
        raise Fatal(f"instance {bq(arg)} not found")
    if inst.status == "Running":
        raise Fatal("cannot edit a running instance")
    with open(inst.yaml_path, "rb") as f:
        content = f.read()
    params = raw_params(content, inst.yaml_path) if "param" in p.changed else None
    exprs = yq_expressions(ctx, p, new_instance=False, params=params)
    if not exprs:
        if ctx.tty:
            raise Fatal("fake limactl: `limactl edit` without edit flags and with --tty=true would open an "
                        "editor; pass edit flags or --tty=false")
        ctx.log.info("Aborting, as requested by saving the file with empty content")
        return 0
    edited = apply(exprs, content, inst.yaml_path)
    if edited == content:
        ctx.log.info("Aborting, no changes made to the instance")
        return 0
    validate_edit(ctx, edited, content, inst.yaml_path, check_shrink=True)
    write_lima_yaml(inst.yaml_path, edited)
    ctx.log.info(f"Instance {bq(inst.name)} configuration edited")
    if ctx.tty and "start" not in p.changed and sys.stdin.isatty():
        raise Fatal("fake limactl: `limactl edit` would ask whether to start the instance; pass --start or "
                    "--tty=false")
    if p.get("start"):
        do_start(ctx, inspect(ctx, inst.name))
    return 0

