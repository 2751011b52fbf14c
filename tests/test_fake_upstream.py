"""The fake upstream the broker's tests talk to (tests/fake_upstream.py): it serves as several hosts over TLS,
records what it was sent and answers what the test set."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream, info_refs

pytestmark = pytest.mark.timeout(60)

HOSTS = ["api.anthropic.com", "github.com", "api.github.com"]


class _To(http.client.HTTPSConnection):
    """An HTTPS connection to the fake upstream's address that asks for `host` by SNI and Host header."""

    def __init__(self, upstream: FakeUpstream, host: str, context: ssl.SSLContext | None = None) -> None:
        super().__init__(host, upstream.port, context=context or upstream.client_context(), timeout=10)
        self._address = upstream.address

    def connect(self) -> None:
        raw = socket.create_connection(self._address, timeout=10)
        assert self._context is not None  # type: ignore[attr-defined]
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


def _call(upstream: FakeUpstream, host: str, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    connection = _To(upstream, host)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", HOSTS, impostor={"api.github.com": "evil.example.com"}) as server:
        yield server


def test_it_serves_each_host_with_its_own_certificate_and_records_the_requests(upstream: FakeUpstream) -> None:
    upstream.route("POST", "/v1/oauth/token", json_body={"access_token": "real-access", "expires_in": 3600},
                   host="api.anthropic.com")
    status, body, headers = _call(upstream, "api.anthropic.com", "POST", "/v1/oauth/token?x=1",
                                  body=b'{"grant_type": "refresh_token"}', headers={"Content-Type": "application/json"})
    assert (status, json.loads(body)) == (200, {"access_token": "real-access", "expires_in": 3600})
    assert headers["Content-Type"] == "application/json"
    [request] = upstream.requests
    assert (request.host, request.method, request.path) == ("api.anthropic.com", "POST", "/v1/oauth/token?x=1")
    assert request.json() == {"grant_type": "refresh_token"} and request.headers["content-type"] == "application/json"
    # The route is for its host only: github.com has none, and says so.
    status, body, _ = _call(upstream, "github.com", "POST", "/v1/oauth/token")
    assert status == 404 and json.loads(body)["host"] == "github.com"
    assert [r.host for r in upstream.requests_to("github.com")] == ["github.com"]


def test_a_route_with_an_authorization_answers_only_that_one_header(upstream: FakeUpstream) -> None:
    upstream.route("GET", "/v1/models", json_body={"data": ["m"]}, authorization="Bearer real-token")
    assert _call(upstream, "api.anthropic.com", "GET", "/v1/models",
                 headers={"Authorization": "Bearer real-token"})[0] == 200  # control
    assert _call(upstream, "api.anthropic.com", "GET", "/v1/models",
                 headers={"Authorization": "Bearer placeholder"})[0] == 401
    assert _call(upstream, "api.anthropic.com", "GET", "/v1/models")[0] == 401
    connection = _To(upstream, "api.anthropic.com")
    connection.putrequest("GET", "/v1/models")
    connection.putheader("Authorization", "Bearer real-token")
    connection.putheader("Authorization", "Bearer other")
    connection.endheaders()
    assert connection.getresponse().status == 401
    connection.close()
    assert upstream.requests[-1].raw_headers.count(("Authorization", "Bearer other")) == 1


def test_git_smart_http_ref_advertisements_for_fetch_and_push(upstream: FakeUpstream, tmp_path: Path) -> None:
    sha = "1f" * 20
    upstream.git_refs("github.com", "/owner/repo.git", {"refs/heads/main": sha}, authorization="Basic dG9rZW4=")
    for service in ("git-upload-pack", "git-receive-pack"):
        status, body, headers = _call(upstream, "github.com", "GET", f"/owner/repo.git/info/refs?service={service}",
                                      headers={"Authorization": "Basic dG9rZW4="})
        assert status == 200 and headers["Content-Type"] == f"application/x-{service}-advertisement"
        assert body == info_refs(service, {"refs/heads/main": sha})
        prefix = {"git-upload-pack": b"001e", "git-receive-pack": b"001f"}[service]
        assert body.startswith(prefix + f"# service={service}\n0000".encode())
        assert f"{sha} refs/heads/main".encode() in body and body.endswith(b"0000")
    assert _call(upstream, "github.com", "GET", "/owner/repo.git/info/refs?service=git-upload-pack")[0] == 401
    assert _call(upstream, "api.anthropic.com", "GET", "/owner/repo.git/info/refs?service=git-upload-pack")[0] == 404


def test_real_git_reads_the_advertisement(upstream: FakeUpstream, tmp_path: Path) -> None:
    """git itself parses what the fake sends (ls-remote through a local redirect of github.com)."""
    sha = "2e" * 20
    upstream.git_refs("github.com", "/owner/repo.git", {"refs/heads/main": sha})
    result = subprocess.run(
        ["git", "-c", f"http.sslCAInfo={upstream.ca_file}", "-c",
         f"http.curloptResolve=github.com:{upstream.port}:127.0.0.1",
         "ls-remote", f"https://github.com:{upstream.port}/owner/repo.git"],
        capture_output=True, text=True, timeout=30, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                                                          "GIT_TERMINAL_PROMPT": "0"})
    if "curloptResolve" in result.stderr or "unknown" in result.stderr.lower():
        pytest.skip(f"this git cannot pin a host's address: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{sha}\trefs/heads/main\n"
    assert upstream.requests[0].path == "/owner/repo.git/info/refs?service=git-upload-pack"


def test_a_client_checks_each_hosts_certificate(upstream: FakeUpstream) -> None:
    upstream.route("GET", "/", json_body={})
    assert _call(upstream, "github.com", "GET", "/")[0] == 200  # control
    # An impostor host presents another name's certificate; a name it does not serve, its first host's.
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _call(upstream, "api.github.com", "GET", "/")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _call(upstream, "other.example.com", "GET", "/")
    # A client that does not trust the test CA refuses it altogether.
    connection = _To(upstream, "github.com", context=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        connection.request("GET", "/")
    connection.close()
