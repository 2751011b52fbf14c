"""Moving checkpoints of the old kind (commits in the workspace's own repository) into agentbox's store, once.

Until record version 2, checkpoint commits were written into the workspace's `.git` with refs under
refs/agentbox/checkpoints. Their trees and files are read back by agentbox itself (agentbox.git.read:
no-follow reads, every object checked against its id) and written into the store, where each gets a
commit of its own; an entry whose objects cannot be read that way (gone, or altered by the agent) is
dropped. The old refs are left where they are: agentbox writes nothing under a workspace's `.git`.
What happened is said in one line.
"""

from __future__ import annotations

from typing import Any

from agentbox.git import read
from agentbox.git import store as hostgit
from agentbox.progress import note

REF_PREFIX = "refs/agentbox/checkpoints"
MAX_OBJECT = 1 << 30


def move(repo: hostgit.Repo, data: dict[str, Any]) -> dict[str, Any]:
    """The record of version 1 `data` as a version-2 record whose checkpoints live in the store."""
    store = hostgit.init_store(repo)
    fmt = hostgit.store_format(repo)
    reader = read.ObjectReader(repo.common_dir, fmt, max_size=MAX_OBJECT)
    copied: set[str] = set()
    moved = []
    lost = 0
    for entry in data.get("checkpoints", []):
        try:
            kind, content = reader.read(str(entry["commit"]))
            tree = read.commit_tree(content) if kind == "commit" else None
            if tree is None or tree != entry.get("tree"):
                raise read.GitReadError("the commit does not hold the recorded tree")
            _copy_tree(reader, store, tree, fmt, copied)
        except (read.GitReadError, KeyError, TypeError, ValueError):
            lost += 1
            continue
        number = int(entry["id"])
        commit = hostgit.commit(repo, tree, None, f"agentbox checkpoint ({entry.get('kind')}), moved from the "
                                                  f"workspace's repository\n\nold commit: {entry['commit']}\n")
        ref = f"{REF_PREFIX}/{number}"
        hostgit.set_ref(repo, ref, commit)
        moved.append({**entry, "commit": commit, "ref": ref})
    if moved or lost:
        note(f"moved {len(moved)} checkpoint{'s' * (len(moved) != 1)} of {repo.work_tree} into agentbox's own store"
             + (f" ({lost} could not be read back and were dropped)" if lost else "")
             + f"; the old refs {REF_PREFIX}/* stay in the repository (`git for-each-ref --format='delete "
             f"%(refname)' refs/agentbox/ | git update-ref --stdin` removes them)")
    return {**data, "version": 2, "checkpoints": moved}


def import_commit(repo: hostgit.Repo, commit: str) -> str:
    """The tree of a commit of the workspace's repository, copied into the store without its files' contents
    (import_blobs brings those that are needed); read by agentbox, every object checked against its id."""
    fmt = hostgit.store_format(repo)
    reader = read.ObjectReader(repo.common_dir, fmt, max_size=MAX_OBJECT)
    kind, content = reader.read(commit)
    if kind != "commit":
        raise read.GitReadError(f"{commit} is not a commit")
    tree = read.commit_tree(content)
    _copy_tree(reader, hostgit.init_store(repo), tree, fmt, set(), blobs=False)
    return tree


def import_blobs(repo: hostgit.Repo, oids: list[str]) -> None:
    """Files' contents from the workspace's repository into the store (read by agentbox, checked)."""
    fmt = hostgit.store_format(repo)
    reader = read.ObjectReader(repo.common_dir, fmt, max_size=MAX_OBJECT)
    store = hostgit.init_store(repo)
    for oid in dict.fromkeys(oids):
        kind, content = reader.read(oid)
        if kind != "blob":
            raise read.GitReadError(f"{oid} is not a file's content")
        hostgit.write_object(store, b"blob", content, fmt)


def _copy_tree(reader: Any, store: Any, tree: str, fmt: str, copied: set[str], blobs: bool = True) -> None:
    """tree and everything under it into the store (objects already copied are skipped; gitlinks name commits
    of other repositories and are not copied; without blobs, only the trees)."""
    stack = [tree]
    while stack:
        oid = stack.pop()
        if oid in copied:
            continue
        kind, content = reader.read(oid)
        if kind != "tree":
            raise read.GitReadError(f"{oid} is not a tree")
        for mode, _name, child in read.tree_entries(content, fmt):
            if mode == "40000":
                stack.append(child)
            elif blobs and mode != "160000" and child not in copied:
                blob_kind, blob = reader.read(child)
                if blob_kind != "blob":
                    raise read.GitReadError(f"{child} is not a file's content")
                hostgit.write_object(store, b"blob", blob, fmt)
                copied.add(child)
        hostgit.write_object(store, b"tree", content, fmt)
        copied.add(oid)
