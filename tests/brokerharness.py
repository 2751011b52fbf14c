"""The credential broker's test harness: a proxy with a broker (agentbox.net.proxy, agentbox.net.intercept) in front of
tests/fake_upstream.py standing for the real hosts, and clients that reach it as the VM does."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.credentials.broker import ghcli
from agentbox.credentials.filelogin import routes_of
from agentbox.net import certauthority
from agentbox.net import proxy as netproxy
from agentbox.net.broker import Brokering, Exchange, Reply, Secret, place
from tests.fake_upstream import FakeUpstream, Response

CLAUDE = "api.anthropic.com"
GITHUB = "github.com"
GITHUB_API = "api.github.com"
TOKEN_HOST = "platform.claude.com"
OTHER = "example.org"  # not a credential host: tunnelled
GEMINI_API = "generativelanguage.googleapis.com"
CODE_ASSIST = "cloudcode-pa.googleapis.com"
GOOGLE_OAUTH = "oauth2.googleapis.com"
GOOGLE_APIS = "www.googleapis.com"
CHATGPT = "chatgpt.com"
UPLOADS = "uploads.github.com"
CREDENTIAL_HOSTS = [CLAUDE, GITHUB, GITHUB_API, UPLOADS, "gist.github.com", TOKEN_HOST, GEMINI_API, CODE_ASSIST,
                    GOOGLE_OAUTH, GOOGLE_APIS, CHATGPT]
CLAUDE_PH = "sk-ant-oat01-agentbox-ph-" + "a1" * 12
CLAUDE_REAL = "sk-ant-oat01-REAL-host-token"
GH_PH = "gho_agentbox-ph-" + "b2" * 12
GH_REAL = "gho_REALhostGitHubToken"
CLAUDE_PLACES = (place("authorization bearer"),)
CLAUDE_KEY_PH = "sk-ant-api03-agentbox-ph-" + "c3" * 12
CLAUDE_KEY = "sk-ant-api03-REAL-host-api-key"
GEMINI_KEY_PH = "AIzaagentbox-ph-" + "d4" * 12
GEMINI_KEY = "AIzaREALhostGeminiKey"
GEMINI_PH = "ya29.agentbox-ph-" + "e5" * 12
GEMINI_REAL = "ya29.REAL-host-gemini-access-token"
CODEX_PH = "agentbox-ph-" + "f6" * 12
CODEX_REAL = "eyJREAL.host-codex-access.token"
REFRESH_REAL = "1//0gREAL-host/refresh+token"  # what the broker holds besides (a Google refresh token's shape)


def record_secret(agent: str, placeholder: str, real: str) -> Secret:
    """An agent's access-token Secret as its record says (hosts, places, routes), with a constant real value."""
    spec = BUILTIN_AGENTS[agent].broker
    assert spec is not None
    return Secret(agent, placeholder, frozenset(spec.access_hosts), lambda: real,
                  tuple(place(text) for text in spec.access_places), routes_of(spec.access_routes))


_SHARED: list[Path] = []


def shared_folder() -> Path:
    """This test process's folder for what is slow to make and the same for every test: the broker's CA and
    leaves, the fake upstream's certificates."""
    if not _SHARED:
        _SHARED.append(Path(tempfile.mkdtemp(prefix="abbroker")))
    return _SHARED[0]


def authority() -> certauthority.BrokerCA:
    folder = shared_folder()
    before = os.environ.get("AGENTBOX_STATE_DIR")
    os.environ["AGENTBOX_STATE_DIR"] = str(folder / "state")
    try:
        return certauthority.ensure("agentbox-broker-test", CREDENTIAL_HOSTS)
    finally:
        if before is None:
            del os.environ["AGENTBOX_STATE_DIR"]
        else:
            os.environ["AGENTBOX_STATE_DIR"] = before


class Harness:
    def __init__(self, upstream: FakeUpstream, proxy: netproxy.RunningProxy, authority: certauthority.BrokerCA,
                 log: Path, tokens: dict[str, str | None], exchanges: list[Exchange], brokering: Brokering) -> None:
        self.brokering = brokering  # what the proxy was started with (a test may start it again with a change)
        self.upstream = upstream
        self.proxy = proxy
        self.ca = authority
        self.log = log
        self.tokens = tokens
        self.exchanges = exchanges

    def client_context(self) -> ssl.SSLContext:
        """What the guest trusts: the broker's CA, and the upstream's test CA standing for the public roots."""
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.load_verify_locations(cafile=str(self.upstream.ca_file))
        return context

    def connection(self, host: str) -> http.client.HTTPSConnection:
        connection = http.client.HTTPSConnection("127.0.0.1", self.proxy.port, context=self.client_context(),
                                                 timeout=20)
        connection.set_tunnel(host, 443)
        return connection

    def request(self, host: str, method: str, path: str, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> tuple[int, bytes]:
        connection = self.connection(host)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def logged(self, path: str, count: int = 1) -> list[dict[str, Any]]:
        """The log's entries for requests to `path` once there are `count` (each is written as its request ends,
        a moment after the client has its answer)."""
        deadline = time.monotonic() + 10
        while True:
            found = [entry for entry in self.entries() if entry.get("path") == path]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

    def curl(self, *args: str) -> subprocess.CompletedProcess[str]:
        bundle = self.log.parent / "guest-bundle.pem"
        bundle.write_text(self.ca.cert_pem() + self.upstream.ca_file.read_text())
        return subprocess.run(["curl", "-sS", "--proxy", f"http://127.0.0.1:{self.proxy.port}", "--cacert",
                               str(bundle), "--max-time", "20", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The `broker` fixture (tests/conftest.py): a proxy with a broker for this VM's placeholders in front of a fake
    upstream standing for every credential host."""
    monkeypatch.setenv("AGENTBOX_STATE_DIR", str(tmp_path / "state"))
    made = authority()
    tokens: dict[str, str | None] = {"claude": CLAUDE_REAL, "gh": GH_REAL}
    exchanges: list[Exchange] = []

    def token_endpoint(exchange: Exchange) -> Reply:
        exchanges.append(exchange)
        return Reply(200, (("Content-Type", "application/json"),),
                     json.dumps({"access_token": CLAUDE_PH, "expires_in": 3600}).encode())

    with FakeUpstream(shared_folder() / "upstream", [*CREDENTIAL_HOSTS, OTHER]) as upstream:
        brokering = Brokering(
            leaves={host: certauthority.server_context(made.leaf(host)) for host in CREDENTIAL_HOSTS},
            secrets=(Secret("claude", CLAUDE_PH, frozenset({CLAUDE}), lambda: tokens["claude"], CLAUDE_PLACES),
                     Secret("gh", GH_PH, ghcli.HOSTS, lambda: tokens["gh"], ghcli.PLACES),
                     record_secret("gemini", GEMINI_PH, GEMINI_REAL), record_secret("codex", CODEX_PH, CODEX_REAL),
                     Secret("claude", CLAUDE_KEY_PH, frozenset({CLAUDE}), lambda: CLAUDE_KEY, (place("x-api-key"),)),
                     Secret("gemini", GEMINI_KEY_PH, frozenset({GEMINI_API}), lambda: GEMINI_KEY,
                            (place("x-goog-api-key"), place("?key")))),
            endpoints={(TOKEN_HOST, "/v1/oauth/token"): token_endpoint},
            push_hint="sync.remoteWrite: true in the project's agentbox.yml (then agentbox trust)",
            held=lambda: [value for value in (tokens["claude"], tokens["gh"], CLAUDE_KEY, GEMINI_KEY, GEMINI_REAL,
                                              CODEX_REAL, REFRESH_REAL) if value],
            upstream_context=upstream.client_context(),
            upstream_address=lambda host, port: upstream.address,
        )
        policy = netproxy.Policy(allow=[*CREDENTIAL_HOSTS, OTHER], resolver=lambda host, port: [upstream.address[0]],
                                 allow_lan=True)
        # OTHER is tunnelled to whatever the resolver says: the fake upstream's port stands in for 443.
        log = tmp_path / "log.jsonl"
        with netproxy.start(policy, log, broker=brokering) as proxy:
            yield Harness(upstream, proxy, made, log, tokens, exchanges, brokering)


def git_http_backend(root: Path, basic: str) -> Any:
    """A route handler serving the repositories under `root` with git's own smart-HTTP server, for requests that
    carry exactly the `basic` Authorization."""
    def serve(request: Any) -> Response:
        if request.headers.get("authorization") != basic:
            return Response(401, b"Authentication failed\n", "text/plain", {"WWW-Authenticate": 'Basic realm="GitHub"'})
        path, _, query = request.path.partition("?")
        env = {"PATH": "/usr/bin:/bin", "GIT_PROJECT_ROOT": str(root), "GIT_HTTP_EXPORT_ALL": "1",
               "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": request.method,
               "CONTENT_TYPE": request.headers.get("content-type", ""), "CONTENT_LENGTH": str(len(request.body)),
               "HTTP_CONTENT_ENCODING": request.headers.get("content-encoding", ""),
               "GIT_PROTOCOL": request.headers.get("git-protocol", ""), "REMOTE_USER": "x-access-token"}
        output = subprocess.run(["git", "http-backend"], input=request.body, env=env, capture_output=True,
                                timeout=30).stdout
        head, _, body = output.partition(b"\r\n\r\n")
        fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n") if ": " in line)
        status = int(fields.pop("Status", "200").split()[0])
        return Response(status, body, fields.pop("Content-Type", "application/octet-stream"), fields)
    return serve
