"""`agentbox report [ID | --last] [--json]`, `report export --since DATE`, `report verify`: the signed reports
sessions and tasks leave (agentbox.session.endreport, agentbox.review.reportchain).

Everything is read from the host's state folder; no limactl call. A report file that does not parse is named
(never a traceback) by every sub-command; what the agent wrote (paths, refs, hosts) is printed escaped.
"""

from __future__ import annotations

import datetime
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from agentbox import sizes, tables
from agentbox.cli.commands.common import load_config
from agentbox.errors import StateError, UsageError
from agentbox.fsutil import atomic_write
from agentbox.progress import say, warn
from agentbox.review import checkpoints, reportchain, reportcheck
from agentbox.safetext import visible

LISTED = 20


class _Reports(click.Group):
    """A group whose first argument, when it is not a sub-command, is a report's ID."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = [index for index, arg in enumerate(args) if not arg.startswith("-")]
        if words and args[words[0]] not in self.commands:  # the group's options are flags: no value to skip
            ctx.meta["report_id"] = args[words[0]]
            args = args[:words[0]] + args[words[0] + 1:]
        return super().parse_args(ctx, args)


@click.group("report", cls=_Reports, invoke_without_command=True, options_metavar="[ID | --last] [--json]",
             subcommand_metavar="[export | verify]")
@click.option("--last", is_flag=True, help="Show this project's newest report.")
@click.option("--json", "as_json", is_flag=True, help="Print the record(s) as JSON, as signed.")
@click.option("--all", "show_all", is_flag=True, help="List the reports of every project, not only this one's.")
@click.pass_context
def report_group(ctx: click.Context, last: bool, as_json: bool, show_all: bool) -> None:
    """The signed report each session and background task leaves when it ends.

    Without ID: this project's recent reports as a table (outside a project, or with --all, every project's).
    With ID (or --last): one report: agent, VM, mode, times, exit code, checkpoints and files changed, proposal,
    network and broker summaries, tripwire findings, held instruction changes. See docs/reports.md.
    """
    if ctx.invoked_subcommand is not None:
        return
    wanted = ctx.meta.get("report_id")
    if wanted and last:
        raise UsageError("give a report's ID or --last, not both", hint="`agentbox report --last`")
    workspace = _workspace(ctx, settle=True)
    if wanted or last:
        record = _find(wanted) if wanted else _newest(workspace)
        click.echo(json.dumps(record, indent=2) if as_json else "\n".join(describe(record)))
        return
    listed = list(itertools.islice(_records(workspace if not show_all else None), LISTED))
    if as_json:
        click.echo(json.dumps(listed, indent=2))
        return
    _table(listed, workspace if not show_all else None)


@report_group.command("export")
@click.option("--since", "since", required=True, metavar="DATE",
              help="The first day (YYYY-MM-DD, UTC) or moment (ISO 8601) whose reports are written.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file (made 0600) instead of stdout.")
def export_command(since: str, output: Path | None) -> None:
    """Write every project's reports since DATE as JSON Lines (one signed record a line), for a SIEM; exit 1 when
    a report file could not be read (it is named; the others are written)."""
    start = parse_since(since)
    lines, bad = [], 0
    for _, found in reportchain.newest_first():
        if isinstance(found, reportchain.Corrupt):
            _warn_corrupt(found)
            bad += 1
        elif _when(found) >= start:
            lines.append(json.dumps(found, sort_keys=True))
    text = "".join(line + "\n" for line in reversed(lines))
    if output is None:
        click.echo(text, nl=False)
    else:
        atomic_write(output, text, mode=0o600)
        say(f"wrote {len(lines)} report(s) to {output}")
    if bad:
        sys.exit(1)


@report_group.command("verify")
def verify_command() -> None:
    """Check every report: its signature, the chain of hashes, that none is missing and the newest are all there;
    say where it breaks and exit 1, or exit 0 with a one-line summary."""
    verdict = reportcheck.verify()
    if verdict.problems:
        for problem in verdict.problems:
            click.echo(visible(problem))
        warn(f"the report chain is broken ({len(verdict.problems)} problem(s) in {verdict.checked} record files, "
             f"{reportchain.folder()})")
        sys.exit(1)
    if not verdict.checked:
        click.echo("no reports yet: nothing to verify")
        return
    click.echo(f"all {verdict.checked} reports verified: signatures, chain and head intact ({reportchain.folder()})")


def parse_since(text: str) -> str:
    """DATE as the ISO 8601 UTC time records carry ("%Y-%m-%dT%H:%M:%SZ"); exit 2 when it is neither form."""
    try:
        if len(text) == 10:
            moment = datetime.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=datetime.timezone.utc)
        else:
            moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise UsageError(f"--since {visible(text)!r} is not a date",
                         hint="Give a day as YYYY-MM-DD (UTC), e.g. 2026-11-30, or an ISO 8601 time, e.g. "
                              "2026-11-30T14:00:00Z or 2026-11-30T15:00+01:00.") from None
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _workspace(ctx: click.Context, settle: bool) -> str | None:
    """This project's workspace (None outside a project); a live session's report may wait for its end
    checkpoint, which completes it (agentbox.session.endreport)."""
    loaded = load_config(ctx, describe=True)
    if loaded.workspace_problem:
        return None
    if settle:
        checkpoints.settle(loaded.workspace)
    return str(loaded.workspace)


def _records(workspace: str | None) -> Iterator[dict[str, Any]]:
    for _, found in reportchain.newest_first():
        if isinstance(found, reportchain.Corrupt):
            _warn_corrupt(found)
        elif workspace is None or found.get("workspace") == workspace:
            yield found


def _find(wanted: str) -> dict[str, Any]:
    seqs = reportchain.sequence_numbers()
    seq = int(wanted.split("-", 1)[0]) if wanted.split("-", 1)[0].isdigit() else None
    if seq is None or seq not in seqs:
        raise StateError(f"there is no report {visible(wanted)}", hint="`agentbox report` lists this project's "
                         "reports, `agentbox report --all` every project's.")
    try:
        record = reportchain.load(seq)
    except reportchain.Corrupt as corrupt:
        raise StateError(f"the report file {corrupt.path} cannot be read: {corrupt.why}",
                         hint="`agentbox report verify` checks every report.") from None
    if "-" in wanted and record.get("id") != wanted:
        raise StateError(f"there is no report {visible(wanted)} (report {seq} is {visible(str(record.get('id')))})")
    return record


def _newest(workspace: str | None) -> dict[str, Any]:
    for record in _records(workspace):
        return record
    where = f"for {visible(workspace)}" if workspace else "on this host"
    raise StateError(f"no report {where} yet",
                     hint="A report is written when a session or a background task ends.")


def _warn_corrupt(corrupt: reportchain.Corrupt) -> None:
    warn(f"the report file {corrupt.path} is not a report ({corrupt.why}); `agentbox report verify` checks them all")


def _when(record: dict[str, Any]) -> str:
    return str(record.get("ended") or record.get("started") or "")


def _table(listed: list[dict[str, Any]], workspace: str | None) -> None:
    if not listed:
        say(f"no reports for {visible(workspace)} yet" if workspace else "no reports yet")
        return
    header = ["ID", "ENDED", "AGENT", "KIND", "EXIT", "FILES", "REFUSED", "TRIPWIRE"]
    rows = [header + ([] if workspace else ["WORKSPACE"])]
    for record in listed:
        rows.append([str(record.get("seq", "?")), tables.local_time(_when(record)) if record.get("ended") else
                     "running", visible(str(record.get("agent") or "-")), _kind(record), _exit(record),
                     _files_count(record), str(_refused(record)), str(len(_tripwire(record)) or "-")]
                    + ([] if workspace else [visible(str(record.get("workspace", "?")))]))
    tables.echo(rows, flexible=(-1, 2) if not workspace else (2,), right=(0, 4, 5, 6, 7))


def _kind(record: dict[str, Any]) -> str:
    if record.get("kind") == "task":
        return f"task {record.get('task')}"
    mode = _part(record, "mode")
    return "isolated" if mode.get("work") == "isolated" else "kept" if record.get("kept") else "session"


def _exit(record: dict[str, Any]) -> str:
    code = record.get("exitCode")
    return "-" if code is None else str(code)


def _files_count(record: dict[str, Any]) -> str:
    files = record.get("files")
    if not isinstance(files, dict):
        return "-"
    return str(sum(int(files.get(key, 0) or 0) for key in ("added", "modified", "removed")))


def _refused(record: dict[str, Any]) -> int:
    network = _part(record, "network")
    return sum(int(network.get(key, 0) or 0) for key in ("denials", "leaks", "uploadCapRefusals"))


def _tripwire(record: dict[str, Any]) -> list[dict[str, Any]]:
    found = record.get("tripwire")
    changed = found.get("changed") if isinstance(found, dict) else None
    return [item for item in changed if isinstance(item, dict)] if isinstance(changed, list) else []


def describe(record: dict[str, Any]) -> list[str]:
    """A record for people, every agent-written value escaped."""
    mode = _part(record, "mode")
    what = f"task {record.get('task')}" if record.get("kind") == "task" else "session"
    lines = [f"report {record.get('seq')} ({record.get('id')}): {what} of {record.get('agent') or '?'} in "
             f"{record.get('vm')}, {record.get('state')}",
             f"  workspace:    {record.get('workspace')}",
             f"  mode:         {mode.get('work', '?')}, network {mode.get('network') or 'unknown'}"
             + (", kept (detached)" if record.get("kept") else ""),
             f"  started:      {record.get('started')}   ended: {record.get('ended') or '-'}   exit code: "
             f"{_exit(record)}"]
    points = _part(record, "checkpoints")
    lines.append(f"  checkpoints:  start {_label(points.get('start'))}, end {_label(points.get('end'))}")
    lines.append(f"  files:        {_files_words(record.get('files'))}")
    proposal = record.get("proposal")
    lines.append("  proposal:     " + (f"{proposal.get('id')} ({proposal.get('files')} files)"
                                      if isinstance(proposal, dict) else "none"))
    lines += _network_lines(record.get("network"))
    lines += _broker_lines(record.get("broker"))
    changed = _tripwire(record)
    lines.append("  tripwire:     " + (", ".join(f"{item.get('path')} ({item.get('change')})" for item in changed)
                                      if changed else "nothing the host runs changed"))
    held = record.get("heldInstructions")
    lines.append("  instructions: " + (f"held: {', '.join(map(str, held))}" if held else "no change held"))
    return [visible(line) for line in lines]


def _label(checkpoint: Any) -> str:
    return f"#{checkpoint}" if checkpoint is not None else "-"


def _files_words(files: Any) -> str:
    if not isinstance(files, dict):
        return "not known (no checkpoints for this workspace)"
    counts = f"{files.get('added', 0)} added, {files.get('modified', 0)} modified, {files.get('removed', 0)} removed"
    paths = [str(path) for path in files.get("paths", []) if isinstance(files.get("paths"), list)]
    more = f" and {files.get('more')} more" if files.get("more") else ""
    return counts + (f": {', '.join(paths)}{more}" if paths else "")


def _network_lines(network: Any) -> list[str]:
    if not isinstance(network, dict):
        return ["  network:      not known"]
    hosts = _items(network, "hosts")
    lines = [f"  network:      {network.get('requests', 0)} request(s) to {len(hosts)} host(s), "
             f"{sizes.shown(int(network.get('up', 0) or 0))} up, {sizes.shown(int(network.get('down', 0) or 0))} "
             f"down; {network.get('denials', 0)} denied, {network.get('leaks', 0)} attempted leak(s), "
             f"{network.get('uploadCapRefusals', 0)} refused at the upload cap"]
    for row in hosts[:10]:
        if isinstance(row, dict):
            lines.append(f"    {row.get('host')}: {row.get('requests')} request(s), "
                         f"{sizes.shown(int(row.get('up', 0) or 0))} up, {sizes.shown(int(row.get('down', 0) or 0))}"
                         " down")
    return lines


def _broker_lines(broker: Any) -> list[str]:
    if not isinstance(broker, dict):
        return ["  broker:       not known"]
    pushed = _items(broker, "pushes")
    lines = [f"  broker:       {broker.get('substitutions', 0)} substitution(s), {broker.get('refusals', 0)} "
             f"refused, {len(pushed)} push(es)"]
    for push in pushed:
        if isinstance(push, dict):
            lines.append(f"    push {push.get('outcome')}: {', '.join(map(str, push.get('refs') or []))}")
    return lines


def _part(record: dict[str, Any], key: str) -> dict[str, Any]:
    found = record.get(key)
    return found if isinstance(found, dict) else {}


def _items(record: dict[str, Any], key: str) -> list[Any]:
    found = record.get(key)
    return found if isinstance(found, list) else []
