"""network.uploadLimit and the bytes counted per host (agentbox.net.uploads), through the real CLI on the double.

The double's guest shares the host's network, so a program in it reaches the VM's proxy as a VM would; the proxy
process knows the test's sink server as sink.test (proxy.TEST_RESOLVE). The sink counts what reaches it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox.net import guard as netguard
from agentbox.net import proxy as netproxy
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, run_cli, staged_logins, write

pytestmark = pytest.mark.timeout(120)

# In the guest: through $HTTPS_PROXY, a CONNECT tunnel to sink.test that sends argv[2] KiB, then a second CONNECT,
# then a plain-HTTP POST with a small body; prints what each got back.
UPLOADER = GUEST_PROXY + r"""
import json, socket, sys
target, kib = sys.argv[1], int(sys.argv[2])

def head(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return None, data
        data += chunk
    first, _, rest = data.partition(b"\r\n\r\n")
    return int(first.split()[1]), rest

def rest_of(s, rest):
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return rest
        rest += chunk

def connect():
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n"
               % (target, target, proxy_auth["Proxy-Authorization"])).encode())
    return s

report = {}
s = connect()
status, _ = head(s)
sent = 0
try:
    for _ in range(kib):
        s.sendall(b"x" * 1024)
        sent += 1024
    s.shutdown(socket.SHUT_WR)
    rest_of(s, b"")
except OSError:
    pass
report["tunnel"] = {"status": status, "sent": sent}
s = connect()
status, rest = head(s)
report["again"] = {"status": status, "body": json.loads(rest_of(s, rest) or b"{}") if status != 200 else None}
s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
s.sendall(("POST http://%s/ HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\nContent-Length: 5\r\n\r\nhello"
           % (target, target, proxy_auth["Proxy-Authorization"])).encode())
status, rest = head(s)
report["post"] = {"status": status, "body": json.loads(rest_of(s, rest) or b"{}") if status != 200 else None}
print(json.dumps(report))
"""


class Sink:
    """A TCP server on 127.0.0.1 that reads each connection to its end and counts the bytes."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.port = self.server.getsockname()[1]
        self.received = 0
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self.drain, args=(conn,), daemon=True).start()

    def drain(self, conn: socket.socket) -> None:
        """Count to the end; a plain-HTTP request (the uploader's POST, body "hello") gets a 200 at its body's end."""
        seen = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                self.received += len(data)
                seen = (seen + data)[-4096:]
                if seen.startswith(b"POST ") and seen.endswith(b"\r\n\r\nhello"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return


@pytest.fixture
def sink(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sink]:
    staged_logins(home)
    monkeypatch.setenv(netproxy.TEST_RESOLVE, "sink.test=127.0.0.1")
    server = Sink()
    yield server
    server.server.close()


def upload(project: Path, port: int, kib: int) -> tuple[dict, str]:
    result = agentbox(project, "shell", "--", "python3", "-c", UPLOADER, f"sink.test:{port}", str(kib))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def log_entries() -> list[dict]:
    return [json.loads(line) for line in netguard.log_path(NAME).read_text().splitlines()]


def test_uploads_past_the_cap_are_cut_refused_and_said_once_at_the_sessions_end(project: Path, vm: FakeLima,
                                                                                  sink: Sink) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['sink.test:{sink.port}']\n"
                                    "  uploadLimit: 64KiB\n")
    report, stderr = upload(project, sink.port, 256)

    assert report["tunnel"]["status"] == 200
    assert sink.received <= 64 * 1024  # the tunnel was cut before it passed the cap
    assert report["again"]["status"] == 403
    body = report["again"]["body"]
    assert body["blocked"] == "sink.test" and body["cap"] == 64 * 1024 and body["capText"] == "64 KiB"
    assert body["reason"] == "upload cap: 64 KiB sent to sink.test in this session (network.uploadLimit)"
    assert body["raise"].startswith("network.uploadLimit in agentbox.yml (now 64 KiB per host and session")
    assert report["post"]["status"] == 413 and report["post"]["body"]["cap"] == 64 * 1024

    decisions = [(entry["host"], entry["decision"]) for entry in log_entries()]
    assert decisions == [("sink.test", "cap")] * 3
    notice = ("agentbox: warning: uploads to sink.test were stopped at 64 KiB (network.uploadLimit); "
              "`agentbox net log --hosts` shows what each host was sent")
    assert stderr.count(notice) == 1, stderr

    # the next session starts a new window: the host takes uploads again, up to the cap
    again, stderr = upload(project, sink.port, 16)
    assert again["tunnel"] == {"status": 200, "sent": 16 * 1024}
    assert again["again"]["status"] == 200 and again["post"]["status"] != 413
    assert "uploads to sink.test were stopped" not in stderr


def test_without_a_cap_the_same_upload_goes_through(project: Path, vm: FakeLima, sink: Sink) -> None:
    # control for the test above: the same upload with `uploadLimit: false`
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['sink.test:{sink.port}']\n"
                                    "  uploadLimit: false\n")
    report, stderr = upload(project, sink.port, 256)
    assert report["tunnel"] == {"status": 200, "sent": 256 * 1024}
    assert report["again"]["status"] == 200 and report["post"]["status"] != 413
    assert "stopped at" not in stderr
    assert "cap" not in {entry["decision"] for entry in log_entries()}


def test_net_log_hosts_sums_up_and_down_per_host_in_this_window(project: Path, vm: FakeLima, sink: Sink) -> None:
    write(project / "agentbox.yml", f"network:\n  mode: allowlist\n  allow: ['sink.test:{sink.port}']\n")
    report, _ = upload(project, sink.port, 100)
    assert report["tunnel"]["status"] == 200

    result = run_cli("net", "log", "--hosts", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["uploadLimit"] == 50 << 20
    assert summary["since"] == netguard.upload_window(NAME)
    (row,) = summary["hosts"]
    assert row["host"] == "sink.test" and row["requests"] == 3 and row["capped"] == 0
    assert 100 * 1024 < row["up"] < 100 * 1024 + 2048  # the tunnel's bytes, the POST's head and body
    assert row["up"] == sum(entry["bytes_up"] for entry in log_entries())

    table = run_cli("net", "log", "--hosts", cwd=project, env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["HOST", "REQUESTS", "UP", "DOWN", "AT", "CAP"]
    assert lines[1].split()[:2] == ["sink.test", "3"] and lines[1].split()[-1] == "-"
    assert all(len(line) <= 80 for line in lines)
    assert "uploads per host since" in table.stderr and "cap 50 MiB per host" in table.stderr


@pytest.mark.parametrize("text, message", [
    ("network:\n  uploadLimit: 0\n", "must be larger than zero"),
    ("network:\n  uploadLimit: lots\n", "'lots' is not a size"),
    ("network:\n  uploadLimit: true\n", 'expected a size such as "5MiB", found True'),
])
def test_a_malformed_upload_limit_is_a_config_error_before_anything_starts(project: Path, limactl: FakeLima,
                                                                          text: str, message: str) -> None:
    write(project / "agentbox.yml", text)
    result = agentbox(project, "claude")
    assert result.returncode == 2
    assert "network.uploadLimit:" in result.stderr and message in result.stderr
    assert "or false for no cap" in result.stderr
    assert limactl.subcommands() == []
