"""`agentbox base`: the provisioned base VM that new project VMs are cloned from (agentbox.vm.golden)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from agentbox import tables
from agentbox.cli.commands.common import load_config
from agentbox.errors import AgentboxError
from agentbox.progress import say
from agentbox.vm import buildlog, golden
from agentbox.vm.lima import Lima

if TYPE_CHECKING:
    from agentbox.vm.lima import Lima


@click.group("base")
def base_group() -> None:
    """The base VM new project VMs are cloned from: build, list, remove, the last build's log."""


def _lima(ctx: click.Context) -> Lima:
    return Lima(debug=ctx.obj["debug"])


@base_group.command("build")
@click.option("--rebuild", is_flag=True, help="Build it again even when the current base is fresh.")
@click.pass_context
def build_command(ctx: click.Context, rebuild: bool) -> None:
    """Build the current base VM now (a launch builds it when needed)."""
    config = load_config(ctx)
    lima = _lima(ctx)
    with golden.lock() as waited:
        built = golden.ensure(lima, config, verbose=ctx.obj["verbose"], rebuild=rebuild, waited=waited)
    if built.built_now:
        say(f"base VM {built.name} is ready (built now); new project VMs are cloned from it")
        return
    say(f"base VM {built.name} was already built, {_ago(golden.age_days(built.record))}, and is current: nothing to "
        "do (`agentbox base build --rebuild` builds it again)")


def _ago(days: float) -> str:
    if days == float("inf"):
        return "at an unknown time"
    if days < 1 / 24:
        minutes = round(days * 24 * 60)
        return "just now" if minutes < 1 else f"{minutes} minute{'s' if minutes != 1 else ''} ago"
    if days < 1:
        hours = round(days * 24)
        return f"{hours} hour{'s' if hours != 1 else ''} ago"
    return f"{days:.1f} days ago"


@base_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One JSON array, for scripts.")
@click.pass_context
def ls_command(ctx: click.Context, as_json: bool) -> None:
    """List the base VMs: key, when built, age, size, the VMs cloned from it, fresh or stale."""
    config = load_config(ctx)
    rows = golden.listing(_lima(ctx), config)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        say("no base VM yet; the next new project VM builds one (or `agentbox base build`)")
        return
    table = [("KEY", "STATE", "BUILT", "AGE", "SIZE", "USED BY")]
    for row in rows:
        age = "-" if row["ageDays"] is None else f"{row['ageDays']:.1f}d"
        size = "-" if row["size"] is None else _human(row["size"])
        used = ", ".join(row["usedBy"]) or "-"
        state = row["state"] + ("*" if row["current"] else "")
        table.append((row["key"], state, tables.local_time(row["built"]), age, size, used))
    tables.echo(table, flexible=(-1,), right=(3, 4))
    if any(row["current"] for row in rows):
        click.echo("* the current base: new VMs are cloned from it")


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}GiB"


@base_group.command("log")
def log_command() -> None:
    """Print the log of the last base build: each step's output, and a failed build's provisioning log."""
    text = buildlog.shown()  # what came from the VM, made safe to print
    if text is None:
        raise AgentboxError(f"no base build has been logged yet ({buildlog.path()} does not exist)",
                            hint="`agentbox base build` builds the base (a new project VM's first launch does too).")
    click.echo(text, nl=not text.endswith("\n"))


@base_group.command("rm")
@click.argument("key")
@click.pass_context
def rm_command(ctx: click.Context, key: str) -> None:
    """Remove a base VM (VMs cloned from it are independent copies and keep working)."""
    say(golden.remove(_lima(ctx), key))


@base_group.command("prune")
@click.pass_context
def prune_command(ctx: click.Context) -> None:
    """Remove the base VMs that no VM was cloned from and that are not the current base."""
    config = load_config(ctx)
    lima = _lima(ctx)
    removed = 0
    for row in golden.listing(lima, config):
        if row["current"]:
            say(f"kept {row['name']}: it is the current base")
        elif row["usedBy"]:
            say(f"kept {row['name']}: {', '.join(row['usedBy'])} {'was' if len(row['usedBy']) == 1 else 'were'} "
                "cloned from it (`agentbox base rm` removes it anyway; clones keep working)")
        else:
            say(golden.remove(lima, row["key"]))
            removed += 1
    if not removed:
        say("no base VM to prune")
