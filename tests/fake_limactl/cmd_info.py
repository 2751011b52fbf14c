"""`limactl info` and `limactl validate`."""

from __future__ import annotations

import json
import os

from cmd_create import list_templates, read_template_arg
from constants import SHELL_ENV_BLOCK, VERSION
from context import Ctx, host_arch
from limayaml import SchemaError, fill_defaults, load_aux_config, load_config, validate_config
from logrus import Fatal, LoadError, bq, out
from pflag import Flag, Parsed, wrap_args_error

INFO_FLAGS = {"yq": Flag("str", default=".", unsupported=True)}
VALIDATE_FLAGS = {"fill": Flag("bool")}


def cmd_info(ctx: Ctx, p: Parsed) -> int:
    default_template = fill_defaults({}, load_aux_config(ctx, "default.yaml", "default"),
                                     load_aux_config(ctx, "override.yaml", "override"),
                                     os.path.join(ctx.lima_home, "default"), None, False)
    info = {
        "version": VERSION,
        "templates": [{"name": n, "location": loc} for n, loc in list_templates(ctx)],
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
        name, data = read_template_arg(ctx, arg, "")
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
