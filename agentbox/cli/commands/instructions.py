"""`agentbox instructions`: the held changes to the files that steer an agent; list, diff, approve, reject.

The quarantine itself is agentbox.review.quarantine; this parses, asks it and prints.
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path

import click

from agentbox import tables
from agentbox.cli.commands.common import load_config
from agentbox.errors import AgentboxError, ConfigError
from agentbox.review import instructionfiles, quarantine
from agentbox.review.instructionscan import FILE, LINK, Entry
from agentbox.safetext import visible
from agentbox.tasks.activity import ProjectActivity

MAX_DIFF_TEXT = 64 * 1024  # bytes of a version shown as text in a diff; a larger one is named


@click.group("instructions", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True,
              help='Print [{"file", "change", "held", "approved", "when", "by"}].')
@click.pass_context
def instructions_group(ctx: click.Context, as_json: bool) -> None:
    """List the held changes to the files that steer an agent (CLAUDE.md, .claude/, ...)."""
    if ctx.invoked_subcommand is not None:
        return
    workspace = _looked_at(ctx)
    found = quarantine.held(workspace)
    if as_json:
        click.echo(json.dumps([{"file": item.label, "change": item.kind, "held": _what(item.held),
                                "approved": _what(item.approved), "when": item.when, "by": item.by}
                               for item in found], indent=2, ensure_ascii=False))
        return
    if not found:
        click.echo(f"No changes to the instruction files of {visible(str(workspace))} are held.", err=True)
        return
    rows = [("FILE", "CHANGE", "HELD VERSION", "WHEN", "BY")]
    rows += [(visible(item.label), item.kind, _what(item.held), tables.local_time(item.when), visible(item.by))
             for item in found]
    tables.echo(rows, flexible=(2, 4, 0))
    click.echo("Agents see the approved versions. `agentbox instructions diff` shows the changes; "
               "`approve` or `reject` decides them.", err=True)


@instructions_group.command("diff")
@click.argument("paths", nargs=-1)
@click.pass_context
def diff_command(ctx: click.Context, paths: tuple[str, ...]) -> None:
    """Show each held change as a diff from the approved version to the held one."""
    workspace = _looked_at(ctx)
    for item in _chosen(workspace, paths):
        before, after = _text(workspace, item.approved), _text(workspace, item.held)
        lines = [f"{item.kind} {visible(item.label)} (by {visible(item.by)})"]
        if before is None or after is None:
            lines.append(f"  approved: {_what(item.approved)}; held: {_what(item.held)}; no diff shown")
        lines += [visible(line, keep_tab=True) for line in difflib.unified_diff(
            before or [], after or [], fromfile=f"{item.label} (approved)", tofile=f"{item.label} (held)",
            lineterm="")]
        click.echo("\n".join(lines))


@instructions_group.command("approve")
@click.argument("paths", nargs=-1)
@click.pass_context
def approve_command(ctx: click.Context, paths: tuple[str, ...]) -> None:
    """Approve held changes (all, or those named): the held version goes into the workspace."""
    workspace = _looked_at(ctx)
    chosen = _chosen(workspace, paths)
    for item in chosen:
        if item.held is not None and item.held.kind not in (FILE, LINK):
            raise AgentboxError(f"cannot approve {visible(item.label)}: the held version is {item.held.describe()}, "
                                "of which agentbox keeps no copy",
                                hint=f"Reject it (`agentbox instructions reject {visible(item.label)}`) and write the "
                                "file you want on the host: your own edits count as approved.")
    _decided(workspace, chosen, approve=True)


@instructions_group.command("reject")
@click.argument("paths", nargs=-1)
@click.pass_context
def reject_command(ctx: click.Context, paths: tuple[str, ...]) -> None:
    """Drop held changes (all, or those named): the workspace keeps the approved version."""
    workspace = _looked_at(ctx)
    _decided(workspace, _chosen(workspace, paths), approve=False)


def _looked_at(ctx: click.Context) -> Path:
    """The project's workspace, its instruction files checked first, every folder walked (a task's changes are held
    now; an instruction file you added in a subfolder while nothing of the project ran is taken as yours)."""
    loaded = load_config(ctx)
    workspace = loaded.require_workspace()
    files = instructionfiles.quarantined(loaded)
    if files:
        quarantine.start(workspace, files, ProjectActivity.of(loaded), None, discover=True)
    return workspace


def _chosen(workspace: Path, paths: tuple[str, ...]) -> list[quarantine.Held]:
    """The held changes named (a file, or a folder for everything held in it), all when none is named."""
    found = quarantine.held(workspace)
    if not paths:
        return found
    chosen: dict[str, quarantine.Held] = {}
    for path in paths:
        label = _label(workspace, path)
        matched = [item for item in found if item.label == label or item.label.startswith(label.rstrip("/") + "/")]
        if not matched:
            held = quarantine.names(item.label for item in found) or "none"
            raise ConfigError(f"{visible(path)}: no change to it is held in {visible(str(workspace))}",
                              hint=f"Held now: {held}. `agentbox instructions` lists them.")
        chosen.update({item.label: item for item in matched})
    return list(chosen.values())


def _label(workspace: Path, path: str) -> str:
    """A path as given (relative to the current folder, or as the list names it) as the workspace's label."""
    full = Path(os.path.abspath(path))
    for root in (workspace, Path(os.path.realpath(workspace))):
        try:
            return full.relative_to(root).as_posix()
        except ValueError:
            continue
    return path.strip("/")


def _decided(workspace: Path, chosen: list[quarantine.Held], approve: bool) -> None:
    if not chosen:
        click.echo("No changes to instruction files are held.", err=True)
        return
    decided = quarantine.decide(workspace, [item.label for item in chosen], approve)
    for item in decided.done:
        if approve:
            click.echo(f"Approved {visible(item.label)} ({item.kind}): the workspace has the held version.", err=True)
        else:
            click.echo(f"Rejected {visible(item.label)} ({item.kind}): the workspace keeps the approved version.",
                       err=True)
    for label, targets in decided.imports.items():
        if targets.inside:
            click.echo(f"{visible(label)} imports {quarantine.names(targets.inside)}: an agent reads them with it, "
                       "so their changes are held too.", err=True)
        if targets.outside:
            click.echo(f"{visible(label)} imports {quarantine.names(targets.outside)}, outside the workspace: "
                       "agentbox does not watch them.", err=True)
    if decided.imported:
        click.echo(f"Held now: {quarantine.names(item.label for item in decided.imported)}, which the approved "
                   "version newly imports and agentbox had not held (a session may have written it); review it: "
                   "`agentbox instructions diff`.", err=True)
    if decided.problems:
        raise AgentboxError("; ".join(decided.problems), hint="Fix the path on the host and run the command again.")


def _what(entry: Entry | None) -> str:
    return "absent" if entry is None else entry.describe()


def _text(workspace: Path, entry: Entry | None) -> list[str] | None:
    """A version's lines for a diff (absent: none); None when it is no text agentbox kept."""
    if entry is None:
        return []
    if entry.kind != FILE:
        return None
    data = quarantine.blob(workspace, entry.value)
    if data is None or len(data) > MAX_DIFF_TEXT or b"\0" in data:
        return None
    return data.decode("utf-8", "replace").removesuffix("\n").split("\n")
