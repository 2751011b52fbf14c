"""Proposal commands: `proposals` (list), `review`, `apply`, `reject` (agentbox.review.proposals does the work).

Each first collects what finished isolated sessions left in the outboxes of the workspace's VMs, so a
session whose agentbox was interrupted still becomes a proposal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agentbox import tables
from agentbox.cli.commands.common import load_config, warn_if_untrusted
from agentbox.config import trust
from agentbox.progress import note, say, warn
from agentbox.review import instructionfiles, patchview, proposals
from agentbox.safetext import visible, visible_text

if TYPE_CHECKING:
    from agentbox.config.load import Config

ID = click.argument("proposal_id", metavar="[ID]", required=False)


def _workspace(ctx: click.Context, acts: bool) -> tuple[Config, Path]:
    """The config and workspace, with finished sessions collected. Commands that change something need trust."""
    config = load_config(ctx, describe=not acts)
    if acts:
        trust.require_trust(config)
    else:
        warn_if_untrusted(config)
    workspace = config.require_workspace()
    for vm_name in dict.fromkeys([config.vm_name, *(agent.vm_name for agent in config.agents.values())]):
        for made in proposals.collect(workspace, vm_name):
            if made.proposal is not None:
                note(f"collected from an isolated session of {vm_name}: {made}")
    return config, workspace


def _steers(config: Config) -> Callable[[str], bool]:
    """Whether a path steers an agent: every built-in's instruction files, the shared ones, and those of the agents
    this config defines."""
    custom = [getattr(agent, "instruction_files", ()) for agent in config.agents.values() if not agent.builtin]
    return instructionfiles.matcher(instructionfiles.instruction_files(custom))


@click.command("proposals")
@click.option("--json", "as_json", is_flag=True, help="Print the proposals' records as a JSON array.")
@click.pass_context
def proposals_command(ctx: click.Context, as_json: bool) -> None:
    """List the proposals of isolated sessions in this workspace."""
    _, workspace = _workspace(ctx, acts=False)
    found = proposals.all_proposals(workspace)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found:
        say(f"no proposals for {workspace} (isolated sessions make them: `agentbox <agent> --isolated`)")
        return
    rows = [("ID", "STATUS", "AGENT", "CREATED", "FILES", "LINES", "SUMMARY")]
    for proposal in found:
        rows.append((
            str(proposal["id"]), proposal["status"], visible(str(proposal.get("agent") or "-")),
            tables.local_time(proposal.get("created")),
            str(len(proposal["files"])), f"+{proposal['added']} -{proposal['removed']}",
            _headline(workspace, proposal),
        ))
    tables.echo(rows, flexible=(-1,), right=(4,))


def _headline(workspace: Path, proposal: dict[str, Any]) -> str:
    """The first line of the agent's summary, shown safely (a generated summary has none worth showing)."""
    if proposal.get("problem"):
        return "(apply refuses it: the patch cannot be read)"
    if proposal.get("summary") != "agent":
        return "(no summary from the agent)"
    text = proposals.read_summary(workspace, proposal).decode("utf-8", "replace")
    line = next((line.strip().lstrip("#").strip() for line in text.splitlines() if line.strip()), "")
    return visible(line[:80]) or "-"


@click.command("review")
@ID
@click.pass_context
def review_command(ctx: click.Context, proposal_id: str | None) -> None:
    """Show a proposal: its summary, files (host-run files flagged), what apply would refuse, the patch.

    Without ID, the newest pending proposal. On a terminal every control character is shown escaped;
    piped, the summary and patch are written as they are.
    """
    config, workspace = _workspace(ctx, acts=False)
    proposal = proposals.find(workspace, proposal_id)
    patch = proposals.read_patch(workspace, proposal)
    summary = proposals.read_summary(workspace, proposal)
    flagged = set(proposals.host_exec_paths(workspace, proposal))
    steering = proposals.instruction_entries(proposal, _steers(config))
    left_out = frozenset(path for entry in steering for path in (entry["path"], entry.get("oldPath")) if path)
    refused = proposals.refusals(workspace, proposal, patch, allow_host_exec=False, left_out=left_out)
    header = _review_header(workspace, proposal, flagged, refused, steering)
    front = header.encode("utf-8", "surrogateescape") + summary
    front += b"" if front.endswith(b"\n") else b"\n"
    out = sys.stdout.buffer  # (click.get_binary_stream is deprecated from click 8.5)
    if patchview.is_terminal(out):
        front = visible_text(front.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    out.write(front + b"\n")
    patchview.write(patch, out)  # escaped (and coloured) on a terminal, the exact bytes in a pipe
    proposals.mark_reviewed(workspace, proposal)


def _review_header(workspace: Path, proposal: dict[str, Any], flagged: set[str], refused: list[str],
                   steering: list[dict[str, Any]]) -> str:
    base = proposal["base"]
    head = base.get("head")
    lines = [
        f"proposal {proposal['id']} ({proposal['status']}) from {proposal.get('agent') or 'an agent'}, "
        f"{'task ' + str(proposal['task']) if proposal.get('task') else 'session ' + str(proposal.get('session'))}, "
        f"collected {proposal.get('created')}",
        f"base: {'HEAD ' + head[:12] if head else 'no commit yet'} and the uncommitted files then "
        f"(checkpoint commit {base['commit'][:12]})",
        f"patch: {proposals_patch(workspace, proposal)} (sha256 {proposal.get('patchSha256')})",
        "",
        f"files ({len(proposal['files'])}, +{proposal['added']} -{proposal['removed']} lines):",
    ]
    for entry in proposal["files"]:
        source = f" (from {entry['oldPath']})" if entry.get("oldPath") else ""
        flag = "  <- YOUR HOST RUNS THIS FILE: read it before `apply --allow-host-exec`" if (
            entry["path"] in flagged or entry.get("oldPath") in flagged) else ""
        if entry in steering:
            flag = "  <- STEERS THE NEXT AGENT: left out of `apply` unless `--include-instructions`" + (
                " (and `--allow-host-exec`: your host runs it)" if flag else "")
        lines.append(f"  {entry['status']:<9} {entry['path']}{source}{flag}")
    if steering:
        one = len(steering) == 1
        lines += ["", f"{len(steering)} change{'' if one else 's'} to files that steer the next agent "
                      f"{'is' if one else 'are'} left out of `agentbox apply` unless named:",
                  f"read {'it' if one else 'them'} below, then "
                  f"`agentbox apply {proposal['id']} --include-instructions`"]
    if refused:
        lines += ["", "apply refuses it:", *(f"  - {line}" for line in refused)]
    lines += ["", "summary" + (" (written by agentbox: the agent left none):" if proposal.get("summary") != "agent"
                               else " (written by the agent):"), ""]
    return "\n".join(lines) + "\n"


def proposals_patch(workspace: Path, proposal: dict[str, Any]) -> Path:
    return proposals.patch_path(workspace, proposal)


@click.command("apply")
@ID
@click.option("--check", is_flag=True, help="Only check that it applies; change nothing.")
@click.option("--3way", "three_way", is_flag=True, help="Merge with git's three-way merge (needed when HEAD moved "
              "since the proposal's base); refuses rather than leave conflicts.")
@click.option("--allow-host-exec", is_flag=True, help="Also take changes to files your host runs without asking "
              "(git hooks, Makefiles, .envrc, editor tasks, CI workflows, your agents' hooks...): read them first.")
@click.option("--include-instructions", is_flag=True, help="Also take changes to files that steer an agent "
              "(CLAUDE.md, AGENTS.md, .claude/, .codex/, ...), left out otherwise; of a proposal applied without "
              "them, take them now: read them first.")
@click.pass_context
def apply_command(ctx: click.Context, proposal_id: str | None, check: bool, three_way: bool,
                  allow_host_exec: bool, include_instructions: bool) -> None:
    """Apply a proposal to the workspace (without ID: the newest pending one).

    agentbox checks the patch first (paths out of the tree, .git, symbolic links leaving the tree,
    submodules, files the host runs) and refuses it whole; it takes a checkpoint, so `agentbox undo`
    returns to the workspace as it was. A failure leaves the workspace exactly as it was. Changes to
    the files that steer an agent (its instructions, settings, commands) are left out unless
    --include-instructions.
    """
    config, workspace = _workspace(ctx, acts=True)
    result = proposals.apply(workspace, proposal_id, check_only=check, three_way=three_way,
                             allow_host_exec=allow_host_exec, settings=config.checkpoints,
                             steers=None if include_instructions else _steers(config))
    number, files = result.proposal["id"], result.files
    how = " with a three-way merge" if three_way else ""
    which = "the instruction changes of " if result.proposal.get("instructionsApplied") else ""
    if check:
        say(f"proposal {number} applies{how} to {workspace} ({files} file{'s' if files != 1 else ''}); "
            "nothing was changed")
    else:
        undo = f"; `agentbox undo {result.checkpoint}` returns to it" if result.checkpoint is not None else ""
        say(f"applied {which}proposal {number}{how} to {workspace} ({files} file{'s' if files != 1 else ''}); "
            f"checkpoint {result.checkpoint} holds the workspace as it was before{undo}")
    if result.left_out:
        names = ", ".join(visible(path) for path in result.left_out)
        warn(f"{'would leave' if check else 'left'} out the changes to files that steer the next agent: {names}; "
             f"read them (`agentbox review {number}`), then `agentbox apply {number} --include-instructions` "
             "takes them")


@click.command("reject")
@ID
@click.pass_context
def reject_command(ctx: click.Context, proposal_id: str | None) -> None:
    """Reject a proposal (without ID: the newest pending one). Its files are kept; the VM's copy of the workspace
    is made anew at the next isolated session."""
    _, workspace = _workspace(ctx, acts=True)
    proposal, superseded = proposals.reject(workspace, proposal_id)
    with_it = ""
    if superseded:
        listed = ", ".join(str(number) for number in superseded)
        with_it = (f" and with it proposal{'s' if len(superseded) > 1 else ''} {listed}, which it superseded (it "
                   "held their changes)")
    say(f"rejected proposal {proposal['id']}{with_it}; its files stay in "
        f"{proposals.folder(workspace) / str(proposal['id'])}; the next isolated session starts from your workspace "
        "as it is")
    later = [str(p["id"]) for p in proposals.all_proposals(workspace) if p["status"] == proposals.PENDING
             and p.get("vm") == proposal.get("vm") and p["base"].get("commit") == proposal["base"].get("commit")]
    if later:
        which = f"proposal {later[0]}" if len(later) == 1 else f"proposals {', '.join(later)}"
        note(f"{which} came from the same copy and still hold{'s' if len(later) == 1 else ''} its changes "
             f"(pending): `agentbox reject {later[-1]}` rejects {'it' if len(later) == 1 else 'each'} too")
