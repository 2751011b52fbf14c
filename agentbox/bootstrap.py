"""Bootstrap scripts: where each one runs from in the VM, checked before anything is created.

A script inside the workspace runs in place (the workspace is mounted at the same path). One outside
it (`~/...`, or a workspace symlink whose real path leaves the workspace) is copied into the
read-only staging folder, but only when a trusted config named it: a project's agentbox.yml must not
be able to pull a host file such as ~/.aws/credentials into the VM.
"""

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

from agentbox.config import Config, Script
from agentbox.errors import ConfigError
from agentbox.fsutil import private_dir, write_if_changed

STAGED_DIR = "bootstrap"


class Plan(NamedTuple):
    on_create: list[str]  # paths as the VM sees them
    on_start: list[str]
    staged: dict[str, Path]  # file name in staging/bootstrap -> host file


def plan(config: Config, staging_mount: str, trusted_local: bool = False) -> Plan:
    workspace = config.require_workspace()
    staged: dict[str, Path] = {}

    def place(script: Script, key: str) -> str:
        path = script.path
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a file"
            raise ConfigError(
                f"bootstrap.{key}: {path} {what} (named in the {script.origin} config)",
                hint="Fix the path; relative paths are relative to the workspace.",
            )
        real = Path(os.path.realpath(path))
        if real == workspace or workspace in real.parents:
            return str(real)
        if script.origin == "local" and not trusted_local:
            raise ConfigError(
                f"bootstrap.{key}: {path} is outside the workspace"
                + (f" (it is a symlink to {real})" if real != path else "")
                + "; a project's agentbox.yml may only run scripts inside its workspace",
                hint="Name host scripts in your global config instead, or trust this agentbox.yml (`agentbox trust`).",
            )
        digest = hashlib.sha256(str(real).encode()).hexdigest()[:10]
        name = f"{digest}-{real.name}"
        staged[name] = real
        return f"{staging_mount}/{STAGED_DIR}/{name}"

    on_create = [place(s, "onCreateScript") for s in config.on_create]
    on_start = [place(s, "onStartScript") for s in config.on_start]
    return Plan(on_create, on_start, staged)


def stage(plan: Plan, staging: Path) -> None:
    folder = private_dir(staging / STAGED_DIR)
    for name, source in plan.staged.items():
        try:
            data = source.read_bytes()
        except OSError as exc:
            raise ConfigError(f"bootstrap: cannot read {source}: {exc.strerror}") from exc
        write_if_changed(folder / name, data)
    for leftover in folder.iterdir():
        if leftover.name not in plan.staged:
            leftover.unlink()
