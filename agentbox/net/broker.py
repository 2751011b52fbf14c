"""What the credential broker is given: the VM's placeholders, the real values behind them, the token endpoints
the host answers itself. agentbox.net.proxy serves it; agentbox.credentials builds it from the host's logins.

The VM holds only placeholders (`<the real value's prefix>agentbox-ph-<hex>`, unique to the VM). For a request
to a credential host (one the VM's CA may vouch for), the proxy terminates TLS and:
- swaps each placeholder for its real value when the request goes to a host that secret belongs to;
- refuses (403, logged) a request that carries any other credential: a foreign key or token, another VM's
  placeholder, a placeholder of a secret that belongs to another host, or a second credential header;
- hands the request to a token endpoint's handler when one is registered for its host and path (an OAuth
  refresh or code exchange is answered on the host: the real tokens stay there, the VM gets placeholders);
- refuses pushes to GitHub (`git-receive-pack`, REST calls other than GET/HEAD, GraphQL mutations) unless
  `allow_push`.
A placeholder on its way to any host it does not belong to (in plain HTTP, or to another credential host) is
refused as an attempted leak. Everything else passes untouched (CONNECT tunnel, no interception).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import ssl  # a launch imports this module; only the proxy process needs ssl

PLACEHOLDER_MARK = "agentbox-ph-"  # in every placeholder agentbox makes, whatever VM it is for


class Secret(NamedTuple):
    """One credential as the VM sees it (`placeholder`) and as the host holds it (`real()`, read when used, so a
    refresh on the host is picked up; None when the host has no such login now)."""

    agent: str  # "claude", "codex", "gemini", "gh": for the log
    placeholder: str
    hosts: frozenset[str]  # the only hosts the real value may be sent to
    real: Callable[[], str | None]


class Exchange(NamedTuple):
    """A request a token endpoint's handler answers on the host (body whole, at most MAX_EXCHANGE bytes)."""

    host: str
    method: str
    path: str  # with the query
    headers: tuple[tuple[str, str], ...]
    body: bytes


class Reply(NamedTuple):
    status: int
    headers: tuple[tuple[str, str], ...]  # Content-Length and Connection are the proxy's
    body: bytes


TokenEndpoint = Callable[[Exchange], Reply]  # called in a worker thread: it may block on the network
MAX_EXCHANGE = 1 << 20


class Brokering(NamedTuple):
    """Everything the proxy needs to broker one VM's credentials."""

    leaves: Mapping[str, ssl.SSLContext]  # credential host -> server context (agentbox.net.ca.server_context)
    secrets: tuple[Secret, ...] = ()
    endpoints: Mapping[tuple[str, str], TokenEndpoint] = MappingProxyType({})  # (host, path w/o query)
    allow_push: bool = False
    push_hint: str = "a push is allowed only by the project's trusted agentbox.yml"  # what allows it, for the 403
    # How the broker reaches and checks the real host: the system's trust store by default; tests point both
    # at a fake upstream.
    upstream_context: ssl.SSLContext | None = None
    upstream_address: Callable[[str, int], tuple[str, int]] | None = None
    # Set when the broker could not be made (a host login file it cannot read, ...): every request to a
    # credential host is then answered 503 with this reason, and nothing goes out.
    down: str | None = None

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(self.leaves)
