"""What an isolated task's VM gets of the workspace: git bundles of agentbox's store, one chain per place.

A place (this machine's VM, or a VM on a remote host) keeps the bundles agentbox sent it in a staging folder
(`bundles/`, read-only in the VM); its runner fetches them, in order, into a cache repository of its own and
makes the task's copy from the last one's commit. Each commit sent holds the checkpoint's tree; its parent is
the commit sent to that place before (so `git bundle create F NEW ^OLD` holds only what changed: git computes
a bundle's delta from history, not from trees). The first of a chain has no parent and holds everything.

agentbox records, per workspace and place, the chain it sent (`<workspace state dir>/task-bundles.json`) and
keeps the tip as a ref of its store (`refs/agentbox/sent/PLACE`). A chain whose files or tip are gone, or that
grew past MAX_CHAIN, starts again with a whole bundle.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import fsutil, lazyre, paths
from agentbox.fsutil import atomic_write, private_dir
from agentbox.git import store

RECORD = "task-bundles.json"
FOLDER = "bundles"  # in the staging folder
MAX_CHAIN = 20
MESSAGE = "agentbox: the workspace for an isolated task\n"
_PLACE = lazyre.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_NAME = lazyre.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})\.bundle")


class Staged(NamedTuple):
    """What a task's spec names: the commit its copy starts from, and the bundles to fetch, in order."""

    base: str
    bundles: list[str]  # file names in the place's bundles/ folder
    written: str | None  # the file written now (None: the place holds that commit already)
    prerequisite: str | None  # the commit the new bundle needs the reader to have (None: a whole bundle)


def place_name(where: str, vm_name: str) -> str:
    """A VM as a place (a ref's last part): `local-VM` for this machine's, `HOST-VM` for one on a host."""
    return (where + "-" + "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in vm_name))[:100]


def stage(repo: store.Repo, place: str, tree: str, folder: Path, tidy: bool = False) -> Staged:
    """Make sure the place's bundles/ folder (`folder`, on this machine: written here, or sent on by the caller)
    holds a commit of tree, adding a bundle when it does not (a chain whose files are gone from folder starts
    again). `tidy`: remove the bundles of an earlier chain (only when no task of the place may still fetch them)."""
    if not _PLACE.fullmatch(place):
        raise ValueError(f"not a place name for a ref: {place!r}")

    def has(name: str) -> bool:
        return (folder / name).is_file()

    workspace = repo.work_tree
    ref = f"refs/agentbox/sent/{place}"
    with fsutil.locked(private_dir(paths.workspace_state_dir(workspace)) / "task-bundles.lock"):
        record = _read(workspace)
        chain: list[dict[str, str]] = list(record.get(place, {}).get("chain", []))
        retired: list[str] = list(record.get(place, {}).get("retired", []))
        if chain and (not all(has(link["file"]) for link in chain) or store.resolve(repo, ref) != chain[-1]["commit"]
                      or len(chain) >= MAX_CHAIN):
            retired += [link["file"] for link in chain]
            chain = []
        if chain and store.tree_of(repo, chain[-1]["commit"]) == tree:
            return Staged(chain[-1]["commit"], [link["file"] for link in chain], None, None)
        parent = chain[-1]["commit"] if chain else None
        commit = store.chain_commit(repo, tree, parent, MESSAGE)
        name = f"{commit}.bundle"
        private_dir(folder)
        partial = folder / f".{name}.partial"
        partial.unlink(missing_ok=True)
        store.bundle(repo, partial, ref, commit, parent)
        os.replace(partial, folder / name)
        chain.append({"commit": commit, "file": name})
        keep = {link["file"] for link in chain}
        if tidy:  # the bundles of this workspace's earlier chains (another workspace's are not ours to remove)
            for old in retired:
                if old not in keep and _NAME.fullmatch(old):
                    (folder / old).unlink(missing_ok=True)
            retired = []
        record[place] = {"chain": chain, "retired": [old for old in retired if old not in keep]}
        atomic_write(_path(workspace), json.dumps(record, indent=1) + "\n", mode=0o600)
    return Staged(commit, [link["file"] for link in chain], name, parent)


def _path(workspace: Path) -> Path:
    return paths.workspace_state_dir(workspace) / RECORD


def _read(workspace: Path) -> dict[str, Any]:
    try:
        data = json.loads(_path(workspace).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
