"""The credential broker's engine (agentbox/net/intercept.py through agentbox/net/proxy.py): placeholders swapped for
real values only on requests to their own hosts, foreign credentials and leaks refused, token endpoints answered on
the host, pushes refused, everything else tunnelled untouched. Real clients (http.client, curl, git) talk to the
proxy; tests/fake_upstream.py stands for the real hosts."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from agentbox.credentials.broker import ghcli
from agentbox.net import certauthority
from agentbox.net import proxy as netproxy
from agentbox.net.broker import Brokering, Secret
from tests.brokerharness import (
    CLAUDE,
    CLAUDE_KEY,
    CLAUDE_KEY_PH,
    CLAUDE_PH,
    CLAUDE_REAL,
    CREDENTIAL_HOSTS,
    GEMINI_API,
    GEMINI_KEY,
    GEMINI_KEY_PH,
    GH_PH,
    GH_REAL,
    GITHUB,
    GITHUB_API,
    OTHER,
    TOKEN_HOST,
    Harness,
    git_http_backend,
)
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.timeout(60)


def _sent(upstream: FakeUpstream, host: str, name: str) -> list[str]:
    return [value for request in upstream.requests_to(host) for key, value in request.raw_headers
            if key.lower() == name]


# -- substitution --------------------------------------------------------------------------------------------

def test_the_vms_placeholder_reaches_its_host_as_the_real_token_and_the_answer_comes_back(broker: Harness) -> None:
    broker.upstream.route("GET", "/api/oauth/profile", {"account": "me"}, host=CLAUDE,
                          authorization=f"Bearer {CLAUDE_REAL}")
    connection = broker.connection(CLAUDE)
    for _ in range(2):  # one TLS connection, two requests (keep-alive on both sides)
        connection.request("GET", "/api/oauth/profile", headers={"Authorization": f"Bearer {CLAUDE_PH}"})
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())) == (200, {"account": "me"})
    connection.close()
    assert _sent(broker.upstream, CLAUDE, "authorization") == [f"Bearer {CLAUDE_REAL}"] * 2
    entries = broker.logged("/api/oauth/profile", 2)
    assert [(e["decision"], e["agent"], e["status"]) for e in entries] == [("substitute", "claude", 200)] * 2
    assert CLAUDE_REAL not in broker.log.read_text() and CLAUDE_PH not in broker.log.read_text()


def test_a_new_client_connection_reuses_the_upstream_connection_the_last_one_left(broker: Harness) -> None:
    broker.upstream.route("GET", "/v1/models", {"data": []}, host=CLAUDE)
    for _ in range(3):
        status, _ = broker.request(CLAUDE, "GET", "/v1/models", {"x-api-key": CLAUDE_KEY_PH})
        assert status == 200
    assert broker.upstream.handshakes == [CLAUDE]  # one TLS handshake with the upstream for three connections
    assert len(broker.upstream.requests_to(CLAUDE)) == 3


def test_an_api_key_header_and_a_refreshed_host_token_are_used(broker: Harness) -> None:
    broker.upstream.route("POST", "/v1/messages", {"ok": True}, host=CLAUDE)
    status, _ = broker.request(CLAUDE, "POST", "/v1/messages?beta=true", {"x-api-key": CLAUDE_KEY_PH}, b'{"m": 1}')
    assert status == 200
    request = broker.upstream.requests_to(CLAUDE)[-1]
    assert (request.headers["x-api-key"], request.body, request.path) == (CLAUDE_KEY, b'{"m": 1}',
                                                                          "/v1/messages?beta=true")
    broker.tokens["claude"] = "sk-ant-oat01-REFRESHED"
    status, _ = broker.request(CLAUDE, "POST", "/v1/messages", {"Authorization": f"Bearer {CLAUDE_PH}"}, b"{}")
    assert status == 200
    assert broker.upstream.requests_to(CLAUDE)[-1].headers["authorization"] == "Bearer sk-ant-oat01-REFRESHED"


def test_a_request_without_a_credential_passes_unchanged(broker: Harness) -> None:
    broker.upstream.route("POST", "/api/event_logging/v2/batch", {"ok": True}, host=CLAUDE)
    status, _ = broker.request(CLAUDE, "POST", "/api/event_logging/v2/batch", {"X-Trace": "1"}, b"x" * 300_000)
    assert status == 200
    request = broker.upstream.requests_to(CLAUDE)[-1]
    assert (len(request.body), "authorization" in request.headers) == (300_000, False)
    assert broker.logged("/api/event_logging/v2/batch")[-1]["decision"] == "pass"


def test_curl_streams_a_chunked_upload_and_git_basic_auth_is_swapped(broker: Harness) -> None:
    broker.upstream.route("POST", "/v1/files", {"stored": True}, host=CLAUDE)
    result = broker.curl("-H", f"Authorization: Bearer {CLAUDE_PH}", "-H", "Transfer-Encoding: chunked",
                         "--data-binary", "@-", f"https://{CLAUDE}/v1/files")
    assert json.loads(result.stdout or "null") == {"stored": True}, result.stderr
    assert broker.upstream.requests_to(CLAUDE)[-1].headers["authorization"] == f"Bearer {CLAUDE_REAL}"

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    basic = "Basic " + base64.b64encode(f"x-access-token:{GH_REAL}".encode()).decode()
    broker.upstream.git_refs(GITHUB, "/owner/repo.git", {"refs/heads/main": "ab" * 20}, authorization=basic)
    bundle = broker.log.parent / "guest-bundle.pem"
    git = subprocess.run(["git", "-c", f"http.proxy=http://127.0.0.1:{broker.proxy.port}", "-c",
                          f"http.sslCAInfo={bundle}", "ls-remote", f"https://x-access-token:{GH_PH}@{GITHUB}/owner/repo.git"],
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": str(bundle.parent),
                                                                          "GIT_TERMINAL_PROMPT": "0"})
    assert git.stdout == f"{'ab' * 20}\trefs/heads/main\n", git.stderr


def test_a_git_clone_and_fetch_over_https_go_through_with_the_host_s_token_and_a_push_does_not(
        broker: Harness, tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    origin = tmp_path / "served" / "owner" / "repo.git"
    work = tmp_path / "work"
    git_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_TERMINAL_PROMPT": "0",
               "GIT_CONFIG_NOSYSTEM": "1"}

    def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args], cwd=cwd,
                              env=git_env, capture_output=True, text=True, timeout=60)

    assert git("init", "-q", "--bare", "--initial-branch=main", str(origin)).returncode == 0
    assert git("init", "-q", str(work)).returncode == 0
    (work / "README").write_text("one\n")
    assert git("add", "README", cwd=work).returncode == 0 and git("commit", "-qm", "one", cwd=work).returncode == 0
    assert git("push", "-q", str(origin), "HEAD:refs/heads/main", cwd=work).returncode == 0
    basic = "Basic " + base64.b64encode(f"x-access-token:{GH_REAL}".encode()).decode()
    for method in ("GET", "POST"):
        broker.upstream.route(method, "/owner/repo.git/info/refs", host=GITHUB,
                              handler=git_http_backend(origin.parent.parent, basic))
        broker.upstream.route(method, "/owner/repo.git/git-upload-pack", host=GITHUB,
                              handler=git_http_backend(origin.parent.parent, basic))
        broker.upstream.route(method, "/owner/repo.git/git-receive-pack", host=GITHUB,
                              handler=git_http_backend(origin.parent.parent, basic))
    bundle = broker.log.parent / "guest-bundle.pem"
    bundle.write_text(broker.ca.cert_pem())
    through = ["-c", f"http.proxy=http://127.0.0.1:{broker.proxy.port}", "-c", f"http.sslCAInfo={bundle}"]
    url = f"https://x-access-token:{GH_PH}@{GITHUB}/owner/repo.git"
    clone = git(*through, "clone", "-q", url, str(tmp_path / "clone"))
    assert clone.returncode == 0, clone.stderr
    assert (tmp_path / "clone" / "README").read_text() == "one\n"
    (work / "README").write_text("two\n")
    assert git("commit", "-qam", "two", cwd=work).returncode == 0
    assert git("push", "-q", str(origin), "HEAD:refs/heads/main", cwd=work).returncode == 0
    fetched = git(*through, "pull", "-q", "--ff-only", cwd=tmp_path / "clone")
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "clone" / "README").read_text() == "two\n"
    (tmp_path / "clone" / "README").write_text("three\n")
    assert git("commit", "-qam", "three", cwd=tmp_path / "clone").returncode == 0
    pushed = git(*through, "push", "-q", "origin", "HEAD:refs/heads/main", cwd=tmp_path / "clone")
    assert pushed.returncode != 0 and "403" in pushed.stderr
    assert git("rev-parse", "main", cwd=origin).stdout == git("rev-parse", "HEAD~1", cwd=tmp_path / "clone").stdout
    sent = [r.headers["authorization"] for r in broker.upstream.requests_to(GITHUB) if "authorization" in r.headers]
    assert sent and set(sent) == {basic}  # (git's first request of each command carries none and gets a 401)
    assert GH_PH not in "".join(str(r.headers) for r in broker.upstream.requests_to(GITHUB))


def test_a_query_parameter_carries_a_credential_only_where_its_service_documents_one(broker: Harness) -> None:
    broker.upstream.route("GET", "/v1beta/models", {"models": []}, host=GEMINI_API)
    status, _ = broker.request(GEMINI_API, "GET", f"/v1beta/models?pageSize=5&key={GEMINI_KEY_PH}&x=a%2Fb")
    assert status == 200
    assert broker.upstream.requests_to(GEMINI_API)[-1].path == f"/v1beta/models?pageSize=5&key={GEMINI_KEY}&x=a%2Fb"
    # GitHub takes no credential in a query (its Link headers echo the query: the real token would come back)
    broker.upstream.route("GET", "/user", {"login": "me"}, host=GITHUB_API)
    for query in (f"key={GH_PH}", f"access_token={GH_PH}", f"page={GH_PH}"):
        status, body = broker.request(GITHUB_API, "GET", f"/user?{query}&page=2")
        assert status == 403 and json.loads(body)["reason"].startswith("attempted leak: a placeholder in the "), body
    assert broker.upstream.requests_to(GITHUB_API) == []


# -- refusals ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers,reason", [
    ({"x-api-key": "sk-ant-api03-ATTACKERS-OWN-KEY"}, "a credential that is not this VM's"),
    ({"Authorization": "Bearer sk-ant-oat01-agentbox-ph-" + "ff" * 12}, "another VM's placeholder"),
    ({"Authorization": f"Bearer {CLAUDE_PH}", "x-api-key": CLAUDE_KEY_PH}, "carries 2 credentials"),
    ({"Authorization": f"Bearer {GH_PH}"}, "attempted leak: gh's placeholder sent to api.anthropic.com"),
    ({"x-api-key": "sk-ant-api03-other", "X-Note": f"token {CLAUDE_PH}"}, "not this VM's"),
    ({"X-Note": f"token {CLAUDE_PH}"}, "attempted leak: a placeholder in the X-Note header"),
    ({"x-api-key": GH_PH}, "attempted leak: gh's placeholder sent to api.anthropic.com"),
    ({"Authorization": f"Token {CLAUDE_PH}"}, "its service takes it only in the authorization header (Bearer)"),
])
def test_foreign_credentials_and_misplaced_placeholders_are_refused_and_nothing_goes_out(
        broker: Harness, headers: dict[str, str], reason: str) -> None:
    broker.upstream.route("POST", "/v1/messages", {"ok": True}, host=CLAUDE)
    status, body = broker.request(CLAUDE, "POST", "/v1/messages", headers, b"{}")
    answer = json.loads(body)
    assert status == 403 and reason in answer["reason"], answer
    assert answer["by"] == "agentbox credential broker"
    assert broker.upstream.requests_to(CLAUDE) == []
    entry = broker.logged("/v1/messages")[-1]
    assert entry["decision"] == "deny" and reason in entry["reason"]


def test_a_placeholder_in_a_body_bound_for_another_host_ends_the_request_before_it_is_complete(
        broker: Harness) -> None:
    broker.upstream.route("POST", "/v1/messages", {"ok": True}, host=CLAUDE)
    status, body = broker.request(CLAUDE, "POST", "/v1/messages", {"Authorization": f"Bearer {CLAUDE_PH}"},
                                  b"x" * 200_000 + GH_PH.encode() + b"y" * 1000)
    assert status == 403
    assert "gh's placeholder in the body of a request to api.anthropic.com" in json.loads(body)["reason"]
    # What went out before the placeholder was seen is a request cut short (the fake records even that).
    for request in broker.upstream.requests_to(CLAUDE):
        assert len(request.body) < int(request.headers["content-length"])
        assert GH_PH.encode() not in request.body


def test_a_placeholder_over_plain_http_is_an_attempted_leak(broker: Harness) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", broker.proxy.port, timeout=10)
    connection.request("GET", f"http://{OTHER}/collect?t={GH_PH}")
    response = connection.getresponse()
    assert response.status == 403
    assert "attempted leak: gh's placeholder" in json.loads(response.read())["reason"]


def test_a_host_without_a_login_now_gets_nothing(broker: Harness) -> None:
    broker.tokens["claude"] = None
    status, body = broker.request(CLAUDE, "GET", "/api/oauth/profile", {"Authorization": f"Bearer {CLAUDE_PH}"})
    assert status == 403 and "log in on the host" in json.loads(body)["reason"]
    assert broker.upstream.requests_to(CLAUDE) == []


def test_a_host_login_that_cannot_be_read_answers_503_and_sends_nothing(broker: Harness) -> None:
    def unreadable() -> str:
        raise ValueError("~/.claude/.credentials.json is not JSON")

    broker.proxy.set_broker(Brokering(
        leaves={CLAUDE: certauthority.server_context(broker.ca.leaf(CLAUDE))},
        secrets=(Secret("claude", CLAUDE_PH, frozenset({CLAUDE}), unreadable),),
        upstream_context=broker.upstream.client_context(), upstream_address=lambda host, port: broker.upstream.address))
    status, body = broker.request(CLAUDE, "GET", "/api/oauth/profile", {"Authorization": f"Bearer {CLAUDE_PH}"})
    assert status == 503 and "is not JSON" in json.loads(body)["reason"]
    assert broker.upstream.requests_to(CLAUDE) == []


def test_a_broker_that_could_not_be_made_answers_503_with_the_reason(broker: Harness) -> None:
    broker.proxy.set_broker(Brokering(leaves={CLAUDE: certauthority.server_context(broker.ca.leaf(CLAUDE))},
                                      down="~/.codex/auth.json: its tokens.id_token is not a JWT"))
    status, body = broker.request(CLAUDE, "GET", "/v1/models", {"x-api-key": CLAUDE_PH})
    answer = json.loads(body)
    assert status == 503 and "is not a JWT" in answer["reason"] and "agentbox stop" in answer["fix"]
    assert broker.upstream.requests == []


def test_the_host_header_and_the_sni_name_must_be_the_connected_host(broker: Harness) -> None:
    status, body = broker.request(CLAUDE, "GET", "/", {"Host": GITHUB_API, "Authorization": f"Bearer {CLAUDE_PH}"})
    assert status == 403 and "Host header" in json.loads(body)["reason"]
    raw = socket.create_connection(("127.0.0.1", broker.proxy.port), timeout=10)
    raw.sendall(f"CONNECT {CLAUDE}:443 HTTP/1.1\r\nHost: {CLAUDE}:443\r\n\r\n".encode())
    assert raw.recv(100).startswith(b"HTTP/1.1 200")
    with pytest.raises(ssl.SSLError):
        broker.client_context().wrap_socket(raw, server_hostname=GITHUB_API)  # asks for another name: no leaf
    assert broker.upstream.requests == []


def test_an_upstream_with_another_hosts_certificate_gets_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOX_STATE_DIR", str(tmp_path / "state"))
    authority = certauthority.ensure("agentbox-impostor", [GITHUB_API])
    with FakeUpstream(tmp_path / "up", [GITHUB_API], impostor={GITHUB_API: "evil.example.com"}) as upstream:
        brokering = Brokering(leaves={GITHUB_API: certauthority.server_context(authority.leaf(GITHUB_API))},
                              secrets=(Secret("gh", GH_PH, frozenset({GITHUB_API}), lambda: GH_REAL,
                                              ghcli.PLACES),),
                              upstream_context=upstream.client_context(),
                              upstream_address=lambda host, port: upstream.address)
        with netproxy.start(netproxy.Policy(allow=[GITHUB_API]), tmp_path / "log.jsonl", broker=brokering) as proxy:
            context = ssl.create_default_context(cafile=str(authority.cert))
            connection = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=context, timeout=10)
            connection.set_tunnel(GITHUB_API, 443)
            connection.request("GET", "/user", headers={"Authorization": f"token {GH_PH}"})
            response = connection.getresponse()
            assert response.status == 502
            assert "not valid for api.github.com" in json.loads(response.read())["reason"]
        assert upstream.requests == []


# -- token endpoints and pushes ------------------------------------------------------------------------------

def test_a_token_endpoint_is_answered_on_the_host(broker: Harness) -> None:
    request = {"grant_type": "refresh_token", "refresh_token": "sk-ant-ort01-agentbox-ph-x"}
    status, body = broker.request(TOKEN_HOST, "POST", "/v1/oauth/token", {"Content-Type": "application/json"},
                                  json.dumps(request).encode())
    assert (status, json.loads(body)) == (200, {"access_token": CLAUDE_PH, "expires_in": 3600})
    assert [json.loads(e.body) for e in broker.exchanges] == [request]
    assert broker.upstream.requests == []
    assert broker.logged("/v1/oauth/token")[-1]["decision"] == "answer"


@pytest.mark.parametrize("method,host,path,body,allowed", [
    ("GET", GITHUB, "/owner/repo.git/info/refs?service=git-receive-pack", None, False),
    ("POST", GITHUB, "/owner/repo.git/git-receive-pack", b"0000", False),
    ("GET", GITHUB, "/owner/repo.git/info/refs?service=git-upload-pack", None, True),
    ("POST", GITHUB_API, "/repos/o/r/issues", b"{}", False),
    ("DELETE", GITHUB_API, "/repos/o/r", None, False),
    ("GET", GITHUB_API, "/repos/o/r", None, True),
    ("POST", GITHUB_API, "/graphql", b'{"query": "mutation { addStar(input: {}) { clientMutationId } }"}', False),
    ("POST", GITHUB_API, "/graphql", b'{"query": "# mutation in a comment\\nquery { viewer { login } }"}', True),
    ("POST", GITHUB_API, "/graphql", b'{"query": "{ viewer { name(x: \\"mutation\\") } }"}', True),
    ("POST", GITHUB_API, "/graphql", b'[{"query": "{ a }"}, {"query": "mutation M { b }"}]', False),
    ("POST", GITHUB_API, "/graphql", b"not json", False),
])
def test_pushes_and_api_writes_to_github_are_refused(broker: Harness, method: str, host: str, path: str,
                                                     body: bytes | None, allowed: bool) -> None:
    broker.upstream.route(method, path.split("?")[0], {"ok": True}, host=host)
    status, answer = broker.request(host, method, path, {"Authorization": f"token {GH_PH}"}, body)
    if allowed:
        assert status == 200, answer
        assert broker.upstream.requests_to(host)[-1].headers["authorization"] == f"token {GH_REAL}"
    else:
        refusal = json.loads(answer)
        assert status == 403 and "read-only" in refusal["reason"]
        assert refusal["allow"].startswith("sync.remoteWrite: true")
        # what gh prints from a refusal ("gh: <message> (HTTP 403)"): the reason and what allows it
        assert refusal["message"] == f"agentbox credential broker: {refusal['reason']} (allowed by {refusal['allow']})"
        assert broker.upstream.requests_to(host) == []


# -- everything else -----------------------------------------------------------------------------------------

def test_other_hosts_are_tunnelled_untouched(broker: Harness) -> None:
    broker.upstream.route("GET", "/page", {"page": 1}, host=OTHER)
    # A tunnel to the fake upstream's own address (a listed literal; loopback allowed as in the tests of the proxy).
    target = f"127.0.0.1:{broker.upstream.port}"
    broker.proxy.set_policy(netproxy.Policy(allow=[*CREDENTIAL_HOSTS, target], allow_loopback=True))
    raw = socket.create_connection(("127.0.0.1", broker.proxy.port), timeout=10)
    raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert raw.recv(100).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context(cafile=str(broker.upstream.ca_file))  # the broker's CA is NOT trusted
    tls = context.wrap_socket(raw, server_hostname=OTHER)
    tls.sendall(f"GET /page HTTP/1.1\r\nHost: {OTHER}\r\nAuthorization: Bearer anything-goes\r\n"
                "Connection: close\r\n\r\n".encode())
    answer = b""
    while piece := tls.recv(65536):
        answer += piece
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"page": 1}'), answer
    assert broker.upstream.requests_to(OTHER)[-1].headers["authorization"] == "Bearer anything-goes"
