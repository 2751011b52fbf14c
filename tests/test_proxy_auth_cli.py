"""Only this VM reaches its proxy, through the real CLI and the limactl double (issue 36): a session's proxy
variables carry the VM's proxy credentials (a secret made once per VM, 0600 in its network folder, the same across
proxy restarts), the proxy the launch started refuses a connection without them, and what agentbox shows on the
host (`net status`, `status`, describe) never holds the secret. tests/test_proxy_auth.py tests the proxy itself."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path

import pytest

from agentbox.net import guard as netguard
from tests.helpers import NAME, FakeLima, agentbox, run_cli, write

pytestmark = pytest.mark.timeout(180)


def connect(port: int, target: str, secret: str | None) -> bytes:
    """A CONNECT from outside the VM (with `secret` as the proxy password, or none): the answer's head and body."""
    auth = (f"Proxy-Authorization: Basic {base64.b64encode(f'agentbox:{secret}'.encode()).decode()}\r\n"
            if secret is not None else "")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_a_session_gets_the_vms_proxy_credentials_and_the_proxy_refuses_a_connection_without_them(
        project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    result = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s\\n" "$HTTPS_PROXY" "$http_proxy"')
    assert result.returncode == 0, result.stderr
    secret_file = netguard.folder(NAME) / netguard.SECRET_FILE
    secret = secret_file.read_text().strip()
    assert len(secret) == 32 and secret_file.stat().st_mode & 0o777 == 0o600
    running = netguard.running(NAME)  # the broker's proxy stays after the session (credentials.broker is on)
    assert running is not None
    url = f"http://agentbox:{secret}@host.lima.internal:{running.port}"
    assert result.stdout.splitlines() == [url, url]
    assert secret not in result.stderr

    refused = connect(running.port, "blocked.example:443", None)
    assert refused.startswith(b"HTTP/1.1 407 ") and b'Proxy-Authenticate: Basic realm="agentbox"' in refused
    assert connect(running.port, "blocked.example:443", "0" * 32).startswith(b"HTTP/1.1 407 ")
    # The control: with the VM's credentials the same CONNECT reaches the policy (which refuses the host).
    allowed_through = connect(running.port, "blocked.example:443", secret)
    assert allowed_through.startswith(b"HTTP/1.1 403 ") and b"agentbox net allow blocked.example" in allowed_through
    log = netguard.log_path(NAME).read_text()
    assert "no proxy credentials (Proxy-Authorization)" in log and secret not in log

    # What agentbox shows on the host: the URL with its secret masked.
    status = run_cli("net", "status", cwd=project)
    as_json = run_cli("net", "status", "--json", cwd=project)
    described = run_cli("status", "--json", cwd=project)
    for shown in (status, as_json, described):
        assert shown.exit_code == 0, shown.stderr
        assert secret not in shown.stdout + shown.stderr
    masked = f"http://agentbox:***@host.lima.internal:{running.port}"
    assert f"the VM's HTTPS_PROXY is {masked}" in status.stdout
    assert json.loads(as_json.stdout)["proxy"]["url"] == masked
    assert json.loads(described.stdout)["network"]["proxy"]["url"] == masked
    # Only the secret file and the session's env hold it (the context file, logs, records do not).
    holders = [path.relative_to(netguard.folder(NAME).parent) for path in netguard.folder(NAME).parent.rglob("*")
               if path.is_file() and secret.encode() in path.read_bytes()]
    assert sorted(map(str, holders)) == ["network/secret", "staging/env"]


def test_the_secret_is_the_vms_for_its_life_across_proxy_restarts(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    first = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "$HTTPS_PROXY"')
    assert first.returncode == 0, first.stderr
    before = netguard.running(NAME)
    assert before is not None
    assert agentbox(project, "stop").returncode == 0  # the proxy ends with the VM's stop
    assert netguard.running(NAME) is None
    second = agentbox(project, "shell", "--", "sh", "-c", 'printf "%s" "$HTTPS_PROXY"')
    assert second.returncode == 0, second.stderr
    after = netguard.running(NAME)
    assert after is not None and after.pid != before.pid  # another process ...
    secret = netguard.secret(NAME)
    assert first.stdout.split("@")[0] == second.stdout.split("@")[0] == f"http://agentbox:{secret}"  # ... same secret
    assert connect(after.port, "blocked.example:443", secret).startswith(b"HTTP/1.1 403 ")


def test_a_replaced_secret_file_reaches_the_running_proxy(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    assert agentbox(project, "shell", "--", "true").returncode == 0
    running = netguard.running(NAME)
    assert running is not None
    old = netguard.secret(NAME)
    secret_file = netguard.folder(NAME) / netguard.SECRET_FILE
    secret_file.unlink()
    new = netguard.secret(NAME)  # what the next launch does: a new one, which the running proxy takes
    assert new != old

    def answer(secret: str) -> bytes:
        return connect(running.port, "blocked.example:443", secret)[:12]

    from tests.helpers import wait_for

    wait_for(lambda: answer(new), 10, "the proxy to take the new secret", until=lambda got: got == b"HTTP/1.1 403")
    assert answer(old) == b"HTTP/1.1 407"
