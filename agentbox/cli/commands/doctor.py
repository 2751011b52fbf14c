"""`agentbox doctor`: check Lima, the config, the VM, credentials and guards, and say what to fix."""

from __future__ import annotations

import json

import click

from agentbox.cli import diagnosis, verdicts
from agentbox.vm.lima import Lima


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of {check, status, message, hint}.")
@click.pass_context
def doctor_command(ctx: click.Context, as_json: bool) -> None:
    """Check Lima, config, VM, logins and guards; say what to fix.

    Each line is OK, WARN or FAIL; the exit code is 1 when any check fails.
    """
    checks = diagnosis.run(ctx.obj["cwd"], Lima(debug=ctx.obj["debug"]))
    if as_json:
        click.echo(json.dumps([check.to_json() for check in checks], indent=2, ensure_ascii=False))
    else:
        click.echo(verdicts.format_text(checks), nl=False)
    if verdicts.failed(checks):
        ctx.exit(1)
