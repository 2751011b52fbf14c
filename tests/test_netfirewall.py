"""The guest firewall (agentbox.net.policy.ruleset) as the real nft enforces it, proved by real connections.

A throwaway pair of network namespaces stands for Lima's user-mode network: the "guest" (192.168.5.15/24,
fec0::15/64, default routes via the host) and, over a veth pair, the "host" side that slirp/gvisor plays
(192.168.5.2 and fec0::2 the host's loopback, 192.168.5.3 its DNS, and behind them a public address
203.0.113.10 / 2001:db8::10 and LAN-looking ones). Listeners on the host side answer every probed port, so
a connection that fails fast was stopped by the guest's ruleset, and one that gets the answer went through.
As root the namespaces are plain `unshare --net`; otherwise they live in a user namespace of our own
(`unshare --map-root-user --net`), entered with nsenter. Nothing touches this machine's own firewall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox.net import policy as netpolicy
from agentbox.net.policy import NetworkSettings
from tests.helpers import needs, sbin_tool

PROXY, DB, WEB, DNS = 3128, 5432, 8080, 53
PORTS = (PROXY, DB, WEB, DNS)
HOST4, HOST6, DNS4 = netpolicy.HOST_ADDRESS, netpolicy.HOST_ADDRESS6, netpolicy.DNS_ADDRESS
PUBLIC4, PUBLIC6 = "203.0.113.10", "2001:db8::10"
LAN = ("10.1.2.3", "172.16.4.5", "192.168.77.7", "169.254.169.254")

# Answers every TCP connection on PORTS with b"hi", UDP on port 53 of the DNS and the public address, and
# UDP on the host's port 67 (slirp's DHCP server).
LISTENER = r"""
import socket, sys, threading
ports = [int(p) for p in sys.argv[1:]]
def tcp(port):
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port)); s.listen(64)
    def serve():
        while True:
            conn, _ = s.accept()
            with conn:
                conn.sendall(b"hi")
    threading.Thread(target=serve, daemon=True).start()
def udp(address, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((address, port))  # a wildcard socket would answer from another source address
    def serve():
        while True:
            data, peer = s.recvfrom(100)
            s.sendto(b"hi", peer)
    threading.Thread(target=serve, daemon=True).start()
for port in ports:
    tcp(port)
for address in ("192.168.5.3", "203.0.113.10"):
    udp(address, 53)
udp("192.168.5.2", 67)
print("ready", flush=True)
sys.stdin.read()
"""

# For each "tcp|udp|dhcp ADDRESS PORT" argument (dhcp: UDP from port 68, as a lease renewal): ok (the listener answered), or the error, and how long it took.
PROBE = r"""
import json, socket, sys, time
found = {}
for target in sys.argv[1:]:
    proto, address, port = target.split()
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    start = time.monotonic()
    try:
        if proto == "tcp":
            with socket.create_connection((address, int(port)), timeout=3) as s:
                outcome = "ok" if s.recv(2) == b"hi" else "no answer"
        else:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                if proto == "dhcp":
                    s.bind(("", 68))
                s.settimeout(3)
                s.connect((address, int(port)))
                s.send(b"?")
                outcome = "ok" if s.recv(2) == b"hi" else "no answer"
    except socket.timeout:
        outcome = "timeout"
    except OSError as e:
        import errno
        outcome = errno.errorcode.get(e.errno, str(e))
    found[target] = [outcome, round(time.monotonic() - start, 3)]
print(json.dumps(found))
"""

# What a firewall's reject looks like to the program: a reset (TCP), an ICMP unreachable, or EPERM; and how
# soon (a TCP connect over IPv6 takes the ICMPv6 error at its first SYN retransmission, after 1 s; a dropped
# packet would leave it waiting for minutes).
BLOCKED = {"ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EACCES", "EPERM"}
FAST = 2.0


class Lab:
    """The two namespaces: `guest` and `host` are pids holding them; `run` runs a command in one."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.nft = sbin_tool("nft") or "nft"
        self.ip = sbin_tool("ip") or "ip"
        self.rootless = os.geteuid() != 0
        self.procs: list[subprocess.Popen] = []
        self.guest = self.host = 0

    def _enter(self, pid: int) -> list[str]:
        # --preserve-credentials: our uid is already root in the namespace, and setgroups is denied there.
        return ["nsenter", "-t", str(pid), *(["-U", "--preserve-credentials"] if self.rootless else []), "-n", "--"]

    def _hold(self, prefix: list[str]) -> int:
        proc = subprocess.Popen([*prefix, "sleep", "infinity"], stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        # unshare and nsenter exec their command: the pid holds the namespace once `sleep` runs.
        for _ in range(200):
            try:
                if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
                    return proc.pid
            except OSError:
                break
            subprocess.run(["sleep", "0.01"])
        raise RuntimeError(f"could not set up a namespace: {prefix} exited {proc.poll()}")

    def run(self, where: int, *argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run([*self._enter(where), *argv], capture_output=True, text=True, input=input,
                                timeout=30)
        if check and result.returncode != 0:
            raise AssertionError(f"{argv} failed ({result.returncode}): {result.stderr}")
        return result

    def build(self) -> None:
        self.guest = self._hold(["unshare", *(["--map-root-user"] if self.rootless else []), "--net"])
        self.host = self._hold([*self._enter(self.guest), "unshare", "--net"])
        ip, guest, host = self.ip, self.guest, self.host
        self.run(guest, ip, "link", "add", "g0", "type", "veth", "peer", "name", "h0", "netns", str(host))
        for command in (["link", "set", "lo", "up"], ["link", "set", "g0", "up"],
                        ["addr", "add", "192.168.5.15/24", "dev", "g0"],
                        ["-6", "addr", "add", "fec0::15/64", "dev", "g0", "nodad"],
                        ["route", "add", "default", "via", HOST4],
                        ["-6", "route", "add", "default", "via", HOST6]):
            self.run(guest, ip, *command)
        for command in (["link", "set", "lo", "up"], ["link", "set", "h0", "up"],
                        ["addr", "add", f"{HOST4}/24", "dev", "h0"], ["addr", "add", f"{DNS4}/24", "dev", "h0"],
                        ["-6", "addr", "add", f"{HOST6}/64", "dev", "h0", "nodad"],
                        ["addr", "add", f"{PUBLIC4}/32", "dev", "lo"], ["-6", "addr", "add", f"{PUBLIC6}/128", "dev", "lo"],
                        *(["addr", "add", f"{address}/32", "dev", "lo"] for address in LAN),
                        ["route", "add", "192.168.0.0/16", "dev", "h0"]):
            self.run(host, ip, *command)
        listener = subprocess.Popen([*self._enter(host), sys.executable, "-c", LISTENER, *map(str, PORTS)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(listener)
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"

    def apply(self, text: str, *flags: str) -> subprocess.CompletedProcess:
        """`sudo nft -f FILE` in the guest, as launch.sh does."""
        path = self.work / "network.nft"
        path.write_text(text)
        return self.run(self.guest, self.nft, *flags, "-f", str(path), check=False)

    def ruleset(self) -> str:
        return self.run(self.guest, self.nft, "list", "ruleset").stdout

    def probe(self, *targets: str) -> dict[str, str]:
        """Each target's outcome: "ok", or "blocked" when it failed fast as a firewall's reject does."""
        out = self.run(self.guest, sys.executable, "-c", PROBE, *targets).stdout
        outcomes = {}
        for target, (outcome, seconds) in json.loads(out).items():
            if outcome in BLOCKED and seconds < FAST:
                outcome = "blocked"
            outcomes[target] = outcome
        return outcomes

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    needs("netns")
    lab = Lab(tmp_path_factory.mktemp("netlab"))
    try:
        lab.build()
        yield lab
    finally:
        lab.close()


@pytest.fixture
def guest(lab: Lab) -> Iterator[Lab]:
    """The lab with no agentbox table, before and after each test."""
    lab.run(lab.guest, lab.nft, "flush", "ruleset")
    yield lab
    lab.run(lab.guest, lab.nft, "flush", "ruleset")


def tcp(address: str, port: int) -> str:
    return f"tcp {address} {port}"


def udp(address: str, port: int) -> str:
    return f"udp {address} {port}"


DHCP = f"dhcp {HOST4} 67"


def enforce(lab: Lab, settings: NetworkSettings, proxy_port: int | None = None) -> None:
    result = lab.apply(netpolicy.ruleset(settings, proxy_port))
    assert result.returncode == 0, result.stderr


def test_without_a_ruleset_everything_is_reachable(guest: Lab) -> None:
    """The lab itself: every target answers, so a blocked one below was blocked by the ruleset."""
    targets = [tcp(HOST4, port) for port in PORTS] + [tcp(HOST6, PROXY), tcp(DNS4, DNS), udp(DNS4, DNS),
                                                      tcp(PUBLIC4, WEB), tcp(PUBLIC6, WEB), udp(PUBLIC4, DNS), DHCP]
    targets += [tcp(address, WEB) for address in LAN]
    assert guest.probe(*targets) == dict.fromkeys(targets, "ok")


def test_open_mode_closes_the_host_and_leaves_the_internet_open(guest: Lab) -> None:
    enforce(guest, NetworkSettings(mode="open"))
    assert guest.probe(tcp(HOST4, WEB), tcp(HOST4, DB), tcp(HOST6, WEB), tcp(PUBLIC4, WEB), tcp(PUBLIC6, WEB),
                       udp(PUBLIC4, DNS), tcp("10.1.2.3", WEB)) == {
        tcp(HOST4, WEB): "blocked", tcp(HOST4, DB): "blocked", tcp(HOST6, WEB): "blocked",
        tcp(PUBLIC4, WEB): "ok", tcp(PUBLIC6, WEB): "ok", udp(PUBLIC4, DNS): "ok", tcp("10.1.2.3", WEB): "ok"}


def test_a_blocked_connection_fails_fast_and_the_guest_s_own_loopback_stays_open(guest: Lab) -> None:
    """Refused at once (a program is not left waiting for a timeout), and 127.0.0.1 inside the guest still
    works in the strictest mode (lo is accepted before any rule about addresses)."""
    enforce(guest, NetworkSettings(mode="offline", agent_api=False))
    local = guest.run(guest.guest, sys.executable, "-c", "import socket; s = socket.socket(); "
                      "s.bind(('127.0.0.1', 0)); s.listen(); socket.create_connection(s.getsockname(), timeout=3)",
                      check=False)
    assert local.returncode == 0, local.stderr
    raw = json.loads(guest.run(guest.guest, sys.executable, "-c", PROBE, tcp(HOST4, WEB), tcp(PUBLIC4, WEB)).stdout)
    for outcome, seconds in raw.values():
        assert outcome in BLOCKED and seconds < FAST


def test_allow_host_ports_open_only_those_ports(guest: Lab) -> None:
    enforce(guest, NetworkSettings(mode="open", allow_host=(DB,)))
    assert guest.probe(tcp(HOST4, DB), tcp(HOST6, DB), tcp(HOST4, WEB), tcp(HOST4, PROXY), tcp(PUBLIC4, WEB)) == {
        tcp(HOST4, DB): "ok", tcp(HOST6, DB): "ok", tcp(HOST4, WEB): "blocked", tcp(HOST4, PROXY): "blocked",
        tcp(PUBLIC4, WEB): "ok"}


def test_allow_host_true_opens_every_port_of_the_host(guest: Lab) -> None:
    enforce(guest, NetworkSettings(mode="open", allow_host=True))
    targets = [tcp(HOST4, port) for port in PORTS] + [tcp(HOST6, WEB)]
    assert guest.probe(*targets) == dict.fromkeys(targets, "ok")


def test_allowlist_lets_through_only_the_proxy_and_dns(guest: Lab) -> None:
    enforce(guest, NetworkSettings(mode="allowlist"), proxy_port=PROXY)
    assert guest.probe(tcp(HOST4, PROXY), tcp(DNS4, DNS), udp(DNS4, DNS), tcp(HOST4, WEB), tcp(HOST4, DNS),
                       tcp(DNS4, WEB), tcp(PUBLIC4, WEB), tcp(PUBLIC4, 443), tcp(PUBLIC6, WEB), udp(PUBLIC4, DNS),
                       *(tcp(address, WEB) for address in LAN)) == {
        tcp(HOST4, PROXY): "ok", tcp(DNS4, DNS): "ok", udp(DNS4, DNS): "ok",
        tcp(HOST4, WEB): "blocked", tcp(HOST4, DNS): "blocked", tcp(DNS4, WEB): "blocked",
        tcp(PUBLIC4, WEB): "blocked", tcp(PUBLIC4, 443): "blocked", tcp(PUBLIC6, WEB): "blocked",
        udp(PUBLIC4, DNS): "blocked", **{tcp(address, WEB): "blocked" for address in LAN}}


def test_allowlist_reaches_the_proxy_over_ipv6_too(guest: Lab) -> None:
    """fec0::2 is the host as well: the proxy's port there must work, which needs the guest's neighbour
    discovery (ICMPv6 to a multicast address) to leave."""
    guest.run(guest.guest, guest.ip, "-6", "neigh", "flush", "all")
    enforce(guest, NetworkSettings(mode="allowlist"), proxy_port=PROXY)
    assert guest.probe(tcp(HOST6, PROXY), tcp(HOST6, WEB)) == {tcp(HOST6, PROXY): "ok", tcp(HOST6, WEB): "blocked"}


@pytest.mark.parametrize("mode", netpolicy.MODES)
def test_dhcp_renewals_reach_the_host_in_every_mode(guest: Lab, mode: str) -> None:
    """The host address is also the DHCP server: a renewal (UDP 68 -> 67) passes; UDP to its other ports not."""
    enforce(guest, NetworkSettings(mode=mode), proxy_port=PROXY)
    assert guest.probe(DHCP, udp(HOST4, 67)) == {DHCP: "ok", udp(HOST4, 67): "blocked"}


def test_allowlist_with_allow_host_and_allow_lan(guest: Lab) -> None:
    enforce(guest, NetworkSettings(mode="allowlist", allow_host=(DB,), allow_lan=True), proxy_port=PROXY)
    lan = [tcp(address, WEB) for address in LAN]
    assert guest.probe(tcp(HOST4, PROXY), tcp(HOST4, DB), tcp(HOST4, WEB), tcp(PUBLIC4, WEB), *lan) == {
        tcp(HOST4, PROXY): "ok", tcp(HOST4, DB): "ok", tcp(HOST4, WEB): "blocked", tcp(PUBLIC4, WEB): "blocked",
        **dict.fromkeys(lan, "ok")}


def test_offline_is_enforced_like_allowlist(guest: Lab) -> None:
    enforce(guest, NetworkSettings(mode="offline"), proxy_port=PROXY)
    assert guest.probe(tcp(HOST4, PROXY), tcp(DNS4, DNS), tcp(HOST4, WEB), tcp(PUBLIC4, 443), tcp("10.1.2.3", WEB)) == {
        tcp(HOST4, PROXY): "ok", tcp(DNS4, DNS): "ok", tcp(HOST4, WEB): "blocked", tcp(PUBLIC4, 443): "blocked",
        tcp("10.1.2.3", WEB): "blocked"}


def test_a_second_apply_replaces_the_first_and_leaves_other_tables_alone(guest: Lab) -> None:
    other = "table inet mine {\n  chain input {\n    type filter hook input priority 0; policy accept;\n  }\n}\n"
    assert guest.apply(other).returncode == 0
    enforce(guest, NetworkSettings(mode="allowlist"), proxy_port=PROXY)
    assert guest.probe(tcp(PUBLIC4, WEB))[tcp(PUBLIC4, WEB)] == "blocked"
    enforce(guest, NetworkSettings(mode="open", allow_host=(DB,)))
    enforce(guest, NetworkSettings(mode="open", allow_host=(DB,)))
    listing = guest.ruleset()
    assert listing.count("table inet agentbox") == 1
    assert "table inet mine" in listing
    assert guest.probe(tcp(PUBLIC4, WEB), tcp(HOST4, DB), tcp(HOST4, PROXY)) == {
        tcp(PUBLIC4, WEB): "ok", tcp(HOST4, DB): "ok", tcp(HOST4, PROXY): "blocked"}


def test_the_ruleset_passes_nft_check_in_every_mode(guest: Lab) -> None:
    """`nft -c` (what the doubles run) accepts every combination, and changes nothing."""
    for settings in (NetworkSettings(), NetworkSettings(allow_host=True), NetworkSettings(allow_host=(1, 65535)),
                     NetworkSettings(mode="allowlist", allow_lan=True, allow_host=True),
                     NetworkSettings(mode="offline", allow_host=(22,))):
        for port in (None, PROXY):
            result = guest.apply(netpolicy.ruleset(settings, port), "-c")
            assert result.returncode == 0, (settings, port, result.stderr)
    assert "agentbox" not in guest.ruleset()
