"""Review commands: `checkpoint` (take one now), `checkpoints` (list them), `diff` (what changed since one).

None of them needs the VM: they read the workspace on the host through agentbox.git.store and make no
limactl call, so they work with the VM stopped or deleted.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agentbox import sizes, tables
from agentbox.cli.commands.common import load_config
from agentbox.errors import AgentboxError
from agentbox.git import store
from agentbox.progress import note, warn
from agentbox.review import checkpoints, patchview
from agentbox.review.scope import checkpoint_root
from agentbox.safetext import visible

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.git.store import Repo
    from agentbox.review.checkpoints import Checkpoint

MAX_NAMED = 10


@click.command("checkpoint")
@click.option("-m", "--message", default="", help="A note to keep with the checkpoint.")
@click.pass_context
def checkpoint_command(ctx: click.Context, message: str) -> None:
    """Take a checkpoint of the workspace now (a git work tree): tracked and untracked, not ignored, files."""
    config = load_config(ctx)
    workspace = checkpoint_root(ctx.obj["cwd"], config.require_workspace())
    taken = checkpoints.take(workspace, "manual", config.checkpoints, message=message)
    checkpoint = taken.checkpoint
    if checkpoint.skipped:
        warn(f"left out, larger than checkpoints.maxFileSize: {_names(checkpoint.skipped)}")
    for text in taken.notes:
        note(text)
    click.echo(f"checkpoint {checkpoint.label} of {visible(str(workspace))}: {checkpoint.commit}")


@click.command("checkpoints")
@click.option("--json", "as_json", is_flag=True, help="One JSON array with stable fields, for scripts.")
@click.pass_context
def checkpoints_command(ctx: click.Context, as_json: bool) -> None:
    """List the workspace's checkpoints, oldest first, with what changed since the one before."""
    workspace = checkpoint_root(ctx.obj["cwd"], load_config(ctx).require_workspace())
    repo = checkpoints.repo_of(workspace)
    found = checkpoints.load(workspace)
    problems = checkpoints.statuses(repo, found)
    if as_json:
        rows = [{**c.to_json(), "ok": problems[c.id] is None, "problem": problems[c.id]} for c in found]
        click.echo(json.dumps(rows, indent=2))
        return
    if not found:
        click.echo(f"No checkpoints of {workspace} yet: they are taken when a session starts and ends, "
                   "or by `agentbox checkpoint`.", err=True)
        return
    healthy = [c for c in found if problems[c.id] is None]
    pairs = list(itertools.pairwise(healthy))
    counts = dict(zip([new.id for _, new in pairs],
                      store.change_counts(repo, [(old.tree, new.tree) for old, new in pairs]), strict=True))
    _print_table(found, problems, counts)


@click.command("diff")
@click.option("--since", "since", default="last", metavar="CHECKPOINT|last|session|task:ID", show_default=True,
              help="Compare with this checkpoint (`12` or `#12`); `last`: the start of the last session; "
                   "`session`: that session's own changes (its start to its end); `task:ID`: what background "
                   "task ID changed (in its worktree, for a --worktree task).")
@click.option("--stat", is_flag=True, help="A summary per file instead of the patch.")
@click.option("--name-only", is_flag=True, help="Only the names of the changed files.")
@click.argument("paths", nargs=-1, type=click.Path())
@click.pass_context
def diff_command(ctx: click.Context, since: str, stat: bool, name_only: bool, paths: tuple[str, ...]) -> None:
    """Show what changed in the workspace since a checkpoint, untracked files included (ignored ones not)."""
    config = load_config(ctx)
    workspace = checkpoint_root(ctx.obj["cwd"], config.require_workspace())
    pathspec = _pathspec(ctx.obj["cwd"], workspace, paths)
    if since.startswith("task:"):
        # deferred: start-up (tasks.records and what it imports, ~15 ms of `diff`: only a task's range needs it)
        from agentbox.tasks import records

        repo, old_tree, new_tree, skipped = records.diff_range(config, since[len("task:"):])
    else:
        repo = checkpoints.repo_of(workspace)
        old, new_tree, skipped = _range(config, workspace, repo, since)
        old_tree = old.tree
    output = store.diff(repo, old_tree, new_tree, stat=stat, name_only=name_only,
                          binary=not patchview.is_terminal(), paths=pathspec)
    patchview.write(output)
    if skipped:
        note(f"not compared, larger than checkpoints.maxFileSize: {_names(skipped)}")


def _range(config: Config, workspace: Path, repo: Repo, since: str) -> tuple[Checkpoint, str, list[tuple[str, int]]]:
    """The checkpoint to compare from, the tree to compare to, and the files neither side holds for their size."""
    if since == "session":
        start, end = checkpoints.last_session(checkpoints.load(workspace))
        checkpoints.require(repo, start)
        if end is not None:
            checkpoints.require(repo, end)
            return start, end.tree, _union(start.skipped, end.skipped)
        note(f"the last session ({start.session}, started {checkpoints.local_time(start.time)}) has no end "
             "checkpoint (it is still running, or ended abnormally): showing its changes until now")
        now = checkpoints.current(workspace, config.checkpoints)
    else:
        start, now = checkpoints.lookup_and_current(workspace, since, config.checkpoints)
    return start, now.tree, _union(start.skipped, now.skipped)


def _union(*lists: list[tuple[str, int]]) -> list[tuple[str, int]]:
    found: dict[str, int] = {}
    for items in lists:
        for path, size in items:
            found[path] = size
    return sorted(found.items())


def _pathspec(cwd: Path, workspace: Path, paths: tuple[str, ...]) -> list[str] | None:
    """PATHS as the user typed them (relative to the current folder) -> paths in the workspace."""
    if not paths:
        return None
    base = Path(os.path.realpath(cwd))
    root = Path(os.path.realpath(workspace))
    found = []
    for raw in paths:
        full = Path(os.path.normpath(base / raw))
        if full != root and root not in full.parents:
            raise AgentboxError(f"{raw} is outside the workspace {root}", hint="Name files inside the workspace.")
        relative = os.path.relpath(full, root)
        found.append("." if relative == "." else relative)
    return found


def _names(skipped: list[tuple[str, int]]) -> str:
    shown = [f"{visible(path)} ({sizes.shown(size)})" for path, size in skipped[:MAX_NAMED]]
    if len(skipped) > MAX_NAMED:
        shown.append(f"and {len(skipped) - MAX_NAMED} more")
    return ", ".join(shown)


def _print_table(found: list[Checkpoint], problems: dict[int, str | None], counts: dict[int, dict[str, int]]
                 ) -> None:
    rows = [("ID", "TIME", "KIND", "AGENT", "CHANGES", "MESSAGE")]
    for c in found:
        if problems[c.id]:
            changes = "BROKEN"
        elif c.id in counts:
            count = counts[c.id]
            changes = f"+{count.get('A', 0)} ~{count.get('M', 0) + count.get('T', 0)} -{count.get('D', 0)}"
        else:
            changes = ""
        rows.append((c.label, tables.local_time(c.time), c.kind, visible(c.agent or ""), changes,
                     visible(c.message)))
    tables.echo(rows, flexible=(-1,))
    broken = [c for c in found if problems[c.id]]
    for c in broken:
        click.echo(f"{c.label} cannot be used: {problems[c.id]}", err=True)
