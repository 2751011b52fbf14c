"""`limactl create` (cmd/limactl/start.go, pkg/instance/create.go) and reading a template argument
(a file, `-`, `template:NAME`). The double refuses what would download an Ubuntu image."""

from __future__ import annotations

import os
import re
import shutil
import sys

import guest
from constants import LONGEST_SOCK, UNIX_PATH_MAX, VERSION
from context import (
    Ctx,
    go_errno_text,
    identifier_error,
    injected_failure,
    lima_lock,
    new_state,
    validate_inst_name,
    write_state,
)
from limayaml import load_config, validate_config
from logrus import Fatal, LoadError, bq, out
from pflag import Flag, Parsed, create_flags, not_implemented_flags, wrap_args_error

CREATE_FLAGS = dict(create_flags(), name=Flag("str", default=""), **{"list-templates": Flag("bool"),
                                                                   "list-drivers": Flag("bool")})


def list_templates(ctx: Ctx) -> list[tuple[str, str]]:
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


def read_template_arg(ctx: Ctx, arg: str, name: str) -> tuple[str, bytes]:
    """limatmpl.Read: returns (instance name, template bytes)."""
    if arg == "-":
        return name, sys.stdin.buffer.read()
    m = re.match(r"^template:(?://)?(.+)$", arg)
    if m:
        tname = m[1]
        if arg.startswith("template://"):
            ctx.log.warn(f"Template locator {bq(arg)} should be written {bq('template:' + tname)} since Lima v2.0")
        name = name or _name_from_yaml_path(tname)
        for t, path in list_templates(ctx):
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
        out("".join(t + "\n" for t, _ in list_templates(ctx) if not t.startswith("_")))
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
    name, data = read_template_arg(ctx, arg, name)
    if os.path.exists(os.path.join(ctx.lima_home, name, "lima.yaml")):
        raise Fatal(f"instance {bq(name)} already exists")
    from editflags import apply, raw_params, yq_expressions
    exprs = yq_expressions(ctx, p, new_instance=True,
                           params=raw_params(data, os.path.join(ctx.lima_home, name, "lima.yaml")))
    if tty:
        raise Fatal("fake limactl: `limactl create` with --tty=true would open an interactive menu; pass --tty=false")
    ctx.log.info("Terminal is not available, proceeding without opening an editor")
    data = apply(exprs, data, os.path.join(ctx.lima_home, name, "lima.yaml"))
    create_instance(ctx, name, data)
    ctx.log.info(f"Run `limactl start {name}` to start the instance.")
    return 0


def check_socket_path(name: str, inst_dir: str) -> None:
    """The longest socket Lima makes in the instance folder must fit a unix socket path (create.go, clone.go)."""
    sock = os.path.join(inst_dir, LONGEST_SOCK)
    if len(sock) >= UNIX_PATH_MAX:
        raise Fatal(f"instance name {bq(name)} too long: {bq(sock)} must be less than "
                    f"UNIX_PATH_MAX={UNIX_PATH_MAX} characters, but is {len(sock)}")


def create_instance(ctx: Ctx, name: str, data: bytes) -> str:
    """instance.Create + Prepare. Builds everything in a staging dir, then renames it under the lock."""
    inst_dir = ctx.inst_dir(name)
    check_socket_path(name, inst_dir)
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
    if os.environ.get("FAKE_LIMACTL_FAIL_CREATE_STAGE") == "write":
        fail = injected_failure(ctx, "create")
        if fail:  # create.go makes the instance folder, then writes lima.yaml into it: a full disk leaves it empty
            os.makedirs(inst_dir, mode=0o700)
            with open(yaml_path, "wb"):
                pass
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
