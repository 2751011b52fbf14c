"""`agentbox undo`: what it takes to put the workspace back to a checkpoint, and the report of what it did.

The plan compares the checkpoint's tree with a snapshot of the workspace as it is now
(hostgit.changes): a file deleted, modified or changed in type since the checkpoint gets the
checkpoint's content back; a file created since is removed only with --clean. A file missing from
the snapshot but present on disk was not captured (ignored, say, since the agent edited
.gitignore): it is left in place. Files larger than the size limit in either snapshot were never
compared, and submodules are not restored; the report says so. restore.py does the writing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from agentbox.errors import UsageError
from agentbox.git import store
from agentbox.review import restore
from agentbox.safetext import visible

_KINDS = {"100644": restore.FILE, "100755": restore.EXECUTABLE, "120000": restore.SYMLINK}
GITLINK = "160000"


class Plan(NamedTuple):
    operations: list[restore.Operation]
    created: list[str]  # created since the checkpoint and left in place (no --clean)
    submodules: list[str]  # gitlinks (submodules, nested repositories): never restored
    not_compared: list[tuple[str, int]]  # (path, size): larger than the limit in a snapshot


def workspace_paths(workspace: Path, cwd: Path, given: Iterable[str]) -> list[str]:
    """--paths as paths relative to the workspace (given relative to cwd, or absolute); never
    resolving a link, since the agent may have made one. Raises UsageError for one outside it."""
    result = []
    for path in given:
        absolute = os.path.normpath(os.path.join(cwd, path))
        relative = os.path.relpath(absolute, workspace)
        if relative == ".":
            raise UsageError(f"--paths {visible(path)} is the whole workspace",
                             hint="Leave --paths out to undo every change.")
        if relative.split("/")[0] == "..":
            problem: str | None = f"it is outside the workspace {visible(str(workspace))}"
        else:
            problem = restore.path_problem(relative)
        if problem:
            raise UsageError(f"--paths {visible(path)}: {problem}")
        result.append(relative)
    return result


def plan(repo: store.Repo, checkpoint_tree: str, current_tree: str, skipped: Iterable[tuple[str, int]],
         paths: list[str] | None, clean: bool) -> Plan:
    """What undo does to bring the workspace from current_tree back to checkpoint_tree.

    skipped: the files too large to capture in either snapshot; they are left alone.
    """
    not_compared = sorted({(path, size) for path, size in skipped if _within(path, paths)})
    left_alone = {path for path, _ in not_compared}
    operations: list[restore.Operation] = []
    created: list[str] = []
    submodules: list[str] = []
    to_read = []
    for change in store.changes(repo, checkpoint_tree, current_tree, paths):
        if change.path in left_alone:
            continue
        if GITLINK in (change.old_mode, change.new_mode):
            submodules.append(change.path)
        elif change.status == "A":
            if clean:
                operations.append(restore.Operation(restore.REMOVE, change.path))
            else:
                created.append(change.path)
        else:
            to_read.append(change)
    blobs = store.read_blobs(repo, [change.old_oid for change in to_read]) if to_read else {}
    for change in to_read:
        # Deleted since: anything there now was not captured (an ignored file), so it stays.
        operations.append(restore.Operation(_KINDS[change.old_mode], change.path, blobs[change.old_oid],
                                            overwrite=change.status != "D"))
    # A file or link created where the checkpoint has a folder goes anyway: restore replaces it.
    needed = restore.folders_of(change.path for change in to_read)
    return Plan(operations, [path for path in created if path not in needed], submodules, not_compared)


def _what_is_there(kind: str) -> str:
    if kind == "a folder":
        return "a folder is there now"
    return f"{kind} is there now that no snapshot captured, an ignored one perhaps"


def _within(path: str, paths: list[str] | None) -> bool:
    return paths is None or any(path == p or path.startswith(p + "/") for p in paths)


def report(result: restore.Result, todo: Plan, target: str, dry_run: bool) -> list[str]:
    """The lines that tell the user what happened (or would happen), names escaped."""
    lines = []
    done = [change for change in result.changes if change.action != restore.LEFT_IN_PLACE]
    kept = [change for change in result.changes if change.action == restore.LEFT_IN_PLACE]
    if dry_run:
        lines.append(f"Dry run: undo to {target} would make these changes (nothing was changed):"
                     if done else f"Dry run: undo to {target} would change no file.")
    else:
        lines.append(f"Undo to {target}:" if done else f"Undo to {target}: no file needed restoring.")
    width = max((len(change.action) for change in done), default=0)
    for change in done:
        detail = f" ({visible(change.detail)})" if change.detail else ""
        lines.append(f"  {change.action:<{width}}  {visible(change.path)}{detail}")
    if kept:
        lines.append("Not restored, left in place (remove it yourself and undo again to restore it):")
        lines.extend(f"  {visible(change.path)} ({_what_is_there(change.detail)})" for change in kept)
    if todo.created:
        lines.append(f"Created since {target}, left in place (use --clean to remove):")
        lines.extend(f"  {visible(path)}" for path in todo.created)
    if todo.submodules:
        lines.append("Submodules or nested repositories, not restored:")
        lines.extend(f"  {visible(path)}" for path in todo.submodules)
    if todo.not_compared:
        lines.append("Not compared (larger than checkpoints.maxFileSize in a snapshot, never captured):")
        lines.extend(f"  {visible(path)} ({size:,} bytes)" for path, size in todo.not_compared)
    if result.failures:
        lines.append("Failed:" if not dry_run else "Would fail:")
        lines.extend(f"  {visible(failure.path)}: {visible(failure.reason)}" for failure in result.failures)
    return lines
