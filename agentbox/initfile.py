"""`agentbox init`: write the commented example config without clobbering an existing file."""

from __future__ import annotations

from pathlib import Path

from agentbox import paths, resources
from agentbox.errors import AgentboxError
from agentbox.fsutil import atomic_write


def write(cwd: Path, is_global: bool, force: bool) -> Path:
    target = paths.global_config_file() if is_global else cwd / paths.LOCAL_CONFIG_NAME
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise AgentboxError(f"{target} exists and is not a regular file; refusing to replace it")
    if target.exists() and not force:
        raise AgentboxError(f"{target} already exists; nothing was written", hint="Use --force to overwrite it.")
    text = resources.text("agentbox.yml.example")
    if is_global:
        text = text.replace("# agentbox.yml", "# ~/.config/agentbox/config.yml", 1)
    try:
        atomic_write(target, text, mode=0o644, overwrite=force)
    except FileExistsError as exc:
        raise AgentboxError(f"{target} appeared while writing; nothing was overwritten") from exc
    except OSError as exc:
        raise AgentboxError(f"cannot write {target}: {exc.strerror}") from exc
    return target
