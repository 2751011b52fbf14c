"""The VM's proxy process with the credential broker: `python -m agentbox.credentials.broker.process VM`.

agentbox.net.guard's process, given a broker made from the request the launch wrote (guard's broker.json):
the host's logins read again (agentbox.credentials.broker.brokered), the VM's CA and its leaves
(agentbox.net.certauthority). It
serves while a session holds it and, between sessions, while its VM runs: it asks Lima now and then (`vm_running`)
and ends once the VM stopped or is gone, whatever stopped it.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
from pathlib import Path

from agentbox.config import keys
from agentbox.credentials.broker import brokered
from agentbox.credentials.tokens import Upstream
from agentbox.net import certauthority, guard, pushes
from agentbox.net.broker import Brokering
from agentbox.net.upstream import trust
from agentbox.vm import lima

# Tests only: where the broker finds "the real hosts" ({"address": [host, port], "caFile": PEM}); the host's
# environment is the user's, never the VM's.
TEST_UPSTREAM = "AGENTBOX_TEST_BROKER_UPSTREAM"


def load(vm_name: str) -> Brokering | None:
    """The broker for `vm` from its request file; None when there is none."""
    path = guard.folder(vm_name) / guard.BROKER_FILE
    try:
        data = json.loads(path.read_bytes())  # agentbox's own file, in the host's state folder
    except FileNotFoundError:
        return None
    upstream = _test_upstream()
    route = guard.upstream_route(vm_name)
    refreshes = upstream
    if route is not None:  # OAuth refreshes through the company proxy, trusting the user's CA certificates too

        refreshes = Upstream(upstream.context if upstream else trust(route),
                             upstream.address if upstream else None, route)
    prepared = brokered.prepare_request(vm_name, brokered.Request.from_json(data), refreshes)
    inspect = [host for host in data.get("inspect", []) if isinstance(host, str) and host not in prepared.hosts]
    if not prepared.hosts and not inspect:
        return None
    # the same host set, in the same order, as the launch's (agentbox.session.brokersetup.authority_hosts)
    authority = certauthority.ensure(vm_name, tuple(dict.fromkeys([*prepared.hosts, *inspect])))
    scoped = data.get("pushMode") == keys.PUSH_SESSION and not data.get("allowPush")
    return Brokering(
        leaves={host: certauthority.server_context(authority.leaf(host)) for host in authority.hosts},
        secrets=tuple(prepared.secrets),
        endpoints=dict(prepared.endpoints),
        held=prepared.held_now,
        allow_push=bool(data.get("allowPush")),
        push_hint=push_hint(vm_name) if scoped else REMOTE_WRITE_HINT,
        push_namespace=pushes.namespace(vm_name) if scoped else None,
        pushes=pushes.Ledger(vm_name) if scoped else None,
        upstream_context=upstream.context if upstream else None,
        upstream_address=upstream.address if upstream else None,
        inspected=frozenset(inspect),
    )


REMOTE_WRITE_HINT = ("sync.remoteWrite: true in the project's agentbox.yml (a setting `agentbox trust` must accept) "
                     "allows every push; git.allowPush: session only pushes to branches under agentbox/<vm>/")


def push_hint(vm_name: str) -> str:
    """What a refused push's 403 says under git.allowPush: session: where pushes may go, and what allows more."""
    branch = pushes.namespace(vm_name).removeprefix("refs/heads/")
    return (f"git.allowPush: session allows only pushes that create a branch under {branch} or update one this VM "
            "created (no deletes, no other refs, no GitHub API writes); sync.remoteWrite: true in agentbox.yml "
            "(a setting `agentbox trust` must accept) allows every push")


def _test_upstream() -> Upstream | None:
    text = os.environ.get(TEST_UPSTREAM)
    if not text:
        return None
    data = json.loads(text)
    address = (str(data["address"][0]), int(data["address"][1]))

    return Upstream(ssl.create_default_context(cafile=str(Path(data["caFile"]))), lambda host, port: address)


def vm_running(vm_name: str) -> bool:
    """Whether the VM still runs, as Lima says (agentbox.vm.lima, the one module that runs limactl): the broker's
    process ends with its VM once no session holds it (agentbox.net.guard.serve asks, seldom)."""
    return lima.is_running(vm_name)


if __name__ == "__main__":
    sys.exit(guard.serve(sys.argv[1], lambda: load(sys.argv[1]), sys.argv[2:],
                            vm_running=lambda: vm_running(sys.argv[1])))
