"""The broker's credentials side (agentbox.credentials.broker.brokered): what the VM gets instead of the host's logins
(placeholders only), and the token endpoints that refresh on the host against a fake upstream."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox import paths
from agentbox.config.load import Config, load
from agentbox.credentials import loginfiles, loginwindow
from agentbox.credentials.broker import brokered
from agentbox.credentials.placeholders import Placeholders, is_placeholder
from agentbox.credentials.tokens import Upstream
from agentbox.errors import StateError
from agentbox.net.broker import PLACEHOLDER_MARK, Exchange, Reply
from tests.fake_upstream import FakeUpstream, Request, Response, json_response

pytestmark = pytest.mark.timeout(60)

VM = "agentbox-test-vm"
CLAUDE_ACCESS = "sk-ant-oat01-REALACCESSabcdefghijklmnop"
CLAUDE_REFRESH = "sk-ant-ort01-REALREFRESHabcdefghijklmno"
GH_TOKEN = "gho_REALGHTOKEN0123456789abcdef"
HOSTS = ["platform.claude.com", "console.anthropic.com", "auth.openai.com", "oauth2.googleapis.com"]


def _jwt(claims: dict[str, Any], signature: bytes = b"REALSIGNATUREBYTES") -> str:
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    return ".".join([part(b'{"alg":"RS256","kid":"k1"}'), part(json.dumps(claims).encode()), part(signature)])


def _home() -> Path:
    return paths.home()


def _write(relative: str, doc: Any, mode: int = 0o600) -> Path:
    path = _home() / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.chmod(path, mode)
    return path


def _claude_login(expires_in: float = 3600, mode: int = 0o600) -> Path:
    _write(".claude.json", {"hasCompletedOnboarding": True, "primaryApiKey": "sk-ant-api03-PRIMARYKEYREAL0123",
                            "oauthAccount": {"accountUuid": "acc-1", "emailAddress": "me@example.com"}})
    return _write(".claude/.credentials.json", {
        "claudeAiOauth": {"accessToken": CLAUDE_ACCESS, "refreshToken": CLAUDE_REFRESH,
                          "expiresAt": int((time.time() + expires_in) * 1000), "scopes": ["user:inference"],
                          "subscriptionType": "max"},
        "mcpOAuth": {"server": {"accessToken": "MCPSECRETTOKEN123456"}}}, mode)


def _gh_login(token: str = GH_TOKEN) -> Path:
    return _write(".config/gh/hosts.yml", f"github.com:\n    users:\n        octo:\n            oauth_token: {token}\n"
                  f"    git_protocol: https\n    oauth_token: {token}\n    user: octo\n"
                  "ghe.example.com:\n    oauth_token: ENTERPRISETOKEN12345\n    user: octo\n")


@pytest.fixture
def config(tmp_path: Path) -> Config:
    workspace = tmp_path / "work"
    workspace.mkdir()
    return load(workspace)


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", HOSTS) as server:
        yield server


def _upstream(server: FakeUpstream) -> Upstream:
    return Upstream(server.client_context(), lambda host, port: server.address)


def _vm_bytes(prepared: brokered.Prepared) -> bytes:
    return b"\n".join([*prepared.files.values(), *(v.encode() for v in prepared.env.values())])


def _exchange(host: str, path: str, body: dict[str, Any], form: bool = False) -> Exchange:
    if form:
        from urllib.parse import urlencode
        return Exchange(host, "POST", path, (("Content-Type", "application/x-www-form-urlencoded"),),
                        urlencode(body).encode())
    return Exchange(host, "POST", path, (("Content-Type", "application/json"),), json.dumps(body).encode())


def _reply(reply: Reply) -> dict[str, Any]:
    doc = json.loads(reply.body)
    assert isinstance(doc, dict)
    return doc


# -- placeholders ------------------------------------------------------------------------------------------------


def test_placeholders_are_stable_for_a_vm_unique_per_vm_and_kept_private() -> None:
    first = Placeholders(VM).get("claude.access", "sk-ant-oat01-")
    assert first.startswith("sk-ant-oat01-" + PLACEHOLDER_MARK) and len(first) == len("sk-ant-oat01-") + 12 + 24
    assert Placeholders(VM).get("claude.access", "sk-ant-oat01-") == first  # a new reader: the same
    assert Placeholders(VM).get("claude.refresh", "sk-ant-ort01-") != first.replace("oat01", "ort01")
    assert Placeholders("agentbox-other-vm").get("claude.access", "sk-ant-oat01-") != first
    folder = paths.vm_state_dir(VM) / "broker"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "placeholders.json").stat().st_mode) == 0o600


def test_prepare_gives_the_vm_claude_and_gh_logins_of_the_real_shape_without_a_real_byte(config: Config) -> None:
    _claude_login()
    _gh_login()
    prepared = brokered.prepare(VM, config, ["claude"])
    creds = json.loads(prepared.files[".claude/.credentials.json"])["claudeAiOauth"]
    assert creds["accessToken"].startswith("sk-ant-oat01-agentbox-ph-")
    assert creds["refreshToken"].startswith("sk-ant-ort01-agentbox-ph-")
    assert creds["subscriptionType"] == "max" and creds["scopes"] == ["user:inference"]
    claude_json = json.loads(prepared.files[".claude.json"])
    assert claude_json["oauthAccount"]["accountUuid"] == "acc-1" and "primaryApiKey" not in claude_json
    hosts_yml = prepared.files[".config/gh/hosts.yml"].decode()
    assert "gho_agentbox-ph-" in hosts_yml and "octo" in hosts_yml and "ghe.example.com" not in hosts_yml
    vm = _vm_bytes(prepared)
    for real in (CLAUDE_ACCESS, CLAUDE_REFRESH, GH_TOKEN, "PRIMARYKEYREAL", "MCPSECRETTOKEN", "ENTERPRISETOKEN"):
        assert real.encode() not in vm
    # The same VM gets the same placeholders at its next launch.
    assert brokered.prepare(VM, config, ["claude"]).files == prepared.files
    by_agent = {secret.agent: secret for secret in prepared.secrets}
    assert by_agent["claude"].hosts == {"api.anthropic.com"} and by_agent["claude"].real() == CLAUDE_ACCESS
    assert by_agent["gh"].hosts == {"github.com", "gist.github.com", "api.github.com", "uploads.github.com"}
    assert by_agent["gh"].real() == GH_TOKEN
    assert by_agent["claude"].placeholder == creds["accessToken"]
    assert ("platform.claude.com", "/v1/oauth/token") in prepared.endpoints
    assert {"platform.claude.com", "api.anthropic.com", "github.com"} <= prepared.hosts
    assert set(prepared.brokered) == {"claude", "gh"}
    assert "~/.claude/.credentials.json" in prepared.replaced and "~/.config/gh/hosts.yml" in prepared.replaced
    assert any("ghe.example.com" in note for note in prepared.notes)


def test_real_reads_the_hosts_current_token(config: Config) -> None:
    _gh_login()
    secret = next(s for s in brokered.prepare(VM, config, []).secrets if s.agent == "gh")
    assert secret.real() == GH_TOKEN
    _gh_login("gho_NEWTOKEN99999999999999999")
    assert secret.real() == "gho_NEWTOKEN99999999999999999"
    (_home() / ".config/gh/hosts.yml").unlink()
    assert secret.real() is None


def test_api_keys_in_the_configs_env_become_placeholders(config: Config) -> None:
    keyed = config._replace(env={"ANTHROPIC_API_KEY": "sk-ant-api03-REALKEY0123456789", "GH_TOKEN": GH_TOKEN})
    prepared = brokered.prepare(VM, keyed, ["claude"])
    assert prepared.env["ANTHROPIC_API_KEY"].startswith("sk-ant-api03-agentbox-ph-")
    assert prepared.env["GH_TOKEN"].startswith("gho_agentbox-ph-")
    assert b"REALKEY" not in _vm_bytes(prepared) and GH_TOKEN.encode() not in _vm_bytes(prepared)
    assert prepared.notes == []  # the API key is Claude Code's login: no "log in on the host"
    # and the file login's secret, whose real value is None until the host has a login
    assert {s.real() for s in prepared.secrets} == {"sk-ant-api03-REALKEY0123456789", GH_TOKEN, None}


def test_the_keychains_gh_token_goes_to_the_vm_as_a_placeholder(config: Config, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    _write(".config/gh/hosts.yml", "github.com:\n    user: octo\n    git_protocol: https\n")
    monkeypatch.setattr(loginfiles, "gh_token_from_keychain", lambda: "ghp_KEYCHAINTOKEN123456789")
    prepared = brokered.prepare(VM, config, [])
    assert prepared.env["GH_TOKEN"].startswith("ghp_agentbox-ph-")
    assert b"KEYCHAINTOKEN" not in _vm_bytes(prepared)


def test_a_missing_or_logged_out_host_login_says_how_to_log_in_and_stages_nothing(config: Config) -> None:
    prepared = brokered.prepare(VM, config, ["claude"])
    assert prepared.files == {}
    # Only the placeholder a login made later inside the VM will use; it stands for nothing until then.
    assert [(s.agent, s.real()) for s in prepared.secrets] == [("claude", None)]
    assert prepared.secrets[0].placeholder == brokered.Placeholders(VM).get("claude.access", "sk-ant-oat01-")
    # The way for people who do not run the agent on the host first, then the agent's own login on the host.
    assert any("is missing); log in with `agentbox claude login`" in n
               and "or, if you also run claude outside agentbox, on the host with `claude auth login`" in n
               for n in prepared.notes)
    assert any("log in on the host with `gh auth login`" in n for n in prepared.notes)
    # What Claude Code leaves after a failed refresh: empty tokens.
    _write(".claude/.credentials.json", {"claudeAiOauth": {"accessToken": "", "refreshToken": "", "expiresAt": 0}})
    prepared = brokered.prepare(VM, config, ["claude"])
    assert ".claude/.credentials.json" not in prepared.files
    assert any("holds no login" in n and "claude auth login" in n for n in prepared.notes)
    # Control: a login is staged and says nothing.
    _claude_login()
    assert not any("Claude Code" in n for n in brokered.prepare(VM, config, ["claude"]).notes)


@pytest.mark.parametrize("content, what", [
    ("{not json", "is not valid JSON"),
    ('["a list"]', "is not a JSON object"),
    ('{"claudeAiOauth": "text"}', "claudeAiOauth is not an object"),
    ('{"claudeAiOauth": {"accessToken": "a", "refreshToken": "b", "expiresAt": "soon"}}', "expiresAt"),
])
def test_a_malformed_host_login_is_an_error_naming_the_file(config: Config, content: str, what: str) -> None:
    path = _write(".claude/.credentials.json", content)
    with pytest.raises(StateError) as caught:
        brokered.prepare(VM, config, ["claude"])
    assert str(path) in caught.value.message and what in caught.value.message


def test_a_malformed_hosts_yml_is_an_error_naming_it(config: Config) -> None:
    path = _write(".config/gh/hosts.yml", "github.com: [unclosed\n")
    with pytest.raises(StateError) as caught:
        brokered.prepare(VM, config, [])
    assert str(path) in caught.value.message and "YAML" in caught.value.message


# -- refresh on the host (Claude Code) ------------------------------------------------------------------------


def _token_route(server: FakeUpstream, host: str, path: str, answer: dict[str, Any], seen: list[Request],
                 delay: float = 0) -> None:
    def handler(request: Request) -> Response:
        seen.append(request)
        time.sleep(delay)
        return json_response(answer)
    server.route("POST", path, host=host, handler=handler)


def _claude_refresh(prepared: brokered.Prepared, refresh: str | None = None, host: str = "platform.claude.com"
                    ) -> Reply:
    creds = json.loads(prepared.files[".claude/.credentials.json"])["claudeAiOauth"]
    body = {"grant_type": "refresh_token", "refresh_token": refresh or creds["refreshToken"],
            "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e"}
    return prepared.endpoints[(host, "/v1/oauth/token")](_exchange(host, "/v1/oauth/token", body))


def test_an_expired_claude_login_is_refreshed_on_the_host_with_the_real_refresh_token(
        config: Config, upstream: FakeUpstream) -> None:
    path = _claude_login(expires_in=-60, mode=0o640)
    seen: list[Request] = []
    _token_route(upstream, "platform.claude.com", "/v1/oauth/token", {
        "token_type": "Bearer", "access_token": "sk-ant-oat01-NEWACCESS0123456789", "expires_in": 28800,
        "refresh_token": "sk-ant-ort01-NEWREFRESH0123456789", "scope": "user:inference user:profile",
        "account": {"uuid": "acc-1"}}, seen)
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))
    inode = path.stat().st_ino
    reply = _claude_refresh(prepared)
    assert reply.status == 200
    [request] = seen
    assert request.json()["refresh_token"] == CLAUDE_REFRESH  # the real one went upstream
    answer = _reply(reply)
    assert answer["access_token"] == json.loads(prepared.files[".claude/.credentials.json"])["claudeAiOauth"][
        "accessToken"]
    assert is_placeholder(answer["refresh_token"]) and 28000 < answer["expires_in"] <= 28800
    assert b"NEWACCESS" not in reply.body and b"NEWREFRESH" not in reply.body
    host = json.loads(path.read_text())
    assert host["claudeAiOauth"]["accessToken"] == "sk-ant-oat01-NEWACCESS0123456789"
    assert host["claudeAiOauth"]["refreshToken"] == "sk-ant-ort01-NEWREFRESH0123456789"
    assert host["claudeAiOauth"]["subscriptionType"] == "max" and "mcpOAuth" in host  # the rest kept
    assert host["claudeAiOauth"]["expiresAt"] > (time.time() + 28000) * 1000
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_ino != inode  # replaced, mode kept
    assert [p.name for p in path.parent.iterdir()] == [".credentials.json"]  # no temporary left behind
    # The proxy's secret now gives the new token.
    assert next(s for s in prepared.secrets if s.agent == "claude").real() == "sk-ant-oat01-NEWACCESS0123456789"


def test_a_refresh_of_an_unexpired_login_is_answered_without_asking_upstream(
        config: Config, upstream: FakeUpstream) -> None:
    _claude_login(expires_in=3600)
    seen: list[Request] = []
    _token_route(upstream, "platform.claude.com", "/v1/oauth/token", {"access_token": "x"}, seen)
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))
    reply = _claude_refresh(prepared, host="console.anthropic.com")
    assert reply.status == 200 and seen == []
    assert 3500 < _reply(reply)["expires_in"] <= 3600


def test_concurrent_refreshes_refresh_once(config: Config, upstream: FakeUpstream) -> None:
    _claude_login(expires_in=-60)
    seen: list[Request] = []
    _token_route(upstream, "platform.claude.com", "/v1/oauth/token", {
        "access_token": "sk-ant-oat01-NEWACCESS0123456789", "expires_in": 28800,
        "refresh_token": "sk-ant-ort01-NEWREFRESH0123456789"}, seen, delay=0.3)
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))
    other = brokered.prepare(VM, config, ["claude"], _upstream(upstream))  # another broker process's handler
    replies: list[Reply] = []
    threads = [threading.Thread(target=lambda p=p: replies.append(_claude_refresh(p)))
               for p in (prepared, other, prepared, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [r.status for r in replies] == [200] * 4
    assert len(seen) == 1
    assert len({_reply(r)["access_token"] for r in replies}) == 1


def test_a_refresh_token_that_is_not_this_vms_placeholder_is_refused(config: Config, upstream: FakeUpstream) -> None:
    _claude_login(expires_in=-60)
    seen: list[Request] = []
    _token_route(upstream, "platform.claude.com", "/v1/oauth/token", {"access_token": "x"}, seen)
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))
    other_vm = Placeholders("agentbox-other-vm").get("claude.refresh", "sk-ant-ort01-")
    for foreign in (CLAUDE_REFRESH, other_vm, "sk-ant-ort01-attackers-own-token"):
        reply = _claude_refresh(prepared, refresh=foreign)
        assert reply.status == 403 and _reply(reply)["error"] == "forbidden"
    assert seen == []
    assert _claude_refresh(prepared).status == 200  # control: its own placeholder is answered


def test_a_failed_upstream_refresh_says_to_log_in_on_the_host_and_keeps_the_file(
        config: Config, upstream: FakeUpstream) -> None:
    path = _claude_login(expires_in=-60)
    before = path.read_bytes()
    upstream.route("POST", "/v1/oauth/token", host="platform.claude.com", json_body={"error": "invalid_grant"},
                   status=400)
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))
    reply = _claude_refresh(prepared)
    assert reply.status == 400 and "claude auth login" in _reply(reply)["error_description"]
    assert path.read_bytes() == before


def test_a_login_inside_the_vm_saves_the_real_tokens_on_the_host(config: Config, upstream: FakeUpstream) -> None:
    """Inside the window `agentbox claude login` arms (tests/test_broker_login.py: without one it is refused)."""
    seen: list[Request] = []
    _token_route(upstream, "platform.claude.com", "/v1/oauth/token", {
        "token_type": "Bearer", "access_token": "sk-ant-oat01-LOGGEDIN0123456789", "expires_in": 28800,
        "refresh_token": "sk-ant-ort01-LOGGEDIN0123456789", "scope": "user:inference"}, seen)
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))  # no login on the host yet
    body = {"grant_type": "authorization_code", "code": "the-code", "code_verifier": "v", "state": "s"}
    loginwindow.arm(VM, "claude")
    reply = prepared.endpoints[("platform.claude.com", "/v1/oauth/token")](
        _exchange("platform.claude.com", "/v1/oauth/token", body))
    assert reply.status == 200 and b"LOGGEDIN" not in reply.body
    assert seen[0].json() == body  # forwarded as it came
    host_file = _home() / ".claude/.credentials.json"
    assert json.loads(host_file.read_text())["claudeAiOauth"]["accessToken"] == "sk-ant-oat01-LOGGEDIN0123456789"
    assert stat.S_IMODE(host_file.stat().st_mode) == 0o600
    assert _reply(reply)["access_token"].startswith("sk-ant-oat01-agentbox-ph-")


def test_other_grants_are_refused(config: Config, upstream: FakeUpstream) -> None:
    _claude_login()
    prepared = brokered.prepare(VM, config, ["claude"], _upstream(upstream))
    reply = prepared.endpoints[("platform.claude.com", "/v1/oauth/token")](
        _exchange("platform.claude.com", "/v1/oauth/token", {"grant_type": "client_credentials"}))
    assert reply.status == 403 and upstream.requests == []


# -- Codex and Gemini --------------------------------------------------------------------------------------------


def test_codex_gets_an_unsigned_id_token_and_refreshes_on_the_host(config: Config, upstream: FakeUpstream) -> None:
    claims = {"email": "me@example.com", "https://api.openai.com/auth": {"chatgpt_account_id": "acct-9"},
              "exp": int(time.time()) + 3600}
    id_token = _jwt(claims)
    access = _jwt({"exp": int(time.time()) - 10}, b"ACCESSSIG")
    path = _write(".codex/auth.json", {"OPENAI_API_KEY": None, "tokens": {
        "id_token": id_token, "access_token": access, "refresh_token": "rt_REALCODEXREFRESH123",
        "account_id": "acct-9"}, "last_refresh": "2025-01-01T00:00:00Z"})
    seen: list[Request] = []
    new_access = _jwt({"exp": int(time.time()) + 86400}, b"NEWACCESSSIG")
    _token_route(upstream, "auth.openai.com", "/oauth/token", {
        "id_token": _jwt(claims, b"NEWIDSIG"), "access_token": new_access, "refresh_token": "rt_NEWCODEXREFRESH"},
        seen)
    prepared = brokered.prepare(VM, config, ["codex"], _upstream(upstream))
    vm = json.loads(prepared.files[".codex/auth.json"])
    assert vm["tokens"]["account_id"] == "acct-9" and vm["tokens"]["refresh_token"].startswith("rt_agentbox-ph-")
    vm_id = vm["tokens"]["id_token"]
    payload = vm_id.split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) == claims
    for real in (id_token, access, "REALSIGNATURE", "ACCESSSIG", "REALCODEXREFRESH"):
        assert real.encode() not in _vm_bytes(prepared)
    reply = prepared.endpoints[("auth.openai.com", "/oauth/token")](_exchange("auth.openai.com", "/oauth/token", {
        "client_id": "app", "grant_type": "refresh_token", "refresh_token": vm["tokens"]["refresh_token"]}))
    assert reply.status == 200 and seen[0].json()["refresh_token"] == "rt_REALCODEXREFRESH123"
    assert _reply(reply)["access_token"] == vm["tokens"]["access_token"]
    assert b"NEWACCESSSIG" not in reply.body and b"NEWIDSIG" not in reply.body and b"NEWCODEX" not in reply.body
    host = json.loads(path.read_text())
    assert host["tokens"]["access_token"] == new_access and host["tokens"]["refresh_token"] == "rt_NEWCODEXREFRESH"
    assert host["last_refresh"] != "2025-01-01T00:00:00Z"


def test_gemini_refreshes_on_the_host_in_googles_form_shape(config: Config, upstream: FakeUpstream) -> None:
    path = _write(".gemini/oauth_creds.json", {
        "access_token": "ya29.REALGEMINIACCESS", "refresh_token": "1//REALGEMINIREFRESH", "scope": "openid",
        "token_type": "Bearer", "id_token": _jwt({"sub": "42", "email": "me@example.com"}),
        "expiry_date": int((time.time() - 5) * 1000)})
    seen: list[Request] = []
    _token_route(upstream, "oauth2.googleapis.com", "/token", {
        "access_token": "ya29.NEWGEMINIACCESS", "expires_in": 3599, "scope": "openid", "token_type": "Bearer"}, seen)
    prepared = brokered.prepare(VM, config, ["gemini"], _upstream(upstream))
    vm = json.loads(prepared.files[".gemini/oauth_creds.json"])
    assert vm["access_token"].startswith("ya29.agentbox-ph-") and vm["refresh_token"].startswith("1//agentbox-ph-")
    assert b"REALGEMINI" not in _vm_bytes(prepared) and b"REALSIGNATURE" not in _vm_bytes(prepared)
    secret = next(s for s in prepared.secrets if s.agent == "gemini")
    assert "oauth2.googleapis.com" in secret.hosts  # tokeninfo
    reply = prepared.endpoints[("oauth2.googleapis.com", "/token")](_exchange(
        "oauth2.googleapis.com", "/token", {"grant_type": "refresh_token", "refresh_token": vm["refresh_token"],
                                            "client_id": "c", "client_secret": "public"}, form=True))
    assert reply.status == 200
    assert "refresh_token=1%2F%2FREALGEMINIREFRESH" in seen[0].body.decode()
    assert _reply(reply)["access_token"] == vm["access_token"] and b"NEWGEMINI" not in reply.body
    assert json.loads(path.read_text())["access_token"] == "ya29.NEWGEMINIACCESS"
    assert secret.real() == "ya29.NEWGEMINIACCESS"
