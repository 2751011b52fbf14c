"""OAuth token endpoints answered on the host: a refresh or a login from the VM never reaches the real endpoint
with anything the VM holds, its answer reaches the VM with placeholders only, and the VM never makes the host's
login what it wants.

One `TokenHandler` per agent (a `TokenEndpoint` of agentbox.net.broker), given an `OAuthLogin` that knows the
agent's host file and token shapes:

- grant_type=refresh_token: the refresh token sent must be this VM's placeholder (else 403, a foreign
  credential). Under the host file's lock, the file is read again; when its access token has more than
  MARGIN left, the VM gets the placeholders and the real expiry and nothing goes upstream (so concurrent
  refreshes refresh once); otherwise (or when its expiry is unknown) the REAL refresh token is sent to the real
  endpoint. Its answer is stored only when the host file still holds the refresh token that was sent (the host's
  own client takes no lock of ours and may have refreshed meanwhile: then its tokens win); the VM gets
  placeholders either way.
- a login (grant_type=authorization_code, or a device code's grant): accepted only while `agentbox AGENT login`
  runs for this VM (its one-shot window, agentbox.credentials.loginwindow), else 403 and logged as refused: the VM
  needs no placeholder to send one, since an attacker makes the code on their own machine. The first successful
  exchange uses the window. Its tokens are written to the host file when the host has no login or one of the same
  account; a login of another account (or one whose account cannot be told) waits pending on the host until the
  user says yes to `agentbox AGENT login`'s question. The VM gets placeholders.
- Codex's token exchange of its id token for an API key: 403 (the VM's id token is an unsigned placeholder, and
  Codex goes on without the key, as it does when that best-effort step fails).
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
from agentbox.credentials import loginwindow
from agentbox.errors import AgentboxError
from agentbox.net.broker import Exchange, Reply
from agentbox.safetext import visible

if TYPE_CHECKING:
    import ssl  # the network modules load only where a refresh is made (the broker process), not on a launch

    from agentbox.net.upstream import Route

MARGIN = 10 * 60  # seconds: an access token closer than this to its end is refreshed
UPSTREAM_TIMEOUT = 30
MAX_REPLY = 1 << 20
_FORWARDED = ("content-type", "accept", "user-agent", "anthropic-beta")  # nothing else of the VM's goes upstream
# The grants that log in (and yield the agent's tokens): accepted only inside `agentbox AGENT login`'s window.
LOGIN_GRANTS = ("authorization_code", "urn:ietf:params:oauth:grant-type:device_code")
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # Codex's id token -> API key, best-effort


class Tokens(NamedTuple):
    access: str
    refresh: str
    expires_at: float | None  # seconds since the epoch; None: unknown (refreshed when asked)
    id_token: str | None = None
    scope: str | None = None


class Switch(NamedTuple):
    """A login that would replace the host's login of another account (or one whose account cannot be told): the
    two accounts in words (an e-mail address), None where the login names none."""

    new: str | None
    old: str | None


class OAuthLogin(Protocol):
    """An agent's OAuth login on the host, as the token endpoints need it."""

    agent: str
    title: str  # "Claude Code"
    login_command: str  # "claude auth login", said in "log in on the host with ..."

    def tokens(self) -> Tokens | None:
        """The host's current tokens (None: logged out); a StateError for a malformed file."""

    def tokens_of(self, response: dict[str, Any], now: float) -> Tokens | None:
        """The tokens a login's token response holds (what the host file would hold once it is stored)."""

    def store(self, response: dict[str, Any], now: float) -> None:
        """Write a token response's tokens into the host file (called under the lock)."""

    def replaces(self, response: dict[str, Any], now: float) -> Switch | None:
        """Whether storing a login's token response would replace the host's login of another account (or one
        whose account cannot be told); None when the host has no login, or one of the same account."""

    def account_of(self, response: dict[str, Any], now: float) -> str | None:
        """A login's token response's account in words (None: it names none)."""

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
        # deferred: start-up (http.client and ssl, ~35 ms: only a token refresh posts)
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
                 clock: Callable[[], float] = time.time, vm: str | None = None) -> None:
        self.login = login
        self.upstream = upstream or Upstream()
        self.clock = clock
        self.vm = vm  # whose login window opens a login (None: none ever does)
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
            if grant in LOGIN_GRANTS:
                return self._log_in(exchange)
        except AgentboxError as exc:
            return _error(400, "invalid_grant", f"agentbox: {exc.message}")
        title = self.login.title
        if grant == TOKEN_EXCHANGE:
            return _refused(f"agentbox's broker does not exchange {title}'s id token for an API key: the VM's id "
                            f"token is a placeholder, and {title} goes on with its login without the key")
        shown = visible(grant[:64]) if isinstance(grant, str) else "a request without one"
        return _refused(f"agentbox's broker answers only refresh and login grants for {title}, not {shown}")

    def _refresh(self, exchange: Exchange, form: dict[str, Any], as_json: bool) -> Reply:
        with self.login.locked():
            tokens = self.login.tokens()
            if tokens is None:
                return self._logged_out()
            if form.get("refresh_token") != self.login.refresh_placeholder(tokens):
                return _refused("agentbox's broker refused a refresh token that is not this VM's (a foreign "
                                "credential)")
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
            current = self.login.tokens()  # read again: the host's own client may have refreshed meanwhile
            if current is None:
                return self._logged_out()
            if current.refresh != tokens.refresh:  # it did: its tokens are the host's, ours are dropped
                return _ok(self.login.placeholder_reply(current, None, now))
            self.login.store(answer, now)
            fresh = self.login.tokens()
            if fresh is None:
                return self._logged_out()
            return _ok(self.login.placeholder_reply(fresh, answer, now))

    def _log_in(self, exchange: Exchange) -> Reply:
        """A login from the VM: only inside the window `agentbox AGENT login` armed, and used by its first success."""
        agent, command = self.login.agent, f"`agentbox {self.login.agent} login`"
        with self.login.locked():  # one exchange at a time uses the window; a refresh waits for the store
            window = loginwindow.state(self.vm, agent, self.clock()) if self.vm else loginwindow.NONE
            if window == loginwindow.EXPIRED:
                return _refused(f"the login window of {command} has expired (it stays open "
                                f"{loginwindow.WINDOW // 60} minutes); run {command} again to log in")
            if window != loginwindow.OPEN:
                return _refused(f"a login from inside the VM is accepted only while {command} runs on the host "
                                f"(one login per run); run it there to log {self.login.title} in")
            status, answer = self._post(exchange, exchange.body)
            if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("access_token"), str):
                code = answer.get("error") if isinstance(answer, dict) else None
                return _error(status if 400 <= status < 500 else 502,
                              code if isinstance(code, str) and len(code) < 64 else "invalid_grant",
                              f"the {self.login.title} login was not accepted (the endpoint answered {status})")
            assert self.vm is not None
            now = self.clock()
            loginwindow.consume(self.vm, agent, self.login.account_of(answer, now))
            switch = self.login.replaces(answer, now)
            if switch is None:
                self.login.store(answer, now)
                tokens = self.login.tokens()
            else:  # another account's login: the host's stays until the user says yes on the host
                loginwindow.hold(self.vm, loginwindow.Pending(agent, now, answer, switch.new, switch.old))
                tokens = self.login.tokens_of(answer, now)
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


def _error(status: int, code: str, description: str, refused: bool = False) -> Reply:
    body = json.dumps({"error": code, "error_description": description}).encode()
    return Reply(status, (("Content-Type", "application/json"), ("Cache-Control", "no-store")), body,
                 description if refused else None)


def _refused(description: str) -> Reply:
    """403 in the OAuth error shape, logged by the proxy as a denial with this reason."""
    return _error(403, "forbidden", description, refused=True)


def _http_exception() -> type[Exception]:
    # deferred: start-up (http.client and ssl, ~35 ms: only a token refresh posts)
    import http.client

    return http.client.HTTPException
