"""`agentbox sync pull AGENT`: skills, subagents and commands made in the VM, copied back to the host.

Additive only: a file the host already has is never overwritten (one that differs is listed and
left alone), and only the agent's pull folders come back (agents.py `pull_folders`: Claude Code's
skills/, agents/ and commands/; Codex's skills/ and prompts/; Gemini CLI's commands/; Kiro's agents/
and prompts/), never settings. A file that defines hooks or MCP servers in any spelling, or whose front
matter or JSON does not parse, is not copied (agentbox.sync.filter): those run programs on the host.
Files arrive without their executable bit.

What the VM sends is untrusted (the agent is root there). It comes as one tar stream from one
`limactl shell` (lima.Lima.shell_bytes, at most PULL_LIMIT bytes), read with tarfile from memory,
never extracted by it: only regular files are taken, each at most MAX_MEMBER bytes, at most
MAX_MEMBERS of them, each under one of the pull folders (no absolute path, no `..`, no control
characters); links and special files are listed and skipped. On the host nothing is written through
a symlink that leads out of the agent's folder or the pull folder.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import vmread
from agentbox.errors import AgentboxError, LimaError, StateError
from agentbox.fsutil import atomic_write
from agentbox.safetext import visible
from agentbox.sync.filter import runs_programs
from agentbox.vm import lifecycle
from agentbox.vm.lima import RUNNING

if TYPE_CHECKING:
    from agentbox.agents.builtin import AgentSpec
    from agentbox.config.load import AgentConfig
    from agentbox.vm.lifecycle import VmControl

MiB = 1024 * 1024
PULL_LIMIT = 256 * MiB
MAX_MEMBER = 16 * MiB
MAX_MEMBERS = 10_000
# Runs in the VM: the pull folders that exist (not links), as one tar stream on stdout.
TAR_SCRIPT = (
    'cd "$HOME" || exit 1; found=(); for d in "$@"; do if [ -d "$d" ] && [ ! -L "$d" ]; then found+=("$d"); fi; '
    'done; [ ${#found[@]} -eq 0 ] || exec tar -cf - -- "${found[@]}"'
)


class Incoming(NamedTuple):
    relative: str  # relative to the home, the same in the VM and on the host
    data: bytes


class Skipped(NamedTuple):
    shown: str
    why: str


class PullPlan(NamedTuple):
    copy: list[Incoming]
    skipped: list[Skipped]


def fetch(control: VmControl, agent: AgentConfig, spec: AgentSpec) -> bytes:
    """The pull folders of the agent in its VM, as a tar stream (one limactl shell)."""
    vm_name = agent.vm_name
    instance = control.instance(vm_name)
    if instance is None or instance.status != RUNNING:
        state = "does not exist" if instance is None else f"is {instance.status.lower()}"
        raise StateError(f"the VM {vm_name} {state}, so there is nothing to pull from it",
                         hint="Start it with `agentbox start` (its files are kept while it is stopped), then pull.")
    lifecycle.check_ownership(instance, control.config)
    folders = [f"{spec.folder}/{folder}" for folder in spec.pull_folders]
    code, data, stderr = control.lima.shell_bytes(
        vm_name, ["/bin/bash", "-c", TAR_SCRIPT, "agentbox-sync-pull", *folders], PULL_LIMIT
    )
    if code != 0:
        last = [line for line in stderr.splitlines() if line.strip()][-1:] or [f"exit code {code}"]
        raise LimaError(f"reading {', '.join('~/' + f for f in folders)} in the VM {vm_name} failed: "
                        f"{visible(last[0])}")
    return data


def plan(data: bytes, spec: AgentSpec, home: Path) -> PullPlan:
    """What of the stream would be copied to the host, and what is skipped and why."""
    assert spec.folder is not None
    folders = tuple(f"{spec.folder}/{folder}" for folder in spec.pull_folders)
    result = PullPlan([], [])
    if not data:
        return result
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for count, member in enumerate(archive, 1):
                if count > MAX_MEMBERS:
                    result.skipped.append(Skipped("...", f"more than {MAX_MEMBERS:,} entries: the rest is skipped"))
                    break
                _consider(archive, member, folders, home, result)
    except tarfile.TarError as exc:
        if not result.copy and not result.skipped:
            raise AgentboxError(f"the VM did not send a tar archive ({exc}); nothing was copied") from None
        result.skipped.append(Skipped("...", f"the archive from the VM is damaged after this point ({exc})"))
    return result


def _consider(archive: tarfile.TarFile, member: tarfile.TarInfo, folders: tuple[str, ...], home: Path,
              result: PullPlan) -> None:
    name = member.name
    shown = visible("~/" + name)
    relative = posixpath.normpath(name)
    if not name.isprintable():
        result.skipped.append(Skipped(shown, "its name has control characters"))
        return
    if name.startswith("/") or relative == ".." or relative.startswith("../") or "/../" in f"/{name}/":
        result.skipped.append(Skipped(shown, "a path outside the agent's folders"))
        return
    if not any(relative.startswith(folder + "/") for folder in folders):
        if relative not in folders:
            result.skipped.append(Skipped(shown, "not in the folders `sync pull` brings back"))
        return
    if member.isdir():
        return
    if not member.isreg():
        kind = "a link" if member.issym() or member.islnk() else "not a regular file"
        result.skipped.append(Skipped(shown, f"{kind}: only regular files are copied"))
        return
    if member.size > MAX_MEMBER:
        result.skipped.append(Skipped(shown, f"larger than {MAX_MEMBER // MiB} MiB"))
        return
    handle = archive.extractfile(member)
    data = handle.read(MAX_MEMBER + 1) if handle is not None else b""
    problem = runs_programs(relative, data)
    if problem:
        result.skipped.append(Skipped(shown, problem))
        return
    target = home / relative
    if os.path.lexists(target):
        try:
            same = vmread.read_path(target, len(data)) == data
        except vmread.Refused:
            same = False
        if not same:
            result.skipped.append(Skipped(shown, "your host has a different file there, which is kept"))
        return
    result.copy.append(Incoming(relative, data))


def copy(pull: PullPlan, spec: AgentSpec, home: Path) -> tuple[list[str], list[Skipped]]:
    """Write the planned files (mode 0644, never over an existing file); returns (copied, skipped on the way)."""
    assert spec.folder is not None
    agent_root = os.path.realpath(home / spec.folder)
    copied: list[str] = []
    skipped: list[Skipped] = []
    for incoming in pull.copy:
        shown = visible("~/" + incoming.relative)
        target = home / incoming.relative
        pull_folder = home / spec.folder / Path(incoming.relative).relative_to(spec.folder).parts[0]
        allowed = (agent_root, os.path.realpath(pull_folder))
        problem = _make_parents(home / spec.folder, target.parent, allowed)
        if problem:
            skipped.append(Skipped(shown, problem))
            continue
        try:
            atomic_write(target, incoming.data, mode=0o644, overwrite=False)
        except FileExistsError:
            skipped.append(Skipped(shown, "a file appeared there meanwhile, which is kept"))
            continue
        except OSError as exc:
            skipped.append(Skipped(shown, f"cannot write it: {exc.strerror}"))
            continue
        copied.append(shown)
    return copied, skipped


def _make_parents(root: Path, directory: Path, allowed: tuple[str, ...]) -> str | None:
    """Create directory's missing folders below root; why not, when a link leads out of the allowed folders."""
    current = root
    parts: list[str] = [".", *directory.relative_to(root).parts]
    for part in parts:
        current = current / part
        if not os.path.lexists(current):
            try:
                os.mkdir(current)
            except FileExistsError:
                pass
            except OSError as exc:
                return f"cannot create {current}: {exc.strerror}"
        real = os.path.realpath(current)
        if not os.path.isdir(real):
            return f"{visible(str(current))} is not a folder"
        if not any(real == folder or real.startswith(folder.rstrip("/") + "/") for folder in allowed):
            return f"{visible(str(current))} leads to {visible(real)}, outside the agent's folder"
    return None
