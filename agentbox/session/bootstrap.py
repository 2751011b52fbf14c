"""Bootstrap scripts: checked before anything is created, and run from a pinned copy.

Every script, in the workspace or not, is read once (pins.read: regular file, size-capped, the
content trust checked) and copied into the read-only staging folder under a name made from its
digest (agentbox.session.staging writes the copies); the VM runs that copy, in the workspace. So the bytes
that run are the bytes that were checked, even if something rewrites the script while the launch
is under way. A project's agentbox.yml names scripts only with the user's trust (trust.py);
callers gate on it.
"""

import hashlib
from typing import NamedTuple

from agentbox import staginglayout
from agentbox.config import pins
from agentbox.config.load import Config, Script
from agentbox.errors import ConfigError


class Plan(NamedTuple):
    on_create: list[str]  # paths as the VM sees them (in the staging folder)
    on_start: list[str]
    staged: dict[str, bytes]  # file name in the staging folder's bootstrap/ -> content


def plan(config: Config, staging_mount: str) -> Plan:
    config.require_workspace()
    staged: dict[str, bytes] = {}

    def place(script: Script, key: str) -> str:
        path = script.path
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a file"
            raise ConfigError(
                f"bootstrap.{key}: {path} {what} (named in the {script.origin} config)",
                hint="Fix the path; relative paths are relative to the workspace.",
            )
        data = pins.read(path, f"bootstrap.{key}")
        name = f"{hashlib.sha256(data).hexdigest()[:16]}-{path.name}"
        staged[name] = data
        return f"{staging_mount}/{staginglayout.BOOTSTRAP}/{name}"

    on_create = [place(s, "onCreateScript") for s in config.on_create]
    on_start = [place(s, "onStartScript") for s in config.on_start]
    return Plan(on_create, on_start, staged)

