"""One digest of everything launch.sh's setup applies (its --setup-digest): launch.sh skips the setup when it is the
one it last applied, in the same boot of the VM (provision/launch/current.sh).

It covers the staged files the setup reads, through the digests the host already made where there are some (the
credential and sync manifests list each file's sha256, broker/ca.sha256 the CA's), launch.sh and its parts, and the
options that change the setup. Not the per-launch options (the program, --worktree, --session..., --task, the
hand-back): launch.sh handles those at every launch. Not the sandbox's description (context/): it is staged later
in a launch, and launch.sh compares its digests file with the one it applied itself, with bash's read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentbox.staginglayout import (
    ATTENTION_SCRIPT,
    BROKER_CA_DIGEST,
    CLAUDE_HOOKS,
    CREDS_MANIFEST,
    ENV_FILE,
    GIT_IDENTITY,
    GUARD_FILES,
    GUARDS,
    LAUNCH_PARTS,
    LAUNCH_SCRIPT,
    MEMORY_SCRIPT,
    NETWORK_RULES,
    OPEN_URL,
    OptionValue,
)

# The options whose values the setup applies (contract.LAUNCH_OPTIONS); every other one is per launch.
SETUP_OPTIONS = ("--wait", "--workspace", "--guards", "--binary", "--install", "--on-create", "--on-start", "--sync",
                 "--memory-file", "--notify")
SYNC_DEFAULTS = "sync/defaults"


def setup_files(staging: Path, synced: Sequence[str]) -> list[str]:
    """The staging files the setup reads (relative paths), in a fixed order; bootstrap scripts are named by
    their content in the options."""
    parts = sorted(f"{LAUNCH_PARTS}/{part.name}" for part in (staging / LAUNCH_PARTS).glob("*.sh"))
    return [LAUNCH_SCRIPT, *parts, OPEN_URL, MEMORY_SCRIPT, ATTENTION_SCRIPT, CLAUDE_HOOKS,
            *(f"{GUARDS}/{name}" for name in GUARD_FILES), ENV_FILE, NETWORK_RULES, CREDS_MANIFEST, GIT_IDENTITY,
            BROKER_CA_DIGEST, SYNC_DEFAULTS, *(f"sync/{agent}/manifest" for agent in synced)]


def setup_digest(staging: Path, values: Mapping[str, OptionValue]) -> str:
    """The sha256 (hex) of the staging folder's path, the setup's files as staged now and the setup's options."""
    digest = hashlib.sha256(f"{staging}\0".encode())
    for name in SETUP_OPTIONS:
        items = _items(values.get(name))
        digest.update(f"{name}\0{len(items)}\0".encode() + b"".join(f"{item}\0".encode() for item in items))
    for relative in setup_files(staging, _items(values.get("--sync"))):
        try:
            data = (staging / relative).read_bytes()  # agentbox's own files, each small (a manifest: 100 bytes a file)
        except FileNotFoundError:
            digest.update(f"{relative}\0absent\0".encode())
            continue
        digest.update(f"{relative}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def _items(value: OptionValue) -> list[str]:
    """An option's values as a list: a string is one, a sequence its items, a flag or nothing none."""
    return [value] if isinstance(value, str) else [str(item) for item in value] if isinstance(value, Sequence) else []
