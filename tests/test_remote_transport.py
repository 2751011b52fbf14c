"""The SSH transport (agentbox.remote.ssh) against a real sshd on 127.0.0.1, with a second local user standing
for the remote machine and the limactl double on its PATH (tests/remotehost.py, the remote_hosts fixture)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentbox.remote.ssh import Target, Transport, Unreachable
from tests import fake_limactl
from tests.remotehost import RemoteHost, processes

Hosts = Callable[..., list[RemoteHost]]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def host(remote_hosts: Hosts) -> RemoteHost:
    return remote_hosts(1)[0]


@pytest.fixture
def transport(host: RemoteHost) -> Iterator[Transport]:
    transport = Transport(host.target())
    yield transport
    transport.close()


def test_a_command_runs_as_the_remote_user_and_its_output_comes_back_byte_for_byte(
        host: RemoteHost, transport: Transport) -> None:
    result = transport.run(["sh", "-c", "id -un; pwd; printf 'a\\0b\\377\\r\\n'; printf 'err\\n' >&2; exit 7"])
    assert result == (7, f"{host.user}\n{host.home}\n".encode() + b"a\0b\xff\r\n", b"err\n")


def test_the_words_reach_the_remote_command_as_they_were(transport: Transport) -> None:
    words = ["it's", "$HOME", "a b", "`id`", ";", "*", "\\n"]
    result = transport.run(["printf", "%s\\n", *words])
    assert result.code == 0 and result.stdout.decode().splitlines() == words


def test_stdin_arrives_byte_for_byte(host: RemoteHost, transport: Transport) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    result = transport.run(["sh", "-c", "cat > received; wc -c < received"], stdin=data)
    assert result.code == 0 and int(result.stdout) == len(data)
    assert (host.home / "received").read_bytes() == data
    assert transport.run(["cat"], stdin=b"").stdout == b""


def test_calls_share_one_connection(host: RemoteHost, transport: Transport) -> None:
    for _ in range(3):
        assert transport.run(["true"]).code == 0
    assert host.accepted() == 1
    check = subprocess.run(transport._control("check"), capture_output=True, text=True)
    assert check.returncode == 0 and "Master running" in check.stderr
    transport.close()  # control: a new master is a new connection
    assert transport.run(["true"]).code == 0
    assert host.accepted() == 2


def test_a_remote_command_exiting_255_is_its_own_code_not_an_unreachable_host(transport: Transport) -> None:
    assert transport.run(["sh", "-c", "echo gone >&2; exit 255"]) == (255, b"", b"gone\n")


def test_a_host_that_cannot_be_reached_is_unreachable_with_its_name(host: RemoteHost, transport: Transport) -> None:
    assert transport.run(["true"]).code == 0
    host.stop()
    assert transport.run(["echo", "still"]).stdout == b"still\n"  # the established connection goes on
    host.cut()
    with pytest.raises(Unreachable) as caught:
        transport.run(["true"])
    assert caught.value.host == host.name and f"host {host.name} is unreachable" in caught.value.message
    assert "Connection refused" in caught.value.detail
    host.start()
    assert transport.run(["echo", "back"]) == (0, b"back\n", b"")


def test_a_connection_cut_mid_command_is_unreachable(host: RemoteHost, transport: Transport) -> None:
    running = transport.stream(["sh", "-c", "echo started; sleep 60"])
    assert running.stdout is not None and running.stdout.readline() == b"started\n"
    host.cut()
    assert running.wait(10) == 255
    assert running.stderr is not None
    with pytest.raises(Unreachable, match=host.name):
        transport.raise_if_unreachable(255, running.stderr.read())
    assert transport.run(["true"]).code == 0  # sshd still listens: a new connection comes up
    assert host.accepted() == 2


@pytest.fixture
def local_server() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def answer() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            with client:
                client.sendall(b"from the laptop " + client.recv(100))

    threading.Thread(target=answer, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


CONNECT = "import socket, sys\ns = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\ns.sendall(b'hi')\n" \
          "sys.stdout.write(s.recv(100).decode())"


def test_forward_remote_makes_the_hosts_loopback_port_reach_a_local_listener(
        host: RemoteHost, transport: Transport, local_server: int) -> None:
    remote_port = transport.forward_remote(local_server)
    assert remote_port > 0
    assert transport.run(["python3", "-c", CONNECT, str(remote_port)]) == (0, b"from the laptop hi", b"")
    assert host.accepted() == 1  # on the command connection's master
    transport.cancel_forward(local_server, remote_port)
    refused = transport.run(["python3", "-c", CONNECT, str(remote_port)])
    assert refused.code == 1 and b"ConnectionRefusedError" in refused.stderr


def test_the_remote_users_path_has_the_limactl_double_with_its_own_lima_home(
        host: RemoteHost, transport: Transport) -> None:
    assert transport.run(["sh", "-c", "command -v limactl"]).stdout.decode().strip().startswith(
        host.path.split(":")[0])
    assert transport.run(["limactl", "--version"]) == (0, f"limactl version {fake_limactl.VERSION[1:]}\n".encode(),
                                                       b"")
    assert transport.run(["limactl", "list", "--json"]).stdout == b""
    create = transport.run(["limactl", "--tty=false", "create", "--name", "vm", "-"],
                           stdin=b"images:\n- location: https://example.invalid/ubuntu.img\n")
    assert create.code == 0, create.stderr
    assert (host.lima_home / "vm" / "lima.yaml").is_file()
    listed = [json.loads(line) for line in transport.run(["limactl", "list", "--json"]).stdout.splitlines()]
    assert [(i["name"], i["status"], i["dir"]) for i in listed] == [("vm", "Stopped", str(host.lima_home / "vm"))]


def test_the_double_runs_a_vm_for_the_remote_user(host: RemoteHost, transport: Transport) -> None:
    """`limactl start` and a bubblewrap-backed `limactl shell`, as the unprivileged remote user."""
    assert transport.run(["limactl", "--tty=false", "create", "--name", "vm", "-"],
                         stdin=b"images:\n- location: https://example.invalid/ubuntu.img\n").code == 0
    start = transport.run(["limactl", "--tty=false", "start", "vm"], timeout=100)
    assert start.code == 0, start.stderr
    shell = transport.run(["limactl", "shell", "--tty=false", "vm", "--", "sh", "-c", "id -un; cat"], stdin=b"in")
    assert shell.code == 0, shell.stderr
    assert shell.stdout == f"{host.user}\nin".encode()


def test_the_doubles_boot_records_are_the_remote_users_own_unless_asked_otherwise(remote_hosts: Hosts) -> None:
    (plain,) = remote_hosts(1, boot_cache=False)
    (cached,) = remote_hosts(1)
    records = Path(cached.variables["FAKE_LIMACTL_BOOT_CACHE"])
    assert records.is_dir() and records.stat().st_uid == cached.lease.uid
    for host, expected in ((plain, "none"), (cached, str(records))):
        transport = Transport(host.target())
        seen = transport.run(["sh", "-c", 'echo "${FAKE_LIMACTL_BOOT_CACHE-none}"']).stdout
        transport.close()
        assert seen.decode().strip() == expected


def test_two_hosts_are_two_users_two_connections(remote_hosts: Hosts) -> None:
    first, second = remote_hosts(2)
    assert first.user != second.user and first.port != second.port
    one, two = Transport(first.target()), Transport(second.target())
    try:
        assert one.run(["id", "-un"]).stdout == f"{first.user}\n".encode()
        assert two.run(["id", "-un"]).stdout == f"{second.user}\n".encode()
        assert one.control_path != two.control_path
        second.stop()
        second.cut()
        assert one.run(["true"]).code == 0
        with pytest.raises(Unreachable, match=second.name):
            two.run(["true"])
    finally:
        one.close()
        two.close()


def test_the_ssh_config_alias_reaches_the_host_through_the_doubles_ssh(
        host: RemoteHost, home: Path, isolated_env: dict[str, Path]) -> None:
    """ssh by the alias alone (`ssh://remote1`): the test's ~/.ssh/config says where and who."""
    by_alias = Transport(Target(host.name, None, host.name, None))
    try:
        assert by_alias.run(["id", "-un"]).stdout == f"{host.user}\n".encode()
    finally:
        by_alias.close()
    calls = fake_limactl.read_ssh_passthrough(isolated_env["lima_home"])
    assert calls and calls[0]["argv"][:2] == ["-F", str(home / ".ssh" / "config")]
    assert fake_limactl.read_ssh_calls(isolated_env["lima_home"]) == []  # none was the double's own


def test_no_file_of_the_laptops_home_reaches_the_remote_home(host: RemoteHost, home: Path,
                                                              transport: Transport) -> None:
    assert transport.run(["sh", "-c", "echo work > out"]).code == 0
    secret = (home / ".ssh" / "id_ed25519").read_bytes()
    public = (home / ".ssh" / "id_ed25519.pub").read_bytes().split()[1]
    assert host.containing([secret, b"agentbox-test-token"]) == []
    # control: the scan finds what is there
    assert host.containing([public]) == [(host.home / ".ssh" / "authorized_keys", public)]
    assert host.home / "out" in host.files()


def test_hosts_are_emptied_and_stopped_at_the_end(remote_hosts: Hosts) -> None:
    (host,) = remote_hosts(1)
    host.run("sleep 300 >/dev/null 2>&1 & echo x > left")
    assert (host.home / "left").exists()
    sshd = host._sshd
    assert sshd is not None
    host.close()
    host.lease.release()
    assert sshd.poll() is not None
    assert list(host.home.iterdir()) == []
    assert processes(host.lease.uid) == []


def test_a_user_the_host_does_not_let_in_is_unreachable_and_never_asked_a_password(host: RemoteHost) -> None:
    stranger = Transport(Target(host.name, "root", host.hostname, host.port))
    with pytest.raises(Unreachable) as caught:
        stranger.run(["true"])
    assert "Permission denied (publickey)" in caught.value.detail
    assert host.accepted() == 0


def test_a_command_that_does_not_answer_in_time_is_unreachable(transport: Transport) -> None:
    with pytest.raises(Unreachable, match="no answer within 1 s"):
        transport.run(["sleep", "30"], timeout=1)


def test_attached_passes_this_processes_stdio_through(transport: Transport,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    assert transport.attached(["sh", "-c", "echo out; echo err >&2; exit 3"], tty=False) == 3
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("out\n", "err\n")
