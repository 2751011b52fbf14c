"""Safety commands: `trust` (use this project's agentbox.yml) and `audit` (changes to files the host runs)."""

from __future__ import annotations

import json

import click

from agentbox.cli.commands.common import load_config
from agentbox.config import trust
from agentbox.config.load import Config
from agentbox.errors import AgentboxError
from agentbox.review import tripwire
from agentbox.tasks.activity import ProjectActivity


@click.command("trust")
@click.option("--show", is_flag=True, help="Print what would be trusted (a diff against the last trusted content).")
@click.pass_context
def trust_command(ctx: click.Context, show: bool) -> None:
    """Trust this project's agentbox.yml as it is now."""
    loaded = load_config(ctx)
    if loaded.local_file is None:
        raise AgentboxError("there is no agentbox.yml here to trust", hint="The global config is always trusted.")
    risky = trust.risky_keys(loaded)
    if show:
        click.echo(trust.show(loaded), nl=False)
        if risky:
            click.echo("# keys that need trust:\n" + "".join(f"#   {item}\n" for item in risky), nl=False)
        else:
            click.echo("# nothing in it needs trust: agentbox uses it as it is.")
        return
    trust.trust(loaded)
    acknowledge_trusted(loaded)
    click.echo(
        f"Trusted {loaded.local_file} as it is now, with the files and folders it names; an edit of any of them, "
        "or a path that comes to point elsewhere, revokes the trust.",
        err=True,
    )


@click.command("audit")
@click.option("--ack", is_flag=True, help="Accept the changes: the files as they are now become the reference.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"workspace", "recorded", "changes": [{"file", "change", "note", "before", "now", "diff"}], '
                   '"yours": [files changed while nothing of the project ran]}.')
@click.pass_context
def audit_command(ctx: click.Context, ack: bool, as_json: bool) -> None:
    """Show unacknowledged changes to files your host runs (git hooks, .envrc); exit 1 while there are any."""
    if ack and as_json:
        raise click.UsageError("--ack and --json do not go together")
    loaded = load_config(ctx)
    workspace = loaded.require_workspace()
    if ack:
        count = tripwire.acknowledge(workspace)
        files = f"{count} changed watched file{'s' if count != 1 else ''}"
        click.echo(f"Accepted {files} of {workspace}; later changes are compared with the files as they are now.",
                   err=True)
        return
    activity = ProjectActivity.of(loaded)
    found = tripwire.audit(workspace, activity)
    if as_json:
        click.echo(json.dumps({"workspace": str(workspace), "recorded": found is not None,
                               "changes": tripwire.audit_records(found or []),
                               "yours": [change.label for change in tripwire.yours(workspace, activity)]},
                              indent=2, ensure_ascii=False))
        ctx.exit(1 if found else 0)
    tripwire.report_yours(tripwire.yours(workspace, activity))
    if found is None:
        click.echo(f"No session has been recorded for {workspace} yet; nothing to compare.", err=True)
        return
    if found:
        tripwire.report_audit(found, workspace)
        ctx.exit(1)
    click.echo(f"No unacknowledged changes to the watched files of {workspace}.", err=True)


def acknowledge_trusted(loaded: Config) -> None:
    """`agentbox trust` is the user's word on the file it trusts: the tripwire takes it as it is now."""
    if loaded.local_file is not None and not loaded.workspace_problem:
        tripwire.acknowledge_file(loaded.workspace, loaded.local_file)
