"""Where a request to a credential host may carry the VM's credential, and the request with the real value put there.

`place()` reads every header and the target of one request. A placeholder of this VM's is swapped for its real value
only where that secret's service takes it (`Place`: a header and its scheme, or a query parameter it documents), on
one of the secret's hosts, and for a request its `Route`s allow there. It refuses (`Refusal`, 403):
- a placeholder anywhere else: another header, a cookie, the path, another query parameter, another scheme;
- a placeholder of a secret that does not belong to this host, or of another VM;
- a credential that is not a placeholder of this VM in a place that carries one here (a foreign key or token);
- two different credentials in one request (the same one in two of its places is one credential).
The request's body is scanned by the caller (agentbox.net.intercept).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from agentbox.net.broker import PLACEHOLDER_MARK, Place, Secret
from agentbox.net.scan import PLACEHOLDER, placeholders_in

# Headers that carry a credential to any service the broker knows (more come from the secrets' places).
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})


class Refusal(Exception):
    def __init__(self, status: int, reason: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.detail = detail or {}


class Placed(NamedTuple):
    headers: list[tuple[str, str]]  # the request's headers with the real value in its place
    query: str  # the raw query (without "?") with the real value in its place
    secret: Secret | None  # the credential it carries (None: none)
    sent: tuple[str, ...]  # the exact values put in (a response echoing one is a leak)


class Host(NamedTuple):
    """What `place` needs to know of the host the request goes to."""

    name: str
    secrets: Mapping[str, Secret]  # a placeholder's mark and random part -> this VM's secret (every host's)
    headers: frozenset[str]  # the headers that carry a credential here
    queries: frozenset[str]  # the query parameters that carry one here


def host_view(name: str, secrets: Sequence[Secret]) -> Host:
    here = [secret for secret in secrets if name in secret.hosts]
    headers = CREDENTIAL_HEADERS | {p.header for s in here for p in s.places if p.header}
    queries = frozenset(p.query for s in here for p in s.places if p.query)
    return Host(name, {core(secret.placeholder): secret for secret in secrets}, frozenset(headers), queries)


def core(placeholder: str) -> str:
    """A placeholder without its kind's prefix: `agentbox-ph-` and its random part, what a scan finds."""
    return placeholder[placeholder.find(PLACEHOLDER_MARK):]


def leak(what: str, where: str, host: str) -> Refusal:
    return Refusal(403, f"attempted leak: {what} in {where}, where {host} does not take it")


def place(host: Host, method: str, path: str, normal: str, query: str, headers: Sequence[tuple[str, str]],
          real: Any) -> Placed:
    """The request with this VM's credential in its place. `real(secret)` reads the real value (it may refuse)."""
    used: dict[str, Secret] = {}
    swaps: list[tuple[str, Secret]] = []  # (where, secret), for the log and the count

    def own(value: str, found: str, where: str, spot: Place) -> Secret:
        """The secret whose placeholder `value` is (`found`: the scan's find in it), if it may go `where`."""
        secret = host.secrets.get(found)
        if secret is None:
            raise Refusal(403, f"attempted leak: another VM's placeholder in {where}")
        if value != secret.placeholder:
            raise leak("a placeholder", f"{where} (not as its whole value)", host.name)
        if host.name not in secret.hosts:
            raise Refusal(403, f"attempted leak: {secret.agent}'s placeholder sent to {host.name}, which is not one "
                               "of its hosts")
        if spot not in secret.places:
            taken = ", ".join(str(p) for p in secret.places)
            raise Refusal(403, f"attempted leak: {secret.agent}'s placeholder in {where}; its service takes it only "
                               f"in {taken}")
        routes = secret.routes.get(host.name)
        if routes is not None and not any(r.allows(method, normal) for r in routes):
            allowed = "; ".join(str(r) for r in routes)
            raise Refusal(403, f"{secret.agent}'s login goes to {host.name} only for {allowed}, not for "
                               f"{method} {normal}")
        used[secret.placeholder] = secret
        swaps.append((where, secret))
        return secret

    if placeholders_in(unquote(path).encode("utf-8", "surrogateescape")):
        raise leak("a placeholder", "the request's path", host.name)

    sent: list[str] = []
    kept: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in headers:
        lower = name.lower()
        if PLACEHOLDER.search(name.lower().encode("latin-1")):
            raise leak("a placeholder", "a header's name", host.name)
        found = placeholders_in(value.encode("latin-1"))
        if lower in host.headers:
            if lower in seen:
                raise Refusal(403, f"the {name} header twice: a credential is passed once")
            seen.add(lower)
            value = _swap_header(lower, value, found, own, real, sent, host.name)
        elif found:
            raise leak("a placeholder", f"the {name} header", host.name)
        kept.append((name, value))

    query = _swap_query(query, host, own, real, sent)
    if len(used) > 1:
        agents = ", ".join(sorted({secret.agent for secret in used.values()}))
        raise Refusal(403, f"the request carries {len(used)} credentials ({agents}); only one is passed")
    secret = next(iter(used.values()), None)
    return Placed(kept, query, secret, tuple(sent))


def _swap_header(name: str, value: str, found: list[str], own: Any, real: Any, sent: list[str], host: str) -> str:
    scheme, space, rest = value.partition(" ")
    lower_scheme = scheme.lower() if space else ""
    if lower_scheme == "basic":
        return _swap_basic(name, rest.strip(), found, own, real, sent, host)
    if len(found) > 1:
        raise leak("two placeholders", f"the {name} header", host)
    if not found:
        raise Refusal(403, f"the {name} header carries a credential that is not this VM's: only the VM's own login "
                           f"is passed to {host}")
    token = rest.strip() if space else value.strip()
    secret = own(token, found[0], f"the {name} header" + (f" ({scheme})" if space else ""), Place(name, lower_scheme))
    value_real = real(secret)
    sent.append(value_real)
    return f"{scheme} {value_real}" if space else value_real


def _swap_basic(name: str, encoded: str, found: list[str], own: Any, real: Any, sent: list[str], host: str) -> str:
    if found:
        raise leak("a placeholder", f"the {name} header (outside its Basic credentials)", host)
    try:
        user, colon, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise Refusal(403, "a malformed Basic authorization") from None
    in_user, in_password = placeholders_in(user.encode()), placeholders_in(password.encode())
    if in_user and in_password:
        raise leak("two placeholders", f"the {name} header's Basic credentials", host)
    if in_password:
        secret = own(password, in_password[0], f"the {name} header (Basic)", Place(name, "basic"))
        pair = f"{user}:{real(secret)}"
    elif in_user and colon and not password:
        secret = own(user, in_user[0], f"the {name} header (Basic, as the user name)", Place(name, "basic"))
        pair = f"{real(secret)}:"
    elif in_user:
        raise leak("a placeholder", f"the {name} header's Basic user name (with a password)", host)
    else:
        raise Refusal(403, f"the {name} header carries a credential that is not this VM's: only the VM's own login "
                           f"is passed to {host}")
    swapped = base64.b64encode(pair.encode()).decode()
    sent.append(swapped)
    return f"Basic {swapped}"


def _swap_query(query: str, host: Host, own: Any, real: Any, sent: list[str]) -> str:
    if not query:
        return query
    pairs = query.split("&")
    for index, pair in enumerate(pairs):
        raw_name, eq, raw_value = pair.partition("=")
        name, value = unquote(raw_name.replace("+", " ")), unquote(raw_value.replace("+", " "))
        if placeholders_in(name.encode("utf-8", "surrogateescape")):
            raise leak("a placeholder", "a query parameter's name", host.name)
        found = placeholders_in(value.encode("utf-8", "surrogateescape"))
        if name in host.queries:
            if not found:
                raise Refusal(403, f"the {name} query parameter carries a credential that is not this VM's: only "
                                   f"the VM's own login is passed to {host.name}")
            secret = own(value, found[0], f"the {name} query parameter", Place(query=name))
            value_real = real(secret)
            sent.append(value_real)
            pairs[index] = f"{raw_name}{eq}{quote(value_real, safe='')}"
        elif found:
            raise leak("a placeholder", f"the {name or 'unnamed'} query parameter", host.name)
    return "&".join(pairs)
