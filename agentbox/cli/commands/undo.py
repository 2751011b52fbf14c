"""`agentbox undo`: put the workspace back to a checkpoint, after checkpointing it as it is (so undo can be undone).

Only host git and host files are involved: it works with the VM stopped or absent, and runs no limactl.
"""

from __future__ import annotations

import click

from agentbox.cli.commands.common import load_config, refuse_untrusted_identity
from agentbox.errors import AgentboxError
from agentbox.progress import note


class _UndoCommand(click.Command):
    """`--paths a b c`: every word after --paths up to the next option is a path (click takes one per option)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_paths(args))


def spread_paths(args: list[str]) -> list[str]:
    """args with `--paths a b` written as `--paths a --paths b`; `--` ends the options as usual."""
    result: list[str] = []
    greedy = False
    for index, arg in enumerate(args):
        if arg == "--":
            return result + args[index:]
        if greedy and not arg.startswith("-"):
            result += ["--paths", arg]
            continue
        greedy = arg == "--paths"
        if greedy and (index + 1 == len(args) or args[index + 1].startswith("-")):
            result.append(arg)  # no value: click says so
        elif not greedy:
            result.append(arg)
    return result


@click.command("undo", cls=_UndoCommand)
@click.argument("checkpoint", required=False, default="last", metavar="[CHECKPOINT]")
@click.option("--paths", "paths", multiple=True, metavar="P...",
              help="Only these files or folders (relative to the current folder); give CHECKPOINT before --paths.")
@click.option("--dry-run", is_flag=True, help="Print what undo would change, and change nothing.")
@click.option("--clean", is_flag=True, help="Also remove files created since the checkpoint (ignored files never).")
@click.pass_context
def undo_command(ctx: click.Context, checkpoint: str, paths: tuple[str, ...], dry_run: bool, clean: bool) -> None:
    """Put the workspace's files back to a checkpoint (default: `last`, the start of the last session).

    CHECKPOINT is an id from `agentbox checkpoints` (`12` or `#12`) or `last`. Before changing
    anything, undo checkpoints the workspace as it is, so `agentbox undo ID` with that checkpoint's
    id takes the undo back. Files created since the checkpoint stay unless --clean (implied when
    CHECKPOINT was taken before an undo); files git ignores are never touched.
    """
    # deferred: start-up (checkpoints, restore, rewind, review.scope: only the commands here that use it)
    from agentbox.review import checkpoints, restore, rewind
    from agentbox.review.scope import checkpoint_root

    loaded = load_config(ctx)
    refuse_untrusted_identity(loaded, "the folder undo writes")  # undo needs no trust, but writes where it points
    workspace = checkpoint_root(ctx.obj["cwd"], loaded.require_workspace())
    repo = checkpoints.repo_of(workspace)
    now = None
    if dry_run:
        target, now = checkpoints.lookup_and_current(workspace, checkpoint, loaded.checkpoints)
    else:
        target = checkpoints.lookup(workspace, checkpoint)
    selected = rewind.workspace_paths(repo.work_tree, ctx.obj["cwd"], paths) or None
    described = f"{target.label} ({target.kind}, {checkpoints.local_time(target.time)})"
    before = None
    if now is not None:
        current_tree, current_skipped = now.tree, now.skipped
    else:
        taken = checkpoints.take(workspace, "undo", loaded.checkpoints, message=f"before undo to {target.label}",
                                 protect=frozenset({target.id}))
        before = taken.checkpoint
        for line in taken.notes:
            note(line)
        current_tree, current_skipped = before.tree, before.skipped
        click.echo(f"Checkpoint {before.label} holds the workspace as it was before this undo "
                   f"(`agentbox undo {before.id}` returns to it).")
    if target.kind == "undo" and not clean:
        # Going back to the state before an undo takes that undo back entirely: the files it restored
        # are "created since" this checkpoint and go too (the pre-undo checkpoint just taken keeps them).
        clean = True
        note(f"{target.label} was taken before an undo: files created since it are removed, as with --clean.")
    todo = rewind.plan(repo, target.tree, current_tree, [*target.skipped, *current_skipped], selected, clean)
    result = restore.apply(repo.work_tree, todo.operations, dry_run=dry_run)
    for line in rewind.report(result, todo, described, dry_run):
        click.echo(line)
    count = len(result.failures)
    if count and before is None:
        raise AgentboxError(f"undo to {target.label} would fail for {count} path{'s' if count != 1 else ''} "
                            "(listed above)")
    if count and before is not None:
        raise AgentboxError(
            f"undo to {target.label} could not restore {count} path{'s' if count != 1 else ''} (listed above); "
            "the others were restored",
            hint=f"Checkpoint {before.label} holds the workspace as it was before this undo: "
                 f"`agentbox undo {before.id}` returns to it.",
        )
