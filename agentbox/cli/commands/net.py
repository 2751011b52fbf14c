"""`agentbox net status|log|allow|test`: the project VM's network policy (network.*, agentbox.net.policy).

`status` and `log` read the host's files only (no limactl call); `allow` edits a config file; `test` runs one
check inside the VM the way a session would (the launch step, so the firewall and the proxy variables are the
session's): `limactl list` and one `limactl shell`.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from agentbox import paths, sizes, tables
from agentbox.cli.commands.common import load_config, vm_control
from agentbox.config import edit, load, trust
from agentbox.credentials import brokerreport, pushreport
from agentbox.errors import StateError, UsageError
from agentbox.net import guard, policy, proxy, uploads
from agentbox.progress import emit, note, say
from agentbox.safetext import visible
from agentbox.session import prepare, staging, warm
from agentbox.vm import lifecycle

if TYPE_CHECKING:
    from agentbox.config.load import Config

OFFLINE_HINT = ("To reach other hosts, set `network.mode: allowlist` in agentbox.yml (then `agentbox net allow HOST`) "
                "or `network.mode: open`; `agentbox start` takes the new mode.")
# `net test` exit codes
ALLOWED, BLOCKED, NO_ROUTE = 0, 1, 3
OUTPUT_LIMIT = 64 * 1024
LOG_TAIL = 50

# Runs in the VM (python3 is there: cloud-init needs it). Prints one JSON line: how the request went through the
# proxy the session gets (or directly, in open mode), and whether a direct connection would leave the VM.
GUEST_CHECK = r"""
import base64, json, os, socket, sys, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
scheme = url.scheme or "https"
host = url.hostname or ""
port = url.port or (443 if scheme == "https" else 80)
out = {"host": host, "port": port}
def unresolved(name, error):
    # a gaierror's errno is an EAI_ code (negative): os.strerror would say "Unknown error -2"
    return "cannot resolve %s in the VM (%s)" % (name, error.strerror or "no address")
def direct():
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except socket.gaierror as error:
        return unresolved(host, error)
    except socket.timeout:
        return "timed out"
    except OSError as error:
        return os.strerror(error.errno) if error.errno else str(error)
proxy = os.environ.get("HTTPS_PROXY" if scheme == "https" else "HTTP_PROXY", "")
if not proxy:
    out["via"] = "direct"
    out["direct"] = direct()
else:
    p = urllib.parse.urlsplit(proxy)
    out["via"] = "proxy"
    auth = ""
    if p.username is not None:  # the VM's proxy credentials, as every client sends them from the URL
        pair = urllib.parse.unquote(p.username) + ":" + urllib.parse.unquote(p.password or "")
        auth = "Proxy-Authorization: Basic %s\r\n" % base64.b64encode(pair.encode()).decode()
    try:
        s = socket.create_connection((p.hostname, p.port), timeout=10)
        target = "%s:%d" % ("[%s]" % host if ":" in host else host, port)
        if scheme == "https":
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (target, target, auth)).encode())
        else:
            s.sendall(("HEAD http://%s/ HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n"
                       % (target, target, auth)).encode())
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        out["status"] = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
        if out["status"] in (400, 403, 407, 431, 502, 503) and head.find(b"application/json") >= 0:
            while len(rest) < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                rest += chunk
            try:
                out["refusal"] = json.loads(rest)
            except ValueError:
                pass
        s.close()
    except socket.gaierror as error:
        out["proxyError"] = unresolved(p.hostname, error)
    except OSError as error:
        out["proxyError"] = os.strerror(error.errno) if error.errno else str(error)
    out["direct"] = direct()
print(json.dumps(out))
"""


@click.group("net")
def net_group() -> None:
    """The project VM's network policy (network.mode): what it allows, what the proxy decided, checks.

    See docs/network.md: open (the default: the internet is open, the host's localhost closed), allowlist
    (traffic leaves only through agentbox's proxy, to the agent's API and the hosts you allow) and offline
    (only the agent's API).
    """


@net_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the policy as JSON.")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool) -> None:
    """Show the mode, what enforces it, what the proxy lets through and whether it runs, and the credential
    broker: which agents' logins it keeps on the host, which are staged, its CA."""
    config = load_config(ctx, describe=True)
    report = guard.describe(config.network, config.vm_name, _agents(config), config.vm_type)
    broker = brokerreport.of(config, config.vm_name)
    if as_json:
        click.echo(json.dumps({"vm": config.vm_name, **report, "broker": broker}, indent=2))
        return
    host = report["allowHost"]
    host_words = ("open: every port" if host is True else f"open on ports {', '.join(map(str, host))}, others closed"
                  if host else "closed")
    proxy = report["proxy"]
    lines = [
        f"VM:              {config.vm_name}",
        f"mode:            {report['mode']} ({config.origins.get('network.mode', 'default')})",
        f"enforcement:     {report['enforcement']}: {report['enforcementWhy']}",
        f"host localhost:  {host_words}",
    ]
    if config.network.proxied:
        lines += [
            f"private ranges:  {'open (network.allowLan)' if report['allowLan'] else 'closed'}",
            "proxy:           " + (f"running on 127.0.0.1:{proxy['port']} (pid {proxy['pid']}), the VM's "
                                   f"HTTPS_PROXY is {proxy['url']}" if proxy["running"] else
                                   "not running (it starts with the next session and stops with the last)"),
            f"log:             {report['log']} (`agentbox net log`)",
            f"allowed ({len(report['allow'])} hosts):" + ("" if report["allow"] else " nothing"),
            *(f"  {source}: {visible(', '.join(hosts))}" for source, hosts in _by_source(report["allow"]).items()),
        ]
        if not proxy["running"] and config.network.agent_api:
            lines.append("  (a session allows its own agent's API; while none runs, every agent's is shown)")
    else:
        lines.append("internet:        open (no proxy; network.mode allowlist or offline filters it)")
        if broker["enabled"]:
            lines.append("proxy:           " + (
                f"running on 127.0.0.1:{proxy['port']} (pid {proxy['pid']}) for the credential broker only"
                if proxy["running"] else "not running (the next launch starts it for the broker; it ends with "
                                         "the VM)"))
            lines.append(f"log:             {report['log']} (`agentbox net log`)")
    lines += [f"{'broker:' if index == 0 else '':17}{line}" for index, line in enumerate(brokerreport.lines(broker))]
    click.echo("\n".join(visible(line) for line in lines))


@net_group.command("log")
@click.option("-f", "--follow", is_flag=True, help="Keep printing decisions as they happen (Ctrl-C ends).")
@click.option("-n", "--lines", "count", type=click.IntRange(min=0), default=LOG_TAIL, show_default=True,
              help="How many of the last decisions to print first.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON lines as the proxy wrote them.")
@click.option("--broker", "broker_only", is_flag=True,
              help="Only the credential broker's decisions: each request to a credential host (substituted, "
                   "answered on the host, passed or refused) and each placeholder refused on its way elsewhere.")
@click.option("--hosts", "per_host", is_flag=True,
              help="A table of what each host was sent and sent back in this session's upload window (requests, "
                   "bytes up and down, refusals at network.uploadLimit); with --json one object.")
@click.option("--leaks", "leaks_only", is_flag=True,
              help="Only attempted leaks: requests refused for carrying a canary secret or a private file's content "
                   "(what: the canary's kind, or private and the file).")
@click.pass_context
def log_command(ctx: click.Context, follow: bool, count: int, as_json: bool, broker_only: bool,
                per_host: bool, leaks_only: bool) -> None:
    """Print the proxy's decisions for the project's VM: time, decision, the host and why.

    A request the credential broker judged (credentials.broker) also shows its path (without the query) and
    the agent whose credential it carried: substitute (the real value put in on the host), answer (a token
    request answered on the host), pass (no credential) or deny. Never a secret.
    """
    if per_host and (follow or broker_only):
        raise UsageError("--hosts sums the log: it takes neither --follow nor --broker",
                         hint="`agentbox net log --hosts` (add --json for one JSON object).")
    config = load_config(ctx, describe=True)
    path = guard.log_path(config.vm_name)
    if per_host:
        _print_hosts(config, path, as_json)
        return
    if not path.exists() and not follow:
        say(f"no decisions logged for {config.vm_name} yet ({path}); the proxy runs in network.mode allowlist and "
            "offline, and in every mode with credentials.broker")
        return
    try:
        _print_log(path, count, follow, as_json, _leak if leaks_only else _brokered if broker_only else None)
    except KeyboardInterrupt:
        pass


def _print_hosts(config: Config, path: Path, as_json: bool) -> None:
    """What each host was sent in the current upload window (agentbox.net.uploads), as a table or one JSON object."""
    since = guard.upload_window(config.vm_name)
    try:
        with open(path, "rb") as handle:
            rows = uploads.per_host(handle, since)
    except FileNotFoundError:
        rows = []
    limit = config.network.upload_limit
    if as_json:
        click.echo(json.dumps({"since": since or None, "uploadLimit": limit, "hosts": rows}))
        return
    cap = "no cap" if limit is None else f"cap {sizes.shown(limit)} per host"
    when = f"since {tables.local_time(since)}" if since else "in the whole log"
    say(f"uploads per host {when} (this session window; network.uploadLimit: {cap})")
    if not rows:
        say(f"nothing logged for {config.vm_name} in this window ({path})")
        return
    table = [["HOST", "REQUESTS", "UP", "DOWN", "AT CAP"]] + [
        [visible(row["host"]), str(row["requests"]), sizes.shown(row["up"]), sizes.shown(row["down"]),
         str(row["capped"]) if row["capped"] else "-"] for row in rows]
    tables.echo(table, flexible=(0,), right=(1, 2, 3, 4))


def _print_log(path: Path, count: int, follow: bool, as_json: bool,
               only: Callable[[bytes], bool] | None = None) -> None:
    position = 0
    if path.exists():
        with open(path, "rb") as handle:
            chosen = (raw for raw in handle if only is None or only(raw))
            tail = collections.deque(chosen, maxlen=count) if count else collections.deque()
            position = handle.tell()
        for raw in tail:
            _print_entry(raw, as_json)
    while follow:
        time.sleep(0.2)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if size < position:
            position = 0  # a new log
        if size == position:
            continue
        with open(path, "rb") as handle:
            handle.seek(position)
            data = handle.read(size - position)
        complete = data[:data.rfind(b"\n") + 1]
        position += len(complete)
        for raw in complete.splitlines(keepends=True):
            if only is None or only(raw):
                _print_entry(raw, as_json)
        sys.stdout.flush()


def _print_entry(raw: bytes, as_json: bool) -> None:
    text = raw.decode(errors="replace").rstrip("\n")
    if as_json:
        click.echo(visible(text))
        return
    try:
        entry = json.loads(text)
    except ValueError:
        return
    target = f"{entry.get('host', '?')}:{entry.get('port', '?')}"
    reason = f"  ({entry['reason']})" if entry.get("reason") else ""
    if "path" in entry:  # a request the credential broker judged (agentbox.net.intercept)
        target += str(entry["path"])
        status = f" -> {entry['status']}" if entry.get("status") else ""
        reason = f"  {entry.get('agent') or '-'}{status}{reason}"
    if entry.get("decision") == "leak":
        reason = f"  {entry.get('what')}{' ' + str(entry['file']) if entry.get('file') else ''}{reason}"
    pushed = entry.get("pushed")  # a git push's ref updates (git.allowPush: session)
    if isinstance(pushed, list) and pushed:
        reason += "  push: " + ", ".join(pushreport.update_words(update) for update in pushed
                                         if isinstance(update, dict))
    click.echo(visible(f"{entry.get('time', '?')}  {entry.get('decision', '?')!s:5}  "
                       f"{entry.get('method', '?')!s:7} {target}{reason}"))


def _leak(raw: bytes) -> bool:
    """Whether a log line is an attempted leak the proxy or the broker refused (agentbox.net.doors)."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return False
    return isinstance(entry, dict) and entry.get("decision") == "leak"


def _brokered(raw: bytes) -> bool:
    """Whether a log line is the credential broker's: a request it judged, or a placeholder refused elsewhere."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return False
    return isinstance(entry, dict) and ("path" in entry or str(entry.get("reason", "")).startswith("attempted leak"))


@net_group.command("allow")
@click.argument("host")
@click.option("--global", "global_", is_flag=True,
              help="Write the global config instead of the project's agentbox.yml.")
@click.pass_context
def allow_command(ctx: click.Context, host: str, global_: bool) -> None:
    """Add HOST to network.allow (`host`, `*.suffix`, `host:port`, an IP) in the project's agentbox.yml.

    A project's file that allows more than the global config needs `agentbox trust` again after this. With
    --global: the global config. A running proxy uses the new list at once.
    """
    problem = policy.check_host_pattern(host) or proxy.own_address_problem(host)
    if problem:
        local = "the host itself" in problem
        raise UsageError(f"HOST: {visible(problem)}", hint=proxy.local_hint(host) if local else
                         "For example `agentbox net allow registry.example.com` or "
                         "`agentbox net allow '*.example.com'`.")
    config = load_config(ctx, describe=True)
    if config.network.mode == "offline":
        raise StateError(
            f"network.mode is offline ({config.origins.get('network.mode', 'default')}): the VM reaches only "
            + ("the launched agent's API hosts" if config.network.agent_api else "nothing (network.agentApi: false)")
            + f", so network.allow has no effect and {visible(host)} was not added",
            hint=OFFLINE_HINT,
        )
    if global_:
        target = paths.global_config_file()
        target.parent.mkdir(parents=True, exist_ok=True)
    else:
        workspace = config.require_workspace()
        target = config.local_file or workspace / paths.LOCAL_CONFIG_NAME
    added = edit.add_to_list(target, ("network", "allow"), host)
    if not added:
        say(f"{visible(host)} is already in network.allow in {target}")
    else:
        say(f"added {visible(host)} to network.allow in {target}")
    config = load.load(ctx.obj["cwd"], describe=True)  # as written now (its notices were said)
    if config.network.mode == "open":
        note("network.mode is open: the list applies in allowlist mode (`network.mode: allowlist`)")
    if not global_ and trust.risky_keys(config) and not trust.is_trusted(config):
        note(f"{target} allows more than the global config now: `agentbox trust` reviews it; launches refuse it "
             "until then")
        return
    if guard.refresh_policy(config.network, config.vm_name):
        say(f"the running proxy of {config.vm_name} lets {visible(host)} through now")


@net_group.command("test")
@click.argument("url")
@click.option("--agent", "agent_name", metavar="AGENT",
              help="Check as that agent's session does (its API allowed); default: as `agentbox shell` does.")
@click.pass_context
def test_command(ctx: click.Context, url: str, agent_name: str | None) -> None:
    """Check from inside the VM whether URL is reachable: allowed, blocked by policy, or no route.

    Runs as a session would (the VM's firewall and proxy variables in place). Exit status: 0 allowed,
    1 blocked by policy, 3 no route.
    """
    parsed = urlsplit(url if "://" in url else f"https://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"{visible(url)} is not an http:// or https:// address",
                         hint="For example `agentbox net test https://registry.npmjs.org`.")
    try:
        _ = parsed.port
    except ValueError as error:
        raise UsageError(f"{visible(url)}: {error}") from None
    control = vm_control(ctx)
    config = control.config
    vm_name = config.vm_name
    if agent_name is not None and agent_name not in config.agents:
        raise UsageError(f"there is no agent {visible(agent_name)}", hint=f"The agents: {', '.join(config.agents)}.")
    agents = {agent_name: config.agents[agent_name].endpoints} if agent_name else {}
    launch = prepare.prepare(control, prepare.Ask(None, steps=prepare.TASK, vm_name=vm_name))
    with prepare.proxied(launch, agents) as launch:
        reached = prepare.reached(launch, lifecycle.ensure_running(control, vm_name), warm.record(vm_name, None))
        refreshed = staging.refresh(reached, reached.instance, launch.lease.port if launch.lease else None)
        command = staging.launch_command(reached, refreshed.folder, staging.LaunchOptions())
        command += ["--", "python3", "-c", GUEST_CHECK, parsed.geturl()]
        code, stdout, stderr = control.lima.shell_bytes(vm_name, command, OUTPUT_LIMIT)
    for line in stderr.splitlines():
        emit(visible(line))
    try:
        result = json.loads(stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StateError(f"the check in {vm_name} gave no answer (exit {code})",
                         hint="Its messages, if any, are above; `agentbox shell` looks inside.") from None
    verdict, words = _verdict(result, config)
    click.echo(visible(f"{parsed.geturl()}: {words}"))
    ctx.exit(verdict)


def _verdict(result: dict[str, Any], config: Config) -> tuple[int, str]:
    """The exit status and the sentence for what the guest's check saw."""
    direct = str(result.get("direct", ""))
    if result.get("via") == "direct":
        if direct == "connected":
            return ALLOWED, "allowed (network.mode open: straight out of the VM)"
        refused = direct in ("Connection refused", "No route to host") or "prohibited" in direct
        if refused and result.get("host") in ("host.lima.internal", "192.168.5.2"):
            return BLOCKED, f"blocked by policy: the host's localhost is closed (network.allowHost) ({direct})"
        if proxy.is_loopback_name(str(result.get("host", ""))):
            return NO_ROUTE, (f"no route ({direct}): {result.get('host')} in the VM is the VM itself; to reach this "
                              f"machine's service: {proxy.allow_host_hint(result.get('port'))}")
        return NO_ROUTE, f"no route ({direct})"
    bypass = ("; going around the proxy is blocked by the VM's firewall" if direct != "connected"
              else "; WARNING: a direct connection also got out (the VM's firewall is not in place)")
    if "proxyError" in result:
        return NO_ROUTE, f"no route: agentbox's proxy could not be reached ({result['proxyError']})"
    status = int(result.get("status", 0))
    refusal: dict[str, Any] = result["refusal"] if isinstance(result.get("refusal"), dict) else {}
    if status == 403 and config.network.mode == "offline" and str(refusal.get("allow", "")).startswith(
            "agentbox net allow"):
        what = "the agents' API hosts" if config.network.agent_api else "nothing (network.agentApi: false)"
        return BLOCKED, (f"blocked by policy ({refusal.get('reason', 'refused by the proxy')}): network.mode is "
                         f"offline, which lets through only {what}; `agentbox net allow` has no effect there. "
                         f"{OFFLINE_HINT}")
    if status == 403:
        allow = f"; to allow it: {refusal['allow']}" if refusal.get("allow") else ""
        return BLOCKED, f"blocked by policy ({refusal.get('reason', 'refused by the proxy')}){allow}"
    if status == 407:  # the session's proxy URL is not the VM's (its secret file was replaced meanwhile)
        return NO_ROUTE, (f"no route: agentbox's proxy refused the session's proxy credentials "
                          f"({refusal.get('reason', 'proxy authentication required')})")
    if status == 200 or (status and status not in (400, 407, 431, 502, 503, 504)):
        return ALLOWED, f"allowed through agentbox's proxy ({config.network.mode}){bypass}"
    return NO_ROUTE, f"no route ({refusal.get('reason') or f'the proxy answered {status}'})"


def _by_source(entries: list[dict[str, str]]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for entry in entries:
        grouped.setdefault(entry["from"], []).append(entry["host"])
    return grouped


def _agents(config: Config) -> dict[str, tuple[str, ...]]:
    return {name: agent.endpoints for name, agent in config.agents.items() if agent.endpoints}
