"""OAuth token endpoints answered on the host: a refresh or a code exchange from the VM never reaches the
real endpoint with anything the VM holds, and its answer reaches the VM with placeholders only.

One `TokenHandler` per agent (a `TokenEndpoint` of agentbox.net.broker), given an `OAuthLogin` that knows the
agent's host file and token shapes:

- grant_type=refresh_token: the refresh token sent must be this VM's placeholder (else 403, a foreign
  credential). Under the host file's lock, the file is read again; when its access token has more than
  MARGIN left, the VM gets the placeholders and the real expiry and nothing goes upstream (so concurrent
  refreshes refresh once); otherwise the REAL refresh token is sent to the real endpoint, the new tokens are
  written to the host file (atomically, its mode kept) and the VM gets placeholders.
- grant_type=authorization_code (a login inside the VM): forwarded as it is; the real tokens it returns are
  written to the host file, the VM gets placeholders.
- anything else: 403.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import parse_qsl, urlencode

from agentbox.agents.logins import jwt_claims
from agentbox.errors import AgentboxError
from agentbox.net.broker import Exchange, Reply

if TYPE_CHECKING:
    import ssl  # the network modules load only where a refresh is made (the broker process), not on a launch

    from agentbox.net.upstream import Route

MARGIN = 10 * 60  # seconds: an access token closer than this to its end is refreshed
UPSTREAM_TIMEOUT = 30
MAX_REPLY = 1 << 20
_FORWARDED = ("content-type", "accept", "user-agent", "anthropic-beta")  # nothing else of the VM's goes upstream


class Tokens(NamedTuple):
    access: str
    refresh: str
    expires_at: float | None  # seconds since the epoch; None: unknown (refreshed when asked)
    id_token: str | None = None
    scope: str | None = None


class OAuthLogin(Protocol):
    """An agent's OAuth login on the host, as the token endpoints need it."""

    agent: str
    login_command: str  # "claude auth login", said in "log in on the host with ..."

    def tokens(self) -> Tokens | None:
        """The host's current tokens (None: logged out); a StateError for a malformed file."""

    def store(self, response: dict[str, Any], now: float) -> None:
        """Write a token response's tokens into the host file (called under the lock)."""

    def locked(self) -> Any:
        """The host file's lock (a context manager)."""

    def placeholder_reply(self, tokens: Tokens, upstream: dict[str, Any] | None, now: float) -> dict[str, Any]:
        """The endpoint's own response shape, carrying this VM's placeholders for `tokens`."""

    def refresh_placeholder(self, tokens: Tokens) -> str:
        """This VM's placeholder for the refresh token."""


class Upstream(NamedTuple):
    """How the broker reaches the real endpoint: the system's trust store and the real address by default (tests
    give the fake upstream's, as agentbox.net.broker.Brokering does); through the company proxy when `route`
    names one for the host (agentbox.net.upstream, as the VM's own requests go)."""

    context: ssl.SSLContext | None = None
    address: Callable[[str, int], tuple[str, int]] | None = None
    route: Route | None = None

    def post(self, host: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        import http.client
        import socket
        import ssl

        context = self.context or ssl.create_default_context()
        proxy = self.route.via(host, 443, tls=True) if self.route is not None else None
        if proxy is not None:  # the company proxy's tunnel
            connection = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=UPSTREAM_TIMEOUT,
                                                     context=context)
            credentials = proxy.authorization()
            connection.set_tunnel(host, 443, headers={"Proxy-Authorization": credentials} if credentials else None)
        else:
            where = self.address(host, 443) if self.address else (host, 443)
            raw = socket.create_connection(where, timeout=UPSTREAM_TIMEOUT)
            try:
                sock = context.wrap_socket(raw, server_hostname=host)
            except BaseException:
                raw.close()
                raise
            connection = http.client.HTTPSConnection(host, 443, timeout=UPSTREAM_TIMEOUT, context=context)
            connection.sock = sock
        try:
            connection.request("POST", path, body=body, headers={**headers, "Host": host})
            response = connection.getresponse()
            return response.status, response.read(MAX_REPLY + 1)
        finally:
            connection.close()


def unsigned_jwt(token: str | None) -> str | None:
    """A JWT with the same non-secret claims and no valid signature (what the VM gets for an id_token)."""
    claims = jwt_claims(token)
    if not claims:
        return None
    for key in ("at_hash", "c_hash", "nonce"):  # derived from other secrets, or single-use
        claims.pop(key, None)
    header = {"alg": "RS256", "typ": "JWT"}
    return ".".join([_b64(json.dumps(header, separators=(",", ":")).encode()),
                     _b64(json.dumps(claims, separators=(",", ":")).encode()), _b64(b"agentbox-unsigned")])




def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenHandler:
    """A TokenEndpoint for one agent's OAuth token endpoint(s)."""

    def __init__(self, login: OAuthLogin, upstream: Upstream | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.login = login
        self.upstream = upstream or Upstream()
        self.clock = clock
        self.upstream_calls = 0  # for tests and the log: how many times the real endpoint was asked

    def __call__(self, exchange: Exchange) -> Reply:
        try:
            form, as_json = _parse(exchange)
        except ValueError:
            return _error(400, "invalid_request", "agentbox's broker could not read this token request")
        grant = form.get("grant_type")
        try:
            if grant == "refresh_token":
                return self._refresh(exchange, form, as_json)
            if grant == "authorization_code":
                return self._exchange_code(exchange)
        except AgentboxError as exc:
            return _error(400, "invalid_grant", f"agentbox: {exc.message}")
        return _error(403, "forbidden", f"agentbox's broker answers only refresh_token and authorization_code "
                                        f"grants for {self.login.agent}")

    def _refresh(self, exchange: Exchange, form: dict[str, Any], as_json: bool) -> Reply:
        with self.login.locked():
            tokens = self.login.tokens()
            if tokens is None:
                return self._logged_out()
            if form.get("refresh_token") != self.login.refresh_placeholder(tokens):
                return _error(403, "forbidden", "agentbox's broker refused a refresh token that is not this VM's "
                                                "(a foreign credential)")
            now = self.clock()
            if tokens.expires_at is not None and tokens.expires_at - now > MARGIN:
                return _ok(self.login.placeholder_reply(tokens, None, now))
            body = {**form, "refresh_token": tokens.refresh}
            status, answer = self._post(exchange, _encode(body, as_json))
            if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("access_token"), str):
                code = answer.get("error") if isinstance(answer, dict) else None
                return _error(status if 400 <= status < 500 else 502,
                              code if isinstance(code, str) and len(code) < 64 else "invalid_grant",
                              f"the host's {self.login.agent} login could not be refreshed (the endpoint answered "
                              f"{status}); log in on the host with `{self.login.login_command}`")
            now = self.clock()
            self.login.store(answer, now)
            fresh = self.login.tokens()
            if fresh is None:
                return self._logged_out()
            return _ok(self.login.placeholder_reply(fresh, answer, now))

    def _exchange_code(self, exchange: Exchange) -> Reply:
        status, answer = self._post(exchange, exchange.body)
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("access_token"), str):
            code = answer.get("error") if isinstance(answer, dict) else None
            return _error(status if 400 <= status < 500 else 502,
                          code if isinstance(code, str) and len(code) < 64 else "invalid_grant",
                          f"the {self.login.agent} login was not accepted (the endpoint answered {status})")
        with self.login.locked():
            now = self.clock()
            self.login.store(answer, now)
            tokens = self.login.tokens()
        if tokens is None:
            return self._logged_out()
        return _ok(self.login.placeholder_reply(tokens, answer, now))

    def _post(self, exchange: Exchange, body: bytes) -> tuple[int, Any]:
        headers = {name: value for name, value in exchange.headers if name.lower() in _FORWARDED}
        self.upstream_calls += 1
        try:
            status, data = self.upstream.post(exchange.host, exchange.path, headers, body)
        except (OSError, _http_exception()) as exc:
            return 502, {"error": "temporarily_unavailable", "reason": type(exc).__name__}
        try:
            return status, json.loads(data) if len(data) <= MAX_REPLY else None
        except (ValueError, RecursionError):
            return status, None

    def _logged_out(self) -> Reply:
        return _error(400, "invalid_grant", f"the host has no {self.login.agent} login: log in on the host with "
                                            f"`{self.login.login_command}`")


def _parse(exchange: Exchange) -> tuple[dict[str, Any], bool]:
    """The request's parameters, and whether it was JSON (the real endpoint is asked the same way)."""
    content_type = next((value for name, value in exchange.headers if name.lower() == "content-type"), "")
    text = exchange.body.decode("utf-8")
    if "json" in content_type.lower() or text.lstrip().startswith("{"):
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        return doc, True
    return dict(parse_qsl(text, keep_blank_values=True)), False


def _encode(form: dict[str, Any], as_json: bool) -> bytes:
    return json.dumps(form).encode() if as_json else urlencode(form).encode()


def _ok(doc: dict[str, Any]) -> Reply:
    return Reply(200, (("Content-Type", "application/json"), ("Cache-Control", "no-store")), json.dumps(doc).encode())


def _error(status: int, code: str, description: str) -> Reply:
    body = json.dumps({"error": code, "error_description": description}).encode()
    return Reply(status, (("Content-Type", "application/json"), ("Cache-Control", "no-store")), body)


def _http_exception() -> type[Exception]:
    import http.client

    return http.client.HTTPException
