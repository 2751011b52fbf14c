"""`agentbox init`: write the commented example config without clobbering an existing file.

`--vm-name NAME` writes the same file with only `vm.name` enabled and trusts it in the same step:
the user typed the name, so there is nothing in the file they have not seen. It is the fix agentbox
suggests when another workspace's VM already has this workspace's name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from agentbox import paths, resources
from agentbox.config import load, naming, trust
from agentbox.errors import AgentboxError, ConfigError
from agentbox.fsutil import atomic_write
from agentbox.vm import statefile

# The lines of agentbox.yml.example that --vm-name enables.
_VM_SECTION = "# vm:\n"
_VM_NAME_LINE = "#   name: agentbox-myproject\n"


def write(cwd: Path, is_global: bool, overwrite: bool, vm_name: str | None = None) -> Path:
    if is_global and vm_name is not None:
        raise ConfigError(
            "--vm-name names one project's VM; in the global config it would give every project the same VM",
            hint="Run `agentbox init --vm-name NAME` in the project's folder (or with -C DIR).",
        )
    if not is_global:
        _require_project_folder(cwd)
    if vm_name is not None:
        _require_free_name(vm_name, Path(os.path.realpath(cwd)))
    target = paths.global_config_file() if is_global else cwd / paths.LOCAL_CONFIG_NAME
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise AgentboxError(f"{target} exists and is not a regular file; refusing to replace it")
    if target.exists() and not overwrite:
        raise AgentboxError(f"{target} already exists; nothing was written", hint="Use --overwrite to replace it.")
    text = resources.text("agentbox.yml.example")
    if is_global:
        text = text.replace("# agentbox.yml", "# ~/.config/agentbox/config.yml", 1)
    if vm_name is not None:
        text = with_vm_name(text, vm_name)
    try:
        atomic_write(target, text, mode=0o644, overwrite=overwrite)
    except FileExistsError as exc:
        raise AgentboxError(f"{target} appeared while writing; nothing was overwritten") from exc
    except OSError as exc:
        raise AgentboxError(f"cannot write {target}: {exc.strerror}") from exc
    return target


def with_vm_name(example: str, vm_name: str) -> str:
    """The example with `vm:` and its `name:` enabled, everything else still commented out."""
    if example.count(_VM_SECTION) != 1 or example.count(_VM_NAME_LINE) != 1:
        raise AgentboxError("agentbox.yml.example no longer has the `vm: name:` lines `init --vm-name` enables")
    # JSON quoting keeps a name such as 1e3 or true a string in YAML.
    return example.replace(_VM_SECTION, "vm:\n").replace(_VM_NAME_LINE, f"  name: {json.dumps(vm_name)}\n")


def trust_written(cwd: Path, target: Path) -> None:
    """Trust the file just written: it enables nothing but the name the user typed."""
    # deferred: start-up (cli.commands.safety: only the commands here that use it)
    from agentbox.cli.commands.safety import acknowledge_trusted
    loaded = load.load(cwd)
    if loaded.local_file is None or os.path.realpath(loaded.local_file) != os.path.realpath(target):
        raise AgentboxError(f"wrote {target}, but agentbox now finds {loaded.local_file}; nothing was trusted")
    enabled = set(loaded.local_data) | {f"vm.{key}" for key in loaded.local_data.get("vm", {})}
    if enabled != {"vm", "vm.name"}:
        raise AgentboxError(f"{target} changed while agentbox was writing it; nothing was trusted",
                            hint="Read it, then run `agentbox trust` if it is what you want.")
    trust.trust(loaded)
    acknowledge_trusted(loaded)


def _require_project_folder(cwd: Path) -> None:
    """Never into the home folder, `/` or another folder agentbox refuses as a workspace."""
    real = Path(os.path.realpath(cwd))
    problem = "it is /" if real == Path("/") else paths.mount_target_problem(real)
    if problem:
        raise ConfigError(
            f"refusing to write {paths.LOCAL_CONFIG_NAME} into {real}: {problem}, which agentbox never uses as a "
            "workspace (and an agentbox.yml there would be found from every folder below it)",
            hint=f"For settings every project shares, run `agentbox init --global` (it writes "
            f"{paths.global_config_file()}); for one project, run `agentbox init` in the project's folder.",
        )


def _require_free_name(vm_name: str, workspace: Path) -> None:
    """A valid Lima name that agentbox has not already given to another workspace's VM."""
    problem = naming.instance_name_problem(vm_name)
    if problem is None:
        limit = naming.socket_limit(paths.lima_home())
        if len(vm_name) > limit:
            problem = (f"{vm_name!r} is {len(vm_name)} characters, but with LIMA_HOME={paths.lima_home()} Lima's "
                       f"socket paths allow at most {limit}")
    if problem:
        raise ConfigError(f"--vm-name: {problem}", hint="Choose another name, such as agentbox-myproject-2.")
    owner = statefile.read(vm_name).get("workspace")
    if owner is not None and owner != str(workspace):
        raise ConfigError(f"--vm-name: {vm_name} is already the VM of {owner}",
                          hint="Choose a name no other workspace uses.")
