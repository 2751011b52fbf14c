"""The VM's proxy off a launch's critical path (issue 28): the launch binds its port and takes its lock before the
first limactl call (the process serving it starts beside that call, and nothing waits for it); it stops on its
signal, and whoever stops it is woken by its lock's release, not by polling; the process imports only what it
serves."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox.fsutil import private_dir
from agentbox.net import guard as netguard
from agentbox.net import policy as netpolicy
from tests.fake_limactl import read_calls
from tests.helpers import NAME, FakeLima, agentbox, staged_logins, write

REPO = Path(__file__).resolve().parent.parent


def refused_by_the_proxy(port: int) -> bytes:
    """A CONNECT the allowlist refuses, with the VM's proxy credentials: the answer shows the proxy process serves
    (not only its backlog)."""
    token = base64.b64encode(f"agentbox:{netguard.secret(NAME)}".encode()).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"CONNECT blocked.example:443 HTTP/1.1\r\nHost: blocked.example:443\r\n"
                     + f"Proxy-Authorization: Basic {token}\r\n\r\n".encode())
        return sock.recv(100)


@pytest.mark.parametrize("broker", [True, False])
def test_the_proxys_port_is_there_before_the_first_limactl_call(project: Path, vm: FakeLima, home: Path,
                                                                 broker: bool) -> None:
    if not broker:
        staged_logins(home)
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n")
    assert netguard.running(NAME) is None
    vm.clear()
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    calls = read_calls(vm.home)
    assert [call["argv"][0] for call in calls] == ["list", "shell"]  # the warm launch's calls, no more
    # The port file is written when the port listens (connections queue from then on): before limactl was asked.
    assert (netguard.folder(NAME) / "port").stat().st_mtime < calls[0]["start"]
    found = netguard.running(NAME)
    assert (found is not None) is broker  # the broker's proxy stays; a launch's own one goes
    if found is not None:
        assert found.started < calls[0]["start"]


def test_stopping_the_proxy_waits_for_its_lock_not_a_poll(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lease = netguard.begin(netpolicy.NetworkSettings(mode="allowlist"), NAME, {})
    assert lease is not None
    child = lease._child
    assert child is not None
    port = lease.port
    assert refused_by_the_proxy(port).startswith(b"HTTP/1.1 403")

    def no_polling(seconds: float) -> None:
        raise AssertionError(f"stop() slept {seconds} s to poll")

    with monkeypatch.context() as patched:
        patched.setattr(netguard.time, "sleep", no_polling)
        lease.release()
    assert netguard.running(NAME) is None
    assert child.wait(timeout=10) == 0  # it ended by its own SIGTERM path (a plain SIGTERM death is -15)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_the_proxy_process_ends_at_its_signal_and_imports_only_what_it_serves(home: Path, tmp_path: Path) -> None:
    private_dir(netguard.folder(NAME))
    netguard._write_policy(NAME, netpolicy.NetworkSettings(mode="allowlist"), {})
    # Its periodic check made an hour long: only the signal can end it in time.
    script = ("import sys; from agentbox.net import guard; guard.POLL_SEC = 3600; "
              f"sys.exit(guard.serve({NAME!r}))")
    imports = tmp_path / "importtime.txt"
    with imports.open("wb") as errors:
        process = subprocess.Popen([sys.executable, "-X", "importtime", "-c", script], stderr=errors,
                                   env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            found = netguard.running(NAME)
            if found is not None and found.pid == process.pid:
                break
            time.sleep(0.05)
        assert found is not None and found.pid == process.pid
        assert refused_by_the_proxy(found.port).startswith(b"HTTP/1.1 403")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert netguard.running(NAME) is None
    modules = {line.rsplit("|", 1)[1].strip() for line in imports.read_text().splitlines()
               if line.startswith("import time:") and "|" in line}
    assert "agentbox.net.proxy" in modules  # the control: the set was read
    assert not modules & {"yaml", "click", "jinja2", "agentbox.config.load", "agentbox.credentials.broker.brokered"}
