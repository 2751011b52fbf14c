"""The host's logins belong to the host (issue 36): the broker's token endpoints, driven directly against a fake
upstream. A code exchange from the VM is accepted only inside the one-shot window `agentbox AGENT login` arms on
the host; a login of another account waits, pending on the host, for the user's yes; a refresh is stored only when
it was made with the host file's own refresh token."""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest

from agentbox import paths
from agentbox.config.load import Config, load
from agentbox.credentials import loginwindow
from agentbox.credentials.broker import brokered
from agentbox.credentials.placeholders import is_placeholder
from agentbox.credentials.tokens import Upstream
from agentbox.net.broker import Exchange, Reply
from tests.fake_upstream import FakeUpstream, Request, Response, json_response
from tests.helpers import GUEST_PROXY, on_terminal

pytestmark = pytest.mark.timeout(60)

VM = "agentbox-test-vm"
HOSTS = ["platform.claude.com", "console.anthropic.com", "auth.openai.com", "oauth2.googleapis.com"]
ENDPOINT = {"claude": ("platform.claude.com", "/v1/oauth/token"), "codex": ("auth.openai.com", "/oauth/token"),
            "gemini": ("oauth2.googleapis.com", "/token")}
LOGIN_FILE = {"claude": ".claude/.credentials.json", "codex": ".codex/auth.json", "gemini": ".gemini/oauth_creds.json"}
COMMAND = {"claude": "agentbox claude login", "codex": "agentbox codex login", "gemini": "agentbox gemini login"}


def _jwt(claims: dict[str, Any], signature: bytes = b"REALSIGNATUREBYTES") -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    return ".".join([part(b'{"alg":"RS256","kid":"k1"}'), part(json.dumps(claims).encode()), part(signature)])


def _write(relative: str, doc: Any) -> Path:
    path = paths.home() / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)
    return path


# -- the host's logins, of the account "me" ----------------------------------------------------------------------


def _host_login(agent: str, expires_in: float | None = 3600, account: bool = True) -> Path:
    expires_ms = int((time.time() + expires_in) * 1000) if expires_in is not None else None
    if agent == "claude":
        _write(".claude.json", {"hasCompletedOnboarding": True, **({"oauthAccount": {
            "accountUuid": "acc-me", "emailAddress": "me@example.com"}} if account else {})})
        oauth: dict[str, Any] = {"accessToken": "sk-ant-oat01-HOSTACCESS0123456789",
                                 "refreshToken": "sk-ant-ort01-HOSTREFRESH0123456789", "scopes": ["user:inference"],
                                 "subscriptionType": "max"}
        if expires_ms is not None:
            oauth["expiresAt"] = expires_ms
        return _write(LOGIN_FILE[agent], {"claudeAiOauth": oauth})
    if agent == "codex":
        access = _jwt({"exp": int(time.time() + expires_in)} if expires_in is not None else {}, b"HOSTACCESSSIG")
        return _write(LOGIN_FILE[agent], {"OPENAI_API_KEY": None, "last_refresh": "2025-01-01T00:00:00Z", "tokens": {
            "id_token": _jwt(_codex_claims("me")), "access_token": access,
            "refresh_token": "rt_HOSTCODEXREFRESH0123", "account_id": "acct-me"}})
    doc: dict[str, Any] = {"access_token": "ya29.HOSTGEMINIACCESS", "refresh_token": "1//HOSTGEMINIREFRESH",
                           "token_type": "Bearer", "scope": "openid",
                           "id_token": _jwt({"sub": "sub-me", "email": "me@example.com"})}
    if expires_ms is not None:
        doc["expiry_date"] = expires_ms
    return _write(LOGIN_FILE[agent], doc)


def _codex_claims(who: str) -> dict[str, Any]:
    return {"sub": f"user-{who}", "email": f"{who}@example.com",
            "https://api.openai.com/auth": {"chatgpt_account_id": f"acct-{who}"}}


def _login_response(agent: str, who: str) -> dict[str, Any]:
    """What the real endpoint answers a code exchange with, for a login of the account `who`."""
    if agent == "claude":
        return {"token_type": "Bearer", "access_token": f"sk-ant-oat01-NEW{who.upper()}ACCESS0123",
                "refresh_token": f"sk-ant-ort01-NEW{who.upper()}REFRESH0123", "expires_in": 28800,
                "scope": "user:inference user:profile",
                "account": {"uuid": f"acc-{who}", "email_address": f"{who}@example.com"},
                "organization": {"uuid": "org-1", "name": "Org"}}
    if agent == "codex":
        return {"id_token": _jwt(_codex_claims(who), b"NEWIDSIG"),
                "access_token": _jwt({"exp": int(time.time()) + 86400, "who": who}, b"NEWACCESSSIG"),
                "refresh_token": f"rt_NEW{who.upper()}REFRESH0123"}
    return {"access_token": f"ya29.NEW{who.upper()}ACCESS", "refresh_token": f"1//NEW{who.upper()}REFRESH",
            "expires_in": 3599, "scope": "openid", "token_type": "Bearer",
            "id_token": _jwt({"sub": f"sub-{who}", "email": f"{who}@example.com"}, b"NEWIDSIG")}


def _secrets_of(response: dict[str, Any]) -> list[str]:
    return [response[key] for key in ("access_token", "refresh_token", "id_token") if key in response]


def _code_exchange(agent: str) -> Exchange:
    host, path = ENDPOINT[agent]
    if agent == "claude":
        body = {"grant_type": "authorization_code", "code": "attackers-own-code", "code_verifier": "v",
                "client_id": "c", "redirect_uri": "http://localhost:1/callback", "state": "s"}
        return Exchange(host, "POST", path, (("Content-Type", "application/json"),), json.dumps(body).encode())
    form = {"grant_type": "authorization_code", "code": "attackers-own-code", "code_verifier": "v",
            "client_id": "c", "redirect_uri": "http://localhost:1455/auth/callback"}
    return Exchange(host, "POST", path, (("Content-Type", "application/x-www-form-urlencoded"),),
                    urlencode(form).encode())


@pytest.fixture
def config(tmp_path: Path) -> Config:
    workspace = tmp_path / "work"
    workspace.mkdir()
    return load(workspace)


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", HOSTS) as server:
        yield server


def _answers(server: FakeUpstream, agent: str, answer: dict[str, Any], status: int = 200) -> list[Request]:
    seen: list[Request] = []
    host, path = ENDPOINT[agent]

    def handler(request: Request) -> Response:
        seen.append(request)
        return json_response(answer, status)
    server.route("POST", path, host=host, handler=handler)
    return seen


def _handler(config: Config, server: FakeUpstream, agent: str) -> Any:
    prepared = brokered.prepare(VM, config, [agent],
                                Upstream(server.client_context(), lambda host, port: server.address))
    return prepared.endpoints[ENDPOINT[agent]]


def _doc(reply: Reply) -> dict[str, Any]:
    doc = json.loads(reply.body)
    assert isinstance(doc, dict)
    return doc


def _assert_refused(reply: Reply, *words: str) -> None:
    assert reply.status == 403
    doc = _doc(reply)
    assert set(doc) == {"error", "error_description"} and doc["error"] == "forbidden"
    assert reply.refused is not None
    for word in words:
        assert word in reply.refused and word in doc["error_description"]


# -- the login window ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_code_exchange_from_the_vm_without_a_login_window_is_refused_and_nothing_goes_upstream(
        config: Config, upstream: FakeUpstream, agent: str) -> None:
    """The attack: the agent makes a code on the attacker's machine and sends the exchange from the VM."""
    path = _host_login(agent)
    before = path.read_bytes()
    seen = _answers(upstream, agent, _login_response(agent, "attacker"))
    reply = _handler(config, upstream, agent)(_code_exchange(agent))
    _assert_refused(reply, f"a login from inside the VM is accepted only while `{COMMAND[agent]}` runs on the host")
    assert seen == [] and upstream.requests == []
    assert path.read_bytes() == before
    assert loginwindow.pending(VM, agent) is None


def test_a_login_window_accepts_one_exchange_then_refuses_the_next(config: Config, upstream: FakeUpstream) -> None:
    seen = _answers(upstream, "claude", _login_response("claude", "me"))
    handler = _handler(config, upstream, "claude")  # no login on the host yet
    window = loginwindow.arm(VM, "claude")
    reply = handler(_code_exchange("claude"))
    assert reply.status == 200 and reply.refused is None
    assert len(seen) == 1 and seen[0].json()["code"] == "attackers-own-code"  # forwarded as it came
    host = json.loads((paths.home() / LOGIN_FILE["claude"]).read_text())["claudeAiOauth"]
    assert host["accessToken"] == "sk-ant-oat01-NEWMEACCESS0123"
    assert is_placeholder(_doc(reply)["access_token"]) and b"NEWME" not in reply.body
    # One use: a second exchange in the same window is refused, and nothing more goes upstream.
    again = handler(_code_exchange("claude"))
    _assert_refused(again, "`agentbox claude login` runs on the host")
    assert len(seen) == 1
    assert window.close() == loginwindow.Used("me@example.com")  # what `agentbox claude login` then names
    assert not loginwindow.window_file(VM, "claude").exists()


def test_an_exchange_the_endpoint_refuses_does_not_use_the_window(config: Config, upstream: FakeUpstream) -> None:
    """A wrong code (or a device flow's "authorization_pending") leaves the window open for the next try."""
    _answers(upstream, "gemini", {"error": "invalid_grant"}, status=400)
    handler = _handler(config, upstream, "gemini")
    loginwindow.arm(VM, "gemini")
    first = handler(_code_exchange("gemini"))
    assert first.status == 400 and first.refused is None
    _answers(upstream, "gemini", _login_response("gemini", "me"))
    assert handler(_code_exchange("gemini")).status == 200
    assert json.loads((paths.home() / LOGIN_FILE["gemini"]).read_text())["refresh_token"] == "1//NEWMEREFRESH"


def test_an_expired_login_window_is_refused(config: Config, upstream: FakeUpstream) -> None:
    seen = _answers(upstream, "claude", _login_response("claude", "me"))
    handler = _handler(config, upstream, "claude")
    window = loginwindow.arm(VM, "claude", now=time.time() - loginwindow.WINDOW - 1)
    reply = handler(_code_exchange("claude"))
    _assert_refused(reply, "expired", "`agentbox claude login`")
    assert seen == [] and not (paths.home() / LOGIN_FILE["claude"]).exists()
    window.close()
    # Control: the same window, armed now, is accepted.
    loginwindow.arm(VM, "claude")
    assert handler(_code_exchange("claude")).status == 200 and len(seen) == 1


def test_a_window_for_another_agent_or_vm_does_not_open_this_one(config: Config, upstream: FakeUpstream) -> None:
    seen = _answers(upstream, "claude", _login_response("claude", "me"))
    handler = _handler(config, upstream, "claude")
    loginwindow.arm(VM, "codex")
    loginwindow.arm("agentbox-other-vm", "claude")
    _assert_refused(handler(_code_exchange("claude")), "`agentbox claude login` runs on the host")
    assert seen == []
    # A window file that names another agent (under this agent's name) opens nothing either.
    loginwindow.window_file(VM, "claude").write_text(json.dumps({
        "version": 1, "agent": "codex", "expires": time.time() + 600, "id": "x"}))
    _assert_refused(handler(_code_exchange("claude")), "`agentbox claude login` runs on the host")
    assert seen == []


def test_the_window_file_is_private_and_closing_removes_only_its_own(config: Config) -> None:
    first = loginwindow.arm(VM, "claude")
    path = loginwindow.window_file(VM, "claude")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["agent"] == "claude" and 0 < doc["expires"] - time.time() <= loginwindow.WINDOW
    second = loginwindow.arm(VM, "claude")  # another `agentbox claude login` for the same VM
    assert first.close() is None
    assert path.exists()  # the second one's window stays
    assert second.close() is None  # closed unused
    assert not path.exists()


def test_codex_s_api_key_exchange_is_refused_with_its_reason(config: Config, upstream: FakeUpstream) -> None:
    """Codex exchanges the id_token it got for an API key, best-effort: the VM's id_token is an unsigned
    placeholder, and the broker does not mint a real key for the VM's login; Codex goes on without one."""
    _host_login("codex")
    seen = _answers(upstream, "codex", {"access_token": "sk-proj-REALAPIKEY0123456789"})
    handler = _handler(config, upstream, "codex")
    loginwindow.arm(VM, "codex")
    host, path = ENDPOINT["codex"]
    form = {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "client_id": "c",
            "requested_token": "openai-api-key", "subject_token": _jwt(_codex_claims("me"), b"agentbox-unsigned"),
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token"}
    reply = handler(Exchange(host, "POST", path, (("Content-Type", "application/x-www-form-urlencoded"),),
                             urlencode(form).encode()))
    _assert_refused(reply, "API key")
    assert seen == []


def test_other_grants_are_refused_and_say_so_in_the_log(config: Config, upstream: FakeUpstream) -> None:
    _host_login("claude")
    handler = _handler(config, upstream, "claude")
    loginwindow.arm(VM, "claude")  # a window opens logins, nothing else
    host, path = ENDPOINT["claude"]
    reply = handler(Exchange(host, "POST", path, (("Content-Type", "application/json"),),
                             json.dumps({"grant_type": "client_credentials"}).encode()))
    _assert_refused(reply, "client_credentials")
    assert upstream.requests == []


# -- a login of another account ----------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_login_of_another_account_waits_pending_on_the_host(config: Config, upstream: FakeUpstream,
                                                              agent: str) -> None:
    path = _host_login(agent)
    before = path.read_bytes()
    response = _login_response(agent, "other")
    _answers(upstream, agent, response)
    handler = _handler(config, upstream, agent)
    loginwindow.arm(VM, agent)
    reply = handler(_code_exchange(agent))
    assert reply.status == 200 and reply.refused is None
    answer = _doc(reply)
    assert is_placeholder(answer["access_token"])
    for secret in _secrets_of(response):
        assert secret.encode() not in reply.body
    assert path.read_bytes() == before  # untouched until the user says yes
    pending = loginwindow.pending(VM, agent)
    assert pending is not None
    assert (pending.new, pending.old) == ("other@example.com", "me@example.com")
    assert pending.response == response
    held = loginwindow.pending_file(VM, agent)
    assert stat.S_IMODE(held.stat().st_mode) == 0o600
    assert held.parent == paths.vm_state_dir(VM) / "broker"  # the host's state folder, never the VM's
    # The VM's placeholder still stands for the host's login.
    secret = next(s for s in brokered.prepare(VM, config, [agent]).secrets if s.agent == agent)
    assert secret.real() not in _secrets_of(response)


def test_a_login_of_an_account_the_host_file_does_not_name_waits_too(config: Config, upstream: FakeUpstream) -> None:
    path = _host_login("claude", account=False)  # ~/.claude.json names no account
    before = path.read_bytes()
    _answers(upstream, "claude", _login_response("claude", "me"))
    loginwindow.arm(VM, "claude")
    assert _handler(config, upstream, "claude")(_code_exchange("claude")).status == 200
    assert path.read_bytes() == before
    pending = loginwindow.pending(VM, "claude")
    assert pending is not None and (pending.new, pending.old) == ("me@example.com", None)


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_login_of_the_same_account_is_written_at_once(config: Config, upstream: FakeUpstream, agent: str) -> None:
    path = _host_login(agent)
    response = _login_response(agent, "me")
    _answers(upstream, agent, response)
    loginwindow.arm(VM, agent)
    reply = _handler(config, upstream, agent)(_code_exchange(agent))
    assert reply.status == 200
    assert loginwindow.pending(VM, agent) is None
    text = path.read_text()
    assert response["refresh_token"] in text and response["access_token"] in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_pending_login_replaces_the_host_s_with_a_backup_when_accepted(config: Config,
                                                                             upstream: FakeUpstream) -> None:
    path = _host_login("codex")
    before = path.read_bytes()
    response = _login_response("codex", "other")
    _answers(upstream, "codex", response)
    loginwindow.arm(VM, "codex")
    assert _handler(config, upstream, "codex")(_code_exchange("codex")).status == 200
    pending = loginwindow.pending(VM, "codex")
    assert pending is not None
    login = brokered.file_login(VM, config, "codex")
    assert login is not None
    login.replace_with(pending.response, pending.at)
    doc = json.loads(path.read_text())
    assert doc["tokens"]["refresh_token"] == response["refresh_token"]
    assert doc["tokens"]["account_id"] == "acct-other"  # not the previous login's account
    assert path.with_name("auth.json.agentbox-backup").read_bytes() == before
    assert stat.S_IMODE(path.with_name("auth.json.agentbox-backup").stat().st_mode) == 0o600


# -- refreshes ------------------------------------------------------------------------------------------------


def _refresh(agent: str, config: Config, upstream: FakeUpstream) -> tuple[Reply, Any]:
    """A refresh from the VM with its own placeholder refresh token."""
    prepared = brokered.prepare(VM, config, [agent],
                                Upstream(upstream.client_context(), lambda host, port: upstream.address))
    vm = json.loads(prepared.files[LOGIN_FILE[agent]])
    refresh = (vm["claudeAiOauth"]["refreshToken"] if agent == "claude"
               else vm["tokens"]["refresh_token"] if agent == "codex" else vm["refresh_token"])
    host, path = ENDPOINT[agent]
    if agent == "gemini":
        exchange = Exchange(host, "POST", path, (("Content-Type", "application/x-www-form-urlencoded"),),
                            urlencode({"grant_type": "refresh_token", "refresh_token": refresh,
                                       "client_id": "c"}).encode())
    else:
        exchange = Exchange(host, "POST", path, (("Content-Type", "application/json"),), json.dumps(
            {"grant_type": "refresh_token", "refresh_token": refresh, "client_id": "c"}).encode())
    return prepared.endpoints[ENDPOINT[agent]](exchange), vm


def test_a_refresh_is_not_stored_when_the_host_refreshed_its_own_login_meanwhile(
        config: Config, upstream: FakeUpstream) -> None:
    """The host's own Claude Code does not take agentbox's lock: it may rotate the refresh token while the
    broker's refresh is on its way. Its tokens win; the VM gets the placeholders of the host's current ones."""
    path = _host_login("claude", expires_in=-60)
    hosts_own = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-HOSTSOWNNEW0123", "refreshToken":
                                   "sk-ant-ort01-HOSTSOWNNEW0123", "expiresAt": int((time.time() + 7200) * 1000),
                                   "scopes": ["user:inference"]}}
    seen: list[Request] = []

    def meanwhile(request: Request) -> Response:
        seen.append(request)
        path.write_text(json.dumps(hosts_own))  # the host's Claude Code refreshed while we asked
        return json_response({"access_token": "sk-ant-oat01-BROKERSNEW0123", "expires_in": 28800,
                              "refresh_token": "sk-ant-ort01-BROKERSNEW0123"})
    upstream.route("POST", ENDPOINT["claude"][1], host=ENDPOINT["claude"][0], handler=meanwhile)
    reply, vm = _refresh("claude", config, upstream)
    assert reply.status == 200 and len(seen) == 1
    assert json.loads(path.read_text()) == hosts_own  # not overwritten with the broker's tokens
    answer = _doc(reply)
    assert answer["access_token"] == vm["claudeAiOauth"]["accessToken"]
    assert 7000 < answer["expires_in"] <= 7200  # the host's current login's expiry
    assert b"BROKERSNEW" not in reply.body and b"HOSTSOWN" not in reply.body


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_login_of_unknown_expiry_is_refreshed_on_the_host_and_stored(config: Config, upstream: FakeUpstream,
                                                                         agent: str) -> None:
    """No expiresAt / expiry_date / access-token exp: the broker cannot tell the token is still good, so a refresh
    from the VM is made upstream (with the real refresh token) and its answer stored."""
    path = _host_login(agent, expires_in=None)
    real_refresh = {"claude": "sk-ant-ort01-HOSTREFRESH0123456789", "codex": "rt_HOSTCODEXREFRESH0123",
                    "gemini": "1//HOSTGEMINIREFRESH"}[agent]
    response = _login_response(agent, "me")
    if agent == "gemini":
        del response["refresh_token"]  # Google's refresh keeps the refresh token
    seen = _answers(upstream, agent, response)
    reply, _ = _refresh(agent, config, upstream)
    assert reply.status == 200, reply.body
    [request] = seen
    sent = request.json() if agent != "gemini" else dict(parse_qsl(request.body.decode()))
    assert sent["refresh_token"] == real_refresh
    stored = json.loads(path.read_text())
    if agent == "claude":
        assert stored["claudeAiOauth"]["accessToken"] == response["access_token"]
        assert stored["claudeAiOauth"]["refreshToken"] == response["refresh_token"]
        assert stored["claudeAiOauth"]["expiresAt"] > (time.time() + 28000) * 1000  # the expiry is known now
        assert 28000 < _doc(reply)["expires_in"] <= 28800
    elif agent == "codex":
        assert stored["tokens"]["access_token"] == response["access_token"]
        assert stored["tokens"]["refresh_token"] == response["refresh_token"]
        assert 86000 < _doc(reply)["expires_in"] <= 86400
    else:
        assert stored["access_token"] == response["access_token"]
        assert stored["refresh_token"] == "1//HOSTGEMINIREFRESH"
        assert stored["expiry_date"] > (time.time() + 3500) * 1000
        assert 3500 < _doc(reply)["expires_in"] <= 3599
    for secret in _secrets_of(response):
        assert secret.encode() not in reply.body
    # Now the expiry is known: the next refresh is answered on the host without asking upstream.
    again, _ = _refresh(agent, config, upstream)
    assert again.status == 200 and len(seen) == 1


# -- through the CLI: `agentbox claude login` and the limactl double --------------------------------------------

# The stand-in `claude` in the VM: what Claude Code's login does at its end (the code exchange, through the VM's
# proxy), then it writes the tokens it got to its login file, as Claude Code does.
CLAUDE_LOGIN = "#!/usr/bin/python3\n" + GUEST_PROXY + r"""
import http.client, json, os, ssl, sys, time, urllib.parse
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
connection.set_tunnel("platform.claude.com", 443, headers=proxy_auth)
connection.request("POST", "/v1/oauth/token", body=json.dumps(
    {"grant_type": "authorization_code", "code": "the-code", "code_verifier": "v", "client_id": "c",
     "redirect_uri": "http://localhost:1/callback", "state": "s"}), headers={"Content-Type": "application/json"})
response = connection.getresponse()
tokens = json.loads(response.read())
print(json.dumps({"status": response.status, "tokens": tokens}), flush=True)
if response.status != 200:
    sys.exit(1)
path = os.path.expanduser("~/.claude/.credentials.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as out:
    json.dump({"claudeAiOauth": {"accessToken": tokens["access_token"], "refreshToken": tokens["refresh_token"],
                                 "expiresAt": int((time.time() + tokens["expires_in"]) * 1000),
                                 "scopes": tokens["scope"].split()}}, out)
"""


@pytest.fixture
def claude_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    """The real hosts, for the VM's broker: Claude's token endpoint answers a login of the account "other"."""
    with FakeUpstream(tmp_path / "upstream", ["platform.claude.com", "api.anthropic.com"]) as fake:
        fake.route("POST", "/v1/oauth/token", _login_response("claude", "other"), host="platform.claude.com")
        monkeypatch.setenv("AGENTBOX_TEST_BROKER_UPSTREAM",
                           json.dumps({"address": list(fake.address), "caFile": str(fake.ca_file)}))
        yield fake


def _guest_claude(lima: Any, text: str = CLAUDE_LOGIN) -> None:
    from tests.helpers import NAME

    path = lima.home / NAME / "guestfs" / "usr-local" / "bin" / "claude"
    path.write_text(text)
    path.chmod(0o755)


def test_a_login_inside_a_session_is_refused_and_agentbox_claude_login_makes_it_the_hosts(
        project: Path, vm: Any, claude_upstream: FakeUpstream) -> None:
    """With the broker on, the agent's own login in a normal session (Claude Code's /login) is refused; the same
    login under `agentbox claude login` is saved on the host, and the VM gets placeholders."""
    from tests.helpers import NAME, agentbox

    _guest_claude(vm)
    host_file = paths.home() / LOGIN_FILE["claude"]
    refused = agentbox(project, "shell", "--", "claude")
    assert refused.returncode == 1, refused.stderr
    answer = json.loads(refused.stdout.strip().splitlines()[-1])
    assert answer["status"] == 403
    assert ("a login from inside the VM is accepted only while `agentbox claude login` runs on the host"
            in answer["tokens"]["error_description"])
    assert claude_upstream.requests_to("platform.claude.com") == [] and not host_file.exists()

    result = agentbox(project, "claude", "login")
    assert result.returncode == 0, result.stderr
    assert len(claude_upstream.requests_to("platform.claude.com")) == 1
    saved = json.loads(host_file.read_text())["claudeAiOauth"]
    assert saved["refreshToken"] == "sk-ant-ort01-NEWOTHERREFRESH0123"
    assert stat.S_IMODE(host_file.stat().st_mode) == 0o600
    guest = json.loads((vm.guest_home(NAME) / LOGIN_FILE["claude"]).read_text())["claudeAiOauth"]
    assert is_placeholder(guest["accessToken"]) and is_placeholder(guest["refreshToken"])
    assert ("agentbox: ~/.claude/.credentials.json: the host is now logged in to Claude Code as other@example.com "
            "(the login made in the VM: the credential broker keeps it on the host, the VM holds placeholders)\n"
            ) in result.stderr
    assert "was not copied back" not in result.stderr
    assert not loginwindow.window_file(NAME, "claude").exists()  # closed when the command ended
    # The window is gone: the same exchange from a session is refused again.
    again = agentbox(project, "shell", "--", "claude")
    assert again.returncode == 1 and len(claude_upstream.requests_to("platform.claude.com")) == 1


def test_another_accounts_login_without_a_terminal_keeps_the_hosts(project: Path, vm: Any,
                                                                   claude_upstream: FakeUpstream) -> None:
    from tests.helpers import NAME, agentbox

    _guest_claude(vm)
    host_file = _host_login("claude")
    before = host_file.read_bytes()
    result = agentbox(project, "claude", "login")  # stdin is not a terminal: nobody to ask
    assert result.returncode == 0, result.stderr
    assert host_file.read_bytes() == before
    assert loginwindow.pending(NAME, "claude") is None and not loginwindow.pending_file(NAME, "claude").exists()
    assert ("agentbox: ~/.claude/.credentials.json: the Claude Code login made in the VM (other@example.com) was not "
            "saved: the host is logged in as me@example.com, and agentbox replaces the host's login of another "
            "account only when you say yes on a terminal. The host's login is kept (the VM goes on with it); run "
            "`agentbox claude login` on a terminal to replace it\n") in result.stderr
    assert "[y/N]" not in result.stderr


@pytest.mark.parametrize("answer", [b"y\n", b"n\n"])
def test_another_accounts_login_replaces_the_hosts_only_when_the_user_says_yes(
        project: Path, vm: Any, claude_upstream: FakeUpstream, answer: bytes) -> None:
    from tests.helpers import NAME

    _guest_claude(vm)
    host_file = _host_login("claude")
    before = host_file.read_bytes()
    code, output = on_terminal(project, ["claude", "login"], answer)
    assert code == 0, output
    assert "Replace the host's Claude Code login (me@example.com) with other@example.com? [y/N]" in output
    assert not loginwindow.pending_file(NAME, "claude").exists()
    backup = host_file.with_name(".credentials.json.agentbox-backup")
    if answer == b"y\n":
        saved = json.loads(host_file.read_text())["claudeAiOauth"]
        assert saved["refreshToken"] == "sk-ant-ort01-NEWOTHERREFRESH0123"
        assert "subscriptionType" not in saved  # nothing of the previous account's login is kept
        assert backup.read_bytes() == before
        assert ("agentbox: ~/.claude/.credentials.json: the host is now logged in to Claude Code as other@example.com"
                " (was me@example.com); the previous file is ~/.claude/.credentials.json.agentbox-backup") in output
    else:
        assert host_file.read_bytes() == before and not backup.exists()
        assert ("agentbox: ~/.claude/.credentials.json: the host's Claude Code login (me@example.com) is kept and the "
                "login made in the VM (other@example.com) discarded; the VM goes on with the host's login") in output


# -- write-back under the broker (issue 36, item 10) ---------------------------------------------------------------

# A stand-in `claude` that writes the given login file in the VM and exits.
WRITES_LOGIN = """#!/bin/sh
mkdir -p "$HOME/.claude"
cat > "$HOME/.claude/.credentials.json" <<'END'
{login}
END
"""
NOT_THROUGH_THE_BROKER = (
    "agentbox: ~/.claude/.credentials.json from the VM was not copied back to ~/.claude/.credentials.json: it holds "
    "tokens that did not come through the credential broker, which keeps the host's Claude Code login on the host "
    "and never copies the VM's file back; `agentbox claude login` logs the host in through the broker\n")


def test_a_brokered_login_file_the_vm_rewrote_is_not_judged_by_the_write_back(
        project: Path, vm: Any, claude_upstream: FakeUpstream) -> None:
    """The VM's copy holds this VM's placeholders (Claude Code rewrote the file after a refresh through the
    broker): there is nothing to copy back and nothing to say (it once said, falsely, that the host's file
    changed during the session)."""
    from tests.helpers import NAME, agentbox

    host_file = _host_login("claude")
    before = host_file.read_bytes()
    assert agentbox(project, "shell", "--", "true").returncode == 0
    staged = json.loads((vm.guest_home(NAME) / LOGIN_FILE["claude"]).read_text())["claudeAiOauth"]
    rewritten = {"claudeAiOauth": {**staged, "expiresAt": int((time.time() + 28800) * 1000)}}
    _guest_claude(vm, WRITES_LOGIN.format(login=json.dumps(rewritten)))
    for args in (["claude"], ["claude", "login"]):
        result = agentbox(project, *args)
        assert result.returncode == 0, result.stderr
        assert "was not copied back" not in result.stderr and "changed during the session" not in result.stderr
        assert host_file.read_bytes() == before


@pytest.mark.parametrize("host_has_login", [True, False])
def test_a_login_the_vm_made_past_the_broker_is_never_copied_back_and_says_why(
        project: Path, vm: Any, claude_upstream: FakeUpstream, host_has_login: bool) -> None:
    """Tokens in the VM's file that are not placeholders did not come through the broker: they never reach the
    host's file, even one that does not exist, and the note says so, not that the host's file changed."""
    from tests.helpers import agentbox

    host_file = paths.home() / LOGIN_FILE["claude"]
    before = _host_login("claude").read_bytes() if host_has_login else None
    foreign = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-ATTACKERSOWN0123456789",
                                 "refreshToken": "sk-ant-ort01-ATTACKERSOWN0123456789",
                                 "expiresAt": int((time.time() + 99999) * 1000), "scopes": ["user:inference"]}}
    _guest_claude(vm, WRITES_LOGIN.format(login=json.dumps(foreign)))
    result = agentbox(project, "claude")
    assert result.returncode == 0, result.stderr
    assert NOT_THROUGH_THE_BROKER in result.stderr
    assert (host_file.read_bytes() if before is not None else host_file.exists()) == (before or False)
    login = agentbox(project, "claude", "login")  # the same copy: not copied, and said once
    assert login.returncode == 0, login.stderr
    assert "was not copied back" not in login.stderr
    assert (host_file.read_bytes() if before is not None else host_file.exists()) == (before or False)
