"""`agentbox hosts add|ls|doctor|rm`: the other machines isolated tasks may run on (docs/remote.md)."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import click

from agentbox import runtime, tables
from agentbox.cli.commands.common import load_config
from agentbox.cli.verdicts import FAIL, OK, WARN, Check, failed, format_text, version_tuple
from agentbox.errors import AgentboxError, StateError
from agentbox.progress import note, say, warn
from agentbox.remote import registry
from agentbox.remote.farclient import Far, FarError
from agentbox.remote.registry import Host
from agentbox.remote.ssh import Transport, Unreachable
from agentbox.runtime.sshhost import SshRuntime
from agentbox.safetext import visible
from agentbox.tasks import keeper, records
from agentbox.vm.render import MINIMUM_LIMA_VERSION

if TYPE_CHECKING:
    from agentbox.cli.verdicts import Check
    from agentbox.remote.registry import Host

def _local_host() -> Host:
    return Host("local", "this machine", "localhost")


MIN_DISK_FREE = 20 << 30  # a VM's disk grows to tens of GiB; less free space than this is a warning
LS_TIMEOUT = 15.0
LOCAL_HOST = _local_host()


@click.group("hosts", invoke_without_command=True)
@click.pass_context
def hosts_group(ctx: click.Context) -> None:
    """Other machines that run isolated tasks (`run --on NAME`).

    Each needs OpenSSH (your own keys or ssh agent: agentbox stores no secret), Lima 2 on the PATH of
    non-interactive ssh commands, and python3. `agentbox hosts` alone is `agentbox hosts ls`.
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(ls_command)


@hosts_group.command("add")
@click.argument("name")
@click.argument("url", metavar="[ssh://][USER@]HOST[:PORT]")
@click.option("--no-check", is_flag=True, help="Record it without contacting it.")
def add_command(name: str, url: str, no_check: bool) -> None:
    """Add a host: NAME for `run --on NAME`, reached with your ssh config and keys as `ssh [USER@]HOST` would."""
    host = registry.add(name, url)
    say(f"added host {name} ({host.url})")
    if no_check:
        return
    checks = host_checks(host)
    click.echo(format_text(checks), nl=False, err=True)
    if any(check.status == "FAIL" for check in checks):
        warn(f"{name} is added, but tasks cannot run there until the problems above are fixed "
             f"(`agentbox hosts doctor {name}` checks again)")


@hosts_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object per host.")
@click.pass_context
def ls_command(ctx: click.Context, as_json: bool = False) -> None:
    """List the hosts, this machine (`local`) first: reachable, Lima, virtualisation, size, free slots, running
    work.

    Every host is asked at once (one ssh connection each, reused by later commands); one that does not
    answer within 15 s is shown as unreachable with when it was last reached.
    """
    found = registry.all_hosts()
    slots = _slots(ctx)
    asked = [LOCAL_HOST, *found]
    rows = _ask_all(asked)
    if as_json:
        click.echo(json.dumps([_json_row(host, facts, error, slots) for host, facts, error in rows], indent=2))
        return
    if not found:
        note("no other hosts yet: `agentbox hosts add NAME [user@]host` adds one")
    table = [["NAME", "ADDRESS", "REACHABLE", "LIMA", "VIRT", "CPUS", "MEMORY", "FREE SLOTS", "RUNNING"]]
    for host, facts, _error in rows:
        if facts is None:
            since = host.unreachable_since
            table.append([host.name, host.url, f"no, since {tables.local_time(since)}" if since else "no",
                          "-", "-", "-", "-", "-", "-"])
            continue
        limit = slots.get(host.name, slots.get("*", 2))
        running = int(facts.get("running") or 0)
        table.append([host.name, host.url, "yes", _shown(facts.get("limaVersion") or "missing"),
                      _shown(facts.get("virt") or "-"), _shown(facts.get("cpus") or "-"), _gib(facts.get("memory")),
                      str(max(limit - running, 0)), str(running)])
    tables.echo(table, flexible=(1, 2))  # cut first ADDRESS, then REACHABLE ("no, since ..."; the reason follows it)
    for before, (host, _facts, error) in zip(asked, rows, strict=True):
        if error and before.unreachable_since is None:  # the table says "no, since": the reason is said once
            warn(f"{host.name}: {error}")


@hosts_group.command("doctor")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of {check, status, message, hint}.")
@click.pass_context
def doctor_command(ctx: click.Context, name: str, as_json: bool) -> None:
    """Check a host: ssh, python3, limactl and its version, virtualisation, disk.

    `local` checks this machine the same way (limactl, virtualisation, disk). Each line is OK, WARN or FAIL; the
    exit code is 1 when any check fails.
    """
    checks = host_checks(LOCAL_HOST if name == "local" else registry.require(name))
    if as_json:
        click.echo(json.dumps([check.to_json() for check in checks], indent=2))
    else:
        click.echo(format_text(checks), nl=False)
    if failed(checks):
        ctx.exit(1)


@hosts_group.command("rm")
@click.argument("name")
@click.option("--force", is_flag=True, help="Also when tasks on it are still active (they become Failed).")
def rm_command(name: str, force: bool) -> None:
    """Forget a host (nothing on it is touched: its VMs stay until you delete them there)."""
    registry.require(name)
    active = [task for task in records.all_tasks() if task.active and task.host == name]
    if active and not force:
        shown = ", ".join(task.label for task in active[:5])
        raise StateError(f"{len(active)} task{'s' if len(active) != 1 else ''} on {name} "
                         f"{'are' if len(active) != 1 else 'is'} still active ({shown})",
                         hint="`agentbox wait` or `agentbox cancel` them first, or `hosts rm --force` (they become "
                              "Failed and their results are not collected).")
    for task in active:
        _cancel_there(task)
        with records.locked():
            fresh = records.get(task.id) or task
            if fresh.active:
                records.end(fresh, "Failed", f"its host {name} was removed with `agentbox hosts rm --force`")
    _close(name)
    registry.remove(name)
    keeper.end_brokers(name)  # after the keepers can no longer find it: none leases its proxy again
    say(f"removed host {name}")


def _cancel_there(task: Any) -> None:
    """Best effort, before its host is forgotten: the task's runner there is asked to stop (the host may not
    answer; then it runs on there, and nothing of it is collected)."""
    host = registry.get(task.host)
    if host is None or not task.handed or not task.remote_key:
        return
    with contextlib.suppress(AgentboxError):
        SshRuntime(host).cancel(task.vm, task.remote_key)


def host_checks(host: Host) -> list[Check]:
    """Reach the host and judge what it says of itself."""
    if host is LOCAL_HOST:
        return _judged(runtime.place(runtime.LOCAL).describe())
    where = _address(host)
    transport = Transport(host.target())
    try:
        facts = Far(transport).call("facts", timeout=60)
    except Unreachable as exc:
        registry.unreachable(host)
        return [Check("ssh", FAIL, f"ssh to {where} failed: {exc.message}",
                      f"`ssh {_ssh_words(host)} true` must work without a question: agentbox runs ssh in batch "
                      "mode (your keys or ssh agent; a host key already known).")]
    except FarError as exc:
        registry.reached(host)
        return [Check("ssh", OK, f"ssh reaches {where}"),
                Check("python3", FAIL, f"agentbox's helper does not run there: {exc.message}",
                      "agentbox needs python3 (3.8 or later) on the PATH of non-interactive ssh commands.")]
    registry.reached(host, facts)
    return [Check("ssh", OK, f"ssh reaches {where}"),
            Check("python3", OK, f"agentbox's helper runs there ({_shown(facts.get('os', '?'))} "
                                 f"{_shown(facts.get('arch', '?'))})"), *_judged(facts)]


def _judged(facts: dict[str, Any]) -> list[Check]:
    """What a place's facts (the runtime contract's `describe`) say of Lima, virtualisation and disk there."""
    checks: list[Check] = []
    version = _shown(facts.get("limaVersion") or "")
    if not facts.get("limactl"):
        checks.append(Check("lima", FAIL, "limactl is not on the PATH of non-interactive ssh commands there",
                            "Install Lima 2 there (https://lima-vm.io/docs/installation/) and put it on the PATH "
                            "that `ssh HOST limactl --version` sees (e.g. in ~/.bashrc before its interactive test)."))
    elif (version_tuple(str(version or "")) or (0,)) < (version_tuple(MINIMUM_LIMA_VERSION) or (0,)):
        checks.append(Check("lima", FAIL, f"Lima {version} there is older than {MINIMUM_LIMA_VERSION}",
                            "Update Lima on that host."))
    else:
        checks.append(Check("lima", OK, f"Lima {version} ({_shown(facts.get('limactl'))})"))
    virt = facts.get("virt")
    if virt in ("kvm", "vz"):
        checks.append(Check("virtualisation", OK, f"{virt.upper()}: VMs run at native speed"))
    else:
        checks.append(Check("virtualisation", FAIL, "neither KVM (/dev/kvm) nor Apple's VZ is usable there",
                            "On Linux, add the user to the kvm group (`sudo usermod -aG kvm USER`, then log in "
                            "again); on macOS, Lima needs macOS 13 or later."))
    free = facts.get("diskFree")
    if isinstance(free, int) and free < MIN_DISK_FREE:
        checks.append(Check("disk", WARN, f"{_gib(free)} free in the home folder there",
                            "A VM's disk grows to tens of GiB: free some space there."))
    elif isinstance(free, int):
        checks.append(Check("disk", OK, f"{_gib(free)} free; {_shown(facts.get('cpus'))} CPUs, "
                                        f"{_gib(facts.get('memory'))} memory"))
    return checks


def _ask_all(found: list[Host]) -> list[tuple[Host, dict[str, Any] | None, str | None]]:
    """Each host's facts (the runtime contract's `describe`), asked in parallel; (host as recorded now, None, why)
    for one that did not answer."""
    def ask(host: Host) -> tuple[Host, dict[str, Any] | None, str | None]:
        if host is LOCAL_HOST:
            try:
                return host, runtime.place(runtime.LOCAL).describe(), None
            except AgentboxError as exc:
                return host, None, exc.message
        try:
            facts = runtime.place(host.name).describe()
        except Unreachable as exc:
            return registry.unreachable(host), None, exc.message
        except FarError as exc:
            return registry.reached(host), None, exc.message
        return registry.reached(host, facts), facts, None

    if not found:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(found))) as pool:
        return list(pool.map(ask, found))


def _slots(ctx: click.Context) -> dict[str, int]:
    """Each host's slots from the config's tasks.hosts ("*": tasks.maxConcurrent), when a config loads here."""
    try:
        config = load_config(ctx)
    except AgentboxError:
        return {"*": 2}
    slots = {"*": config.tasks_max_concurrent}
    for entry in config.task_hosts:
        slots[entry.name] = entry.max_concurrent or config.tasks_max_concurrent
    return slots


def _json_row(host: Host, facts: dict[str, Any] | None, error: str | None, slots: dict[str, int]) -> dict[str, Any]:
    """A host for `hosts ls --json`: times in ISO 8601 (UTC), and why it did not answer each time it did not."""
    limit = slots.get(host.name, slots.get("*", 2))
    running = int((facts or {}).get("running") or 0)
    return {"name": host.name, "url": host.url, "reachable": facts is not None, "error": error,
            "lastSeen": records.iso(host.seen), "unreachableSince": records.iso(host.unreachable_since),
            "limaVersion": (facts or {}).get("limaVersion"), "virt": (facts or {}).get("virt"),
            "cpus": (facts or {}).get("cpus"), "memory": (facts or {}).get("memory"),
            "diskFree": (facts or {}).get("diskFree"), "slots": limit,
            "freeSlots": max(limit - running, 0) if facts is not None else None,
            "running": running if facts is not None else None, "vms": (facts or {}).get("vms")}


def _address(host: Host) -> str:
    return f"{host.user + '@' if host.user else ''}{host.hostname}{':' + str(host.port) if host.port else ''}"


def _ssh_words(host: Host) -> str:
    return " ".join([*(["-p", str(host.port)] if host.port else []), *(["-l", host.user] if host.user else []),
                     host.hostname])


def _shown(value: Any) -> str:
    """A value the host said of itself, as text safe for a terminal (a host can answer anything)."""
    return visible(str(value))[:80]


def _gib(value: Any) -> str:
    return f"{value / (1 << 30):.1f} GiB" if isinstance(value, (int, float)) else "-"


def _close(name: str) -> None:
    host = registry.get(name)
    if host is not None:
        Transport(host.target()).close()
