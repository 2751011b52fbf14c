"""What the credential broker is given: the VM's placeholders, the real values behind them and where each service
takes them, the token endpoints the host answers itself. agentbox.net.proxy serves it (agentbox.net.intercept
judges each request); agentbox.credentials builds it from the host's logins.

The VM holds only placeholders (`<the real value's prefix>agentbox-ph-<24 hex>`, unique to the VM). For a request
to a credential host (one the VM's CA may vouch for), the proxy terminates TLS and:
- swaps a placeholder for its real value only in a place its service takes that credential (`Place`: a header
  with its scheme, a query parameter only where the service documents one), only on the secret's own hosts, and
  there only for the requests its `Route`s allow where a host fronts more than the agent's API;
- refuses (403 JSON, logged) a request that carries a placeholder anywhere else (another header, a cookie, the
  query, the path, the body, another host), a foreign credential in a credential place, or a second credential;
- hands the request to a token endpoint's handler when one is registered for its host and path (an OAuth
  refresh or code exchange is answered on the host: the real tokens stay there, the VM gets placeholders);
- keeps GitHub read-only by allow-list (GET/HEAD, GraphQL queries, git's upload-pack) unless `allow_push`, or with
  `push_namespace` lets git pushes through only to branches under it (agentbox.net.pushes records them);
- scans every response head and body from a credential host for the real values it holds (`held`): a hit ends
  the response, and is logged.
Everything else passes untouched (CONNECT tunnel, no interception).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import ssl  # a launch imports this module; only the proxy process needs ssl

PLACEHOLDER_MARK = "agentbox-ph-"  # in every placeholder agentbox makes, whatever VM it is for


class Place(NamedTuple):
    """Where a service takes a credential: a header (its lower-case name) with its scheme, or a query parameter.

    scheme: "" the header's whole value; "bearer" or "token" (`Scheme VALUE`, the scheme's case as sent);
    "basic" Basic authorization's password, or its user name when the password is empty (git's
    `https://TOKEN@host`)."""

    header: str = ""
    scheme: str = ""
    query: str = ""

    def __str__(self) -> str:
        if self.query:
            return f"the {self.query} query parameter"
        return f"the {self.header} header" + (f" ({self.scheme.capitalize()})" if self.scheme else "")


BEARER = Place("authorization", "bearer")


class Route(NamedTuple):
    """A request a credential may go with on a host that fronts more than the agent's API: one of `methods`, to
    `path` exactly, or to any path that starts with it when it ends in "*" (paths compared once normalised)."""

    methods: frozenset[str]
    path: str

    def allows(self, method: str, path: str) -> bool:
        if method not in self.methods:
            return False
        return path.startswith(self.path[:-1]) if self.path.endswith("*") else path == self.path

    def __str__(self) -> str:
        return f"{'/'.join(sorted(self.methods))} {self.path}"


def place(text: str) -> Place:
    """A place as the agents' records write it: "authorization bearer", "x-api-key", "?key"."""
    if text.startswith("?"):
        return Place(query=text[1:])
    header, _, scheme = text.partition(" ")
    return Place(header.lower(), scheme.lower())


def route(text: str) -> Route:
    """A route as the agents' records write it: "GET /oauth2/v2/userinfo", "GET,POST /backend-api/codex/*"."""
    methods, _, path = text.partition(" ")
    return Route(frozenset(methods.split(",")), path)


class Secret(NamedTuple):
    """One credential as the VM sees it (`placeholder`) and as the host holds it (`real()`, read when used, so a
    refresh on the host is picked up; None when the host has no such login now)."""

    agent: str  # "claude", "codex", "gemini", "gh": for the log
    placeholder: str
    hosts: frozenset[str]  # the only hosts the real value may be sent to
    real: Callable[[], str | None]
    places: tuple[Place, ...] = (BEARER,)  # where its services take it
    # host -> the only requests it goes with there (a host not named here: any request)
    routes: Mapping[str, tuple[Route, ...]] = MappingProxyType({})


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
    refused: str | None = None  # the handler refused the request: why, for the log (logged as a denial)


class PushLedger(Protocol):
    """Where the broker keeps the refs a VM's pushes made (agentbox.net.pushes.Ledger)."""

    def created(self) -> Mapping[str, str]:
        """ref -> the last value this VM pushed to it (only refs a push of this VM created)."""

    def record(self, updates: Sequence[tuple[str, str, str]], outcome: str) -> None:
        """A push's (ref, old, new) updates and how it ended ("ok", "refused: ...", "failed: ...")."""


TokenEndpoint = Callable[[Exchange], Reply]  # called in a worker thread: it may block on the network
MAX_EXCHANGE = 1 << 20


class Brokering(NamedTuple):
    """Everything the proxy needs to broker one VM's credentials."""

    leaves: Mapping[str, ssl.SSLContext]  # credential host -> server context (certauthority.server_context)
    secrets: tuple[Secret, ...] = ()
    endpoints: Mapping[tuple[str, str], TokenEndpoint] = MappingProxyType({})  # (host, path w/o query)
    allow_push: bool = False
    push_hint: str = "a push is allowed only by the project's trusted agentbox.yml"  # what allows it, for the 403
    # git.allowPush: session: git pushes only create or update branches under this ref prefix
    # ("refs/heads/agentbox/VM/"), and `pushes` records them (agentbox.net.pushes.Ledger)
    push_namespace: str | None = None
    pushes: PushLedger | None = None
    # Every real value the broker holds now (access and refresh tokens, API keys): no response carries one back to
    # the VM. None: the secrets' real values.
    held: Callable[[], Iterable[str]] | None = None
    # How the broker reaches and checks the real host: the system's trust store by default; tests point both
    # at a fake upstream.
    upstream_context: ssl.SSLContext | None = None
    upstream_address: Callable[[str, int], tuple[str, int]] | None = None
    # Set when the broker could not be made (a host login file it cannot read, ...): every request to a
    # credential host is then answered 503 with this reason, and nothing goes out.
    down: str | None = None
    # network.inspect: all: allowed hosts that are no credential host, TLS-terminated so that what is sent to them is
    # counted and checked (no placeholder goes in, GitHub's rules are the credential hosts' only)
    inspected: frozenset[str] = frozenset()

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(self.leaves)
