"""`limactl rename OLD NEW` (cmd/limactl/clone.go, pkg/instance/clone.go): the instance folder is moved
whole, like clone's copy: `protected` is dropped (the rename loses the protection), `swtpm/` and
*.pid, *.sock, *.tmp are left out, `vz-identifier` is emptied. The source must not be Running. Edit
flags (Lima accepts them, as for clone) are refused by the double."""

from __future__ import annotations

import contextlib
import os
import shutil

from cmd_lifecycle import NULLIFY_ON_CLONE, SKIP_ON_CLONE
from constants import TMP_SUFFIXES
from context import Ctx, lima_lock
from guest import guestfs, hostname_of
from instances import inspect
from logrus import Fatal, NotExist, bq
from pflag import Flag, Parsed, edit_flags, not_implemented_flags, wrap_args_error

RENAME_FLAGS = {name: Flag(flag.kind, flag.short, flag.default, unsupported=True)
                for name, flag in edit_flags().items()}


def cmd_rename(ctx: Ctx, p: Parsed) -> int:
    not_implemented_flags(ctx, p, RENAME_FLAGS)
    if len(p.args) != 2:
        raise wrap_args_error("rename", f"accepts 2 arg(s), received {len(p.args)}",
                              "rename OLDINST NEWINST [flags]", "Rename an instance of Lima")
    old, new = p.args
    try:
        src = inspect(ctx, old)
    except NotExist:
        raise Fatal(f"instance {bq(old)} not found")
    if new == old:
        raise Fatal(f"new instance name {bq(new)} must be different from {bq(old)}")
    if src.status == "Running":
        raise Fatal("cannot rename a running instance")
    new_dir = ctx.inst_dir(new)
    with lima_lock(ctx.lima_home):
        if os.path.lexists(new_dir):
            raise Fatal(f"instance {bq(new)} already exists")
        os.rename(src.dir, new_dir)
        for entry in os.listdir(new_dir):
            path = os.path.join(new_dir, entry)
            if entry in SKIP_ON_CLONE and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif entry in SKIP_ON_CLONE or entry.endswith(TMP_SUFFIXES):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            elif entry in NULLIFY_ON_CLONE:
                with open(path, "wb"):
                    pass
        with contextlib.suppress(OSError), open(guestfs(new_dir, "etc/hostname"), "w", encoding="utf-8") as f:
            f.write(hostname_of(new) + "\n")
    return 0
