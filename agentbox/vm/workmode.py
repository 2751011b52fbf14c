"""A VM's mode, live or isolated: fixed when it is created (its mounts), and a launch's mode decided from it.

An isolated VM (`session.mode: isolated`, or `--isolated` when the VM is created) mounts the host workspace
read-only at GUEST_SOURCE instead of writable at its own path (agentbox.review.isolation runs such sessions).
Whether a VM is isolated is fixed when it is created (the mounts are). `mode_of_vm` reads it from what
agentbox rendered for the VM; `session_mode` decides a launch's mode from that and what was asked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox.errors import ConfigError, StateError

if TYPE_CHECKING:
    from agentbox.config.load import Config

LIVE = "live"
ISOLATED = "isolated"
# Where an isolated VM sees the host workspace, read-only. The workspace's own path holds the agent's copy.
GUEST_SOURCE = "/mnt/agentbox/workspace"
NOT_GIT_HINT = (
    "Make it a git repository (`git init`; one without commits works), or use `session.mode: live`."
)


def mode_of_vm(expected: dict[str, Any] | None, workspace: Path) -> str | None:
    """live or isolated, from the mounts agentbox rendered for the VM; None when there is no record."""
    if not expected:
        return None
    for location, mount_point, writable in expected.get("mounts", []):
        if location != str(workspace):
            continue
        if mount_point == str(workspace) and writable:
            return LIVE
        if mount_point == GUEST_SOURCE and not writable:
            return ISOLATED
    return None


def session_mode(requested: str, vm_mode: str | None, vm_name: str, asked_by: str, aside: bool = False) -> str:
    """The mode this launch runs in. An isolated VM only runs isolated (it is the stricter). A VM created live
    refuses a launch that asked for isolation rather than run it live, unless `aside` (the session's own
    `--isolated`): then it runs on a copy aside in that VM (launch.sh --copy-aside), as `run --on local` does."""
    if vm_mode == ISOLATED:
        return ISOLATED
    if requested == ISOLATED and aside and vm_mode == LIVE:
        return ISOLATED
    if requested == ISOLATED:
        raise StateError(
            f"isolation was asked for ({asked_by}), but the VM {vm_name} was created live: the agent would "
            "edit your workspace directly, so agentbox does not start it",
            hint="Set `session.mode: isolated` in agentbox.yml (or the global config) and run "
            "`agentbox start --recreate`, or run `agentbox start --recreate --isolated`: either recreates the "
            "VM isolated (its disk is deleted; your workspace on the host is not touched).",
        )
    return LIVE


def not_a_git_work_tree(workspace: Path) -> ConfigError:
    """Isolated mode builds the copy from a git checkpoint and applies proposals with git."""
    return ConfigError(
        f"session.mode: isolated needs the workspace {workspace} to be a git work tree (agentbox makes the "
        "agent's copy from a git checkpoint of it and applies its proposals with git), and it is not one",
        hint=NOT_GIT_HINT,
    )


def mount_point_problem(mount_point: str, workspace: Path) -> str | None:
    """Why an extra mount cannot be had in an isolated VM: the workspace path holds the guest-local copy, and
    a share at, above or in it would put the copy (and its removal) on the host."""
    point = os.path.normpath(mount_point)
    for reserved, what in ((str(workspace), "the workspace path, where the agent's copy lives"),
                           (GUEST_SOURCE, "where the VM sees the workspace")):
        if point == reserved or point.startswith(reserved.rstrip("/") + "/") or reserved.startswith(point + "/"):
            return f"its mount point {point} is at, inside or above {reserved} ({what})"
    return None


def with_isolation(config: Config) -> Config:
    """The config of a launch given `--isolated`: the flag wins over session.mode."""
    return config._replace(
        session_mode=ISOLATED, origins={**config.origins, "session.mode": "the command line (--isolated)"}
    )


def asked_on_command_line(config: Config) -> bool:
    """Whether this launch's isolation is its own `--isolated` (a session on a copy), not session.mode (a VM
    that cannot write the workspace)."""
    return config.session_mode == ISOLATED and config.origins.get("session.mode", "").startswith("the command line")


def asked_by(config: Config) -> str:
    origin = config.origins.get("session.mode", "")
    return origin if origin.startswith("the command line") else f"session.mode: isolated in {origin}"
