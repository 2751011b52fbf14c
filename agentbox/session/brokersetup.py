"""A launch's part of the credential broker (`credentials.broker: true`): the placeholder logins it stages, the
VM's CA, and the proxy that serves the broker while the VM runs (agentbox.credentials.broker.process).

Every launch calls it, most without the broker or the proxy: what only they run (the logins, the CA, the proxy's
lease, the company proxy's settings) is imported when they do (tests/test_own_time.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from agentbox.config import keys
from agentbox.net import policy
from agentbox.progress import note

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.credentials.broker import brokered
    from agentbox.net import certauthority, guard


BROKER_PROGRAM = "agentbox.credentials.broker.process"  # the VM's proxy process with the broker (`python -m` it)


class Brokered(NamedTuple):
    prepared: brokered.Prepared
    authority: certauthority.BrokerCA | None  # None when no brokered login is on the host (nothing to vouch for)


def wanted(config: Config) -> bool:
    return config.credentials.enabled and config.credentials.broker


def prepare(config: Config, vm_name: str, agent: str | None = None) -> Brokered | None:
    """What the VM gets instead of the host's logins (every brokered agent's: the CA's host set stays the same
    whichever agent launches); None without the broker. Raises StateError for a malformed host login. Says what
    the host lacks for `agent` (the others are `agentbox doctor`'s to report)."""
    if not wanted(config):
        return None
    # deferred: start-up (the broker's modules: a launch without the credential broker never loads them)
    from agentbox.credentials import brokerreport
    from agentbox.credentials.broker import brokered
    prepared = brokered.prepare(vm_name, config)
    title = brokered.title_of(agent) if agent is not None else None
    said = brokerreport.recorded_notes(vm_name)  # a note stays in `agentbox doctor`; a launch says it once
    for text in prepared.notes:
        if title is not None and text.startswith(f"{title}:") and text not in said:
            note(f"{text} (said once)")
    brokerreport.record(vm_name, prepared, agent)  # what status/describe/doctor report, without parsing the logins
    hosts = authority_hosts(prepared.hosts, config)
    if not hosts:  # no brokered login on the host and nothing to inspect: no CA to make or read
        return Brokered(prepared, None)
    # deferred: start-up (net.certauthority: only when a brokered login is on the host)
    from agentbox.net import certauthority

    return Brokered(prepared, certauthority.ensure(vm_name, hosts))


def authority_hosts(credential_hosts: Iterable[str], config: Config) -> tuple[str, ...]:
    """The names the VM's CA vouches for: the credential hosts, and with network.inspect: all every allowed name the
    broker inspects (the same set whichever agent launches, so the CA stays)."""
    return tuple(dict.fromkeys([*credential_hosts, *policy.inspected_hosts(config.network)]))


def begin_proxy(config: Config, vm_name: str, agents: dict[str, tuple[str, ...]]) -> guard.Lease | None:
    """netguard.begin, with the broker's request when the broker is on (then in every network mode); None, at no
    cost, when neither the network mode nor the broker needs the proxy."""
    if not (config.network.proxied or wanted(config)):
        return None
    # deferred: start-up (the broker's and the proxy's modules: a launch in open mode without the broker)
    from agentbox.credentials.broker import brokered
    from agentbox.net import guard

    request = brokered.request_of(config) if wanted(config) else None
    route = upstream_settings(config)
    if request is None:
        return guard.begin(config.network, vm_name, agents, upstream=route)
    # what the broker process serves (agentbox.credentials.broker.process reads it; guard.begin writes it 0600)
    # allowPush: every push (sync.remoteWrite); pushMode "session": pushes only to the VM's own branches
    # (git.allowPush, agentbox.net.pushes), judged and recorded by the broker
    wanted_broker = {**request.to_json(), "allowPush": config.remote_write,
                     "pushMode": keys.PUSH_SESSION if config.scoped_pushes else "off",
                     "inspect": list(policy.inspected_hosts(config.network))}
    return guard.begin(config.network, vm_name, agents, broker=wanted_broker, program=BROKER_PROGRAM,
                          upstream=route)


def upstream_settings(config: Config) -> dict[str, object] | None:
    """The company proxy agentbox's proxy goes on through and the CA certificates it trusts (agentbox.net.upstream),
    read here as pinned (the proxy process reads no file a config names); a proxy URL it cannot use is said."""
    # deferred: start-up (net.upstream and ssl: only a proxied launch)
    from agentbox.net import upstream
    pems: list[str] = []
    for path, origin in ((config.ca_cert, "caCert"), (os.environ.get("NODE_EXTRA_CA_CERTS"), "NODE_EXTRA_CA_CERTS")):
        if path:
            # deferred: start-up (only with caCert or NODE_EXTRA_CA_CERTS set)
            from agentbox.config import cacerts, pins

            text = pins.read(path, origin).decode("utf-8", errors="replace")
            pems.extend(pem for pem in cacerts.pem_blocks(text) if pem not in pems)
    settings, problems = upstream.settings(config.env, os.environ, tuple(pems))
    for problem in problems:
        note(f"{problem} (it goes directly)")
    return settings
