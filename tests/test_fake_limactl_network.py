"""The double's guest network: its `nft` stand-in (the guest shares the host's network namespace, so the real
nft must never touch it) and `host.lima.internal` in its /etc/hosts (Lima's name for the host's loopback)."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from tests import test_fake_limactl
from tests.helpers import NAME, FakeLima, needs, sbin_tool
from tests.test_fake_limactl import Lima

lima = test_fake_limactl.lima        # the fixtures of the double's own tests
running = test_fake_limactl.running

RULESET = """table inet agentbox
delete table inet agentbox
table inet agentbox {
  chain output {
    type filter hook output priority 0; policy accept;
    ip daddr 192.168.5.2 tcp dport { 3128 } accept
    ip daddr 192.168.5.2 reject with icmpx type admin-prohibited
  }
}
"""
STATE = "/run/fake-limactl/nft.ruleset"


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    needs("bwrap")


def shell(lima: Lima, script: str) -> tuple[int, str, str]:
    result = lima.run("shell", "vm", "bash", "-c", script)
    return result.returncode, result.stdout, result.stderr


def test_the_guest_user_is_refused_as_by_the_real_nft(running: Lima) -> None:
    code, out, err = shell(running, f"cat > /tmp/r.nft <<'EOF'\n{RULESET}EOF\n/usr/local/sbin/nft -f /tmp/r.nft")
    assert (code, out) == (1, "")
    assert err == "netlink: Error: cache initialization failed: Operation not permitted\n"
    code, _, err = shell(running, "/usr/local/sbin/nft list ruleset")
    assert code == 1 and err.startswith("Operation not permitted (you must be root)\n")
    assert shell(running, f"sudo test -e {STATE} || echo none")[1] == "none\n"


def test_root_s_nft_is_the_stand_in_and_records_the_ruleset(running: Lima) -> None:
    needs("netns")  # the stand-in reads the file with the host's real nft, in a namespace of its own
    code, out, err = shell(running, f"cat > /tmp/r.nft <<'EOF'\n{RULESET}EOF\n"
                                    "sudo sh -c 'command -v nft' && sudo nft -f /tmp/r.nft && sudo nft -f /tmp/r.nft")
    assert (code, out, err) == (0, "/usr/local/sbin/nft\n", "")
    code, listing, err = shell(running, "sudo nft list table inet agentbox")
    assert code == 0, err
    # nft's own listing (priority names, the set spelt out), once, as the real nft keeps it
    assert listing.count("table inet agentbox {") == 1
    assert "type filter hook output priority filter; policy accept;" in listing
    assert "ip daddr 192.168.5.2 tcp dport 3128 accept" in listing
    assert shell(running, "sudo nft list ruleset")[1] == listing
    assert shell(running, f"sudo cat {STATE}")[1] == listing
    if os.geteuid() == 0:  # the host's own firewall was not touched: the double's guest shares its network
        host = subprocess.run([sbin_tool("nft") or "nft", "list", "ruleset"], capture_output=True, text=True)
        assert "inet agentbox" not in host.stdout


def test_a_broken_ruleset_fails_with_nft_s_message_and_records_nothing(running: Lima) -> None:
    needs("netns")
    broken = RULESET.replace("policy accept;", "policy accept;\n    bogus rule")
    code, out, err = shell(running, f"cat > /tmp/bad.nft <<'EOF'\n{broken}EOF\nsudo nft -f /tmp/bad.nft")
    assert code == 1 and out == ""
    assert err.startswith("/tmp/bad.nft:6:") and "Error: syntax error" in err, err  # the guest's path
    assert shell(running, f"sudo test -e {STATE} || echo none")[1] == "none\n"
    code, _, err = shell(running, "sudo nft list table inet agentbox")
    assert code == 1 and err.startswith("Error: No such file or directory"), err


def test_check_mode_reads_the_file_and_applies_nothing(running: Lima) -> None:
    needs("netns")
    code, _, err = shell(running, f"cat > /tmp/r.nft <<'EOF'\n{RULESET}EOF\nsudo nft -c -f /tmp/r.nft")
    assert (code, err) == (0, "")
    assert shell(running, f"sudo test -e {STATE} || echo none")[1] == "none\n"
    code, _, err = shell(running, "echo 'table inet x { chain c { nonsense } }' > /tmp/bad.nft; "
                                  "sudo nft -c -f /tmp/bad.nft")
    assert code == 1 and "Error: syntax error" in err


def test_the_ruleset_is_gone_after_a_restart(running: Lima) -> None:
    """It lives in /run, as nftables' rules live in the kernel: a VM forgets them when it stops."""
    needs("netns")
    assert shell(running, f"cat > /tmp/r.nft <<'EOF'\n{RULESET}EOF\nsudo nft -f /tmp/r.nft")[0] == 0
    running.ok("stop", "vm")
    running.ok("start", "vm")
    assert shell(running, "sudo nft list ruleset") == (0, "", "")


def test_host_lima_internal_is_the_host_s_loopback(running: Lima) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code, out, err = shell(running, f"getent hosts host.lima.internal; exec 3<>/dev/tcp/host.lima.internal/{port} "
                                        "&& echo connected")
        assert (code, out) == (0, "127.0.0.1       host.lima.internal\nconnected\n"), err
    finally:
        server.close()


def test_an_agentbox_vm_has_the_stand_in_and_tests_read_its_ruleset(vm: FakeLima) -> None:
    """An agentbox VM's provisioning installs nftables without hiding the stand-in, and FakeLima.nft_ruleset
    reads what the guest's `sudo nft -f` left."""
    needs("netns")
    assert vm.nft_ruleset(NAME) == ""
    (vm.home / NAME / "guestfs" / "tmp" / "r.nft").write_text(RULESET)
    applied = subprocess.run(["limactl", "shell", NAME, "sudo", "nft", "-f", "/tmp/r.nft"], capture_output=True,
                             text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert applied.returncode == 0, applied.stderr
    assert "ip daddr 192.168.5.2 tcp dport 3128 accept" in vm.nft_ruleset(NAME)
