"""The host agent's TCP port forwarding: what Lima does when a guest program starts or stops listening.

Lima's guest agent reports the guest's listening sockets; the host agent matches each against its
rules and forwards it to a host address (pkg/hostagent/port.go portForwardRules, pkg/portfwd/forward.go,
pkg/portfwd/listener.go):

- The rules are: the ssh ports (22 and the instance's ssh port) ignored on every guest IP, then the
  instance's `portForwards` (defaults filled in: proto any, guestIP 127.0.0.1, hostIP 127.0.0.1, hostPort
  the guest port, port ranges offset one to one), then a catch-all 127.0.0.1 rule. The first rule that
  matches wins. A guest listening on 0.0.0.0 or :: matches any rule's guestIP; ::1 matches 127.0.0.1; a
  rule with guestIP 0.0.0.0 and guestIPMustBeZero false matches any guest IP. An `ignore` rule ends the
  search (not forwarded), except that a guest on 0.0.0.0 skips an ignore rule for a specific guestIP.
  Ports inside a `static` rule are skipped. Leading ignore rules over the whole range [1, 65535] turn
  TCP forwarding off (nothing is logged for unforwarded ports then).
- Each forward logs `Forwarding TCP from GUEST to HOST` (info) to ha.stderr.log and emits a
  `portForward` event of type `forwarding` to ha.stdout.log, then listens on HOST. When HOST is taken
  it only logs a warning, `failed to listen tcp: HOST` with error
  `listen tcp HOST: bind: address already in use`: the guest's port is then not reachable from the
  host and nothing else says so. A privileged host port (EACCES) or port 53 is "negligible": info
  `Not forwarding TCP HOST` instead. An unmatched listener logs `Not forwarding TCP GUEST` and emits
  `not-forwarding`. A listener that goes away emits `stopping` and its host port is released.
- ha.stdout.log holds one JSON event per line, `{"time": ..., "status": {"running": true,
  "sshLocalPort": N, "portForward": {"type", "protocol", "guestAddr", "hostAddr"}}}`
  (pkg/hostagent/events/events.go); ha.stderr.log one logrus JSON line per message
  (cmd/limactl/hostagent.go sets the JSON formatter). Both are recreated at every start
  (pkg/instance/start.go).

Where the double differs: its guest shares the host's network namespace, so it cannot tell the
guest's sockets from the host's. Tests declare the guest's listeners instead (`limactl
__listeners NAME tcp:IP:PORT...`, helpers.FakeLima.set_guest_listeners), and a host port "held" by a
forward is recorded in the instance's state rather than really listened on: another instance finds
it taken through that record, and a host program's socket is found by really trying to bind it.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import json
import os
import socket
from typing import Any

import machine
from context import Ctx, lima_lock, read_state, write_state
from instances import Instance, inspect
from logrus import Fatal, NotExist, bq, go_json, json_line

SSH_GUEST_PORT = 22
STDOUT_LOG = "ha.stdout.log"
STDERR_LOG = "ha.stderr.log"


def go_time_now() -> str:
    """Go's time.Time in JSON: RFC 3339 with fractional seconds and the local offset."""
    s = datetime.datetime.now().astimezone().isoformat(timespec="microseconds")
    return s[:-6] + "Z" if s.endswith("+00:00") else s


def reset_logs(inst: Instance, ssh_port: int) -> None:
    """A start recreates both logs; the first event says the instance runs."""
    for name in (STDOUT_LOG, STDERR_LOG):
        with open(os.path.join(inst.dir, name), "w", encoding="utf-8"):
            pass
    _event(inst, {"running": True, "sshLocalPort": ssh_port})


def _event(inst: Instance, status: dict[str, Any]) -> None:
    with open(os.path.join(inst.dir, STDOUT_LOG), "a", encoding="utf-8") as f:
        f.write(go_json({"time": go_time_now(), "status": status}) + "\n")


def _log(inst: Instance, level: str, msg: str, **fields: Any) -> None:
    with open(os.path.join(inst.dir, STDERR_LOG), "a", encoding="utf-8") as f:
        f.write(json_line(level, msg, **fields) + "\n")


def host_string(ip: str, port: int) -> str:
    """net.JoinHostPort."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def rules(inst: Instance, ssh_port: int) -> list[dict[str, Any]]:
    """portForwardRules: the ssh ports ignored, the instance's rules (already filled), the catch-all."""
    result = []
    for port in (SSH_GUEST_PORT, ssh_port):
        result.append({"guestIP": "0.0.0.0", "guestIPMustBeZero": False, "guestPortRange": [port, port],
                       "hostIP": "127.0.0.1", "hostPortRange": [port, port], "proto": "any", "ignore": True})
    result += list((inst.config or {}).get("portForwards") or [])
    result.append({"guestIP": "127.0.0.1", "guestIPMustBeZero": False, "guestPortRange": [1, 65535],
                   "hostIP": "127.0.0.1", "hostPortRange": [1, 65535], "proto": "any"})
    return result


def tcp_forwarding_off(inst: Instance) -> bool:
    """Leading `ignore` rules over every port, for tcp or any (hostagent.New)."""
    for rule in (inst.config or {}).get("portForwards") or []:
        if not (rule.get("ignore") and list(rule.get("guestPortRange", [])) == [1, 65535]):
            break
        if rule.get("proto") in ("tcp", "any"):
            return True
    return False


def forwarding_addresses(all_rules: list[dict[str, Any]], ip: str, port: int) -> tuple[str, str]:
    """(host address or "" when not forwarded, guest address) for a tcp listener."""
    guest_ip = _ip(ip)
    guest_addr = host_string(ip, port)
    for rule in all_rules:
        if rule.get("guestSocket"):
            continue
        if rule.get("proto", "any") not in ("any", "tcp"):
            continue
        low, high = rule["guestPortRange"]
        if port < low or port > high:
            continue
        rule_ip = _ip(rule.get("guestIP", "127.0.0.1"))
        matches = (
            guest_ip.is_unspecified
            or guest_ip == rule_ip
            or (guest_ip == ipaddress.ip_address("::1") and rule_ip == ipaddress.ip_address("127.0.0.1"))
            or (rule_ip.is_unspecified and not rule.get("guestIPMustBeZero", False))
        )
        if not matches:
            continue
        if rule.get("ignore"):
            if guest_ip.is_unspecified and not rule_ip.is_unspecified:
                continue
            break
        if rule.get("hostSocket"):
            return rule["hostSocket"], guest_addr
        return host_string(rule.get("hostIP", "127.0.0.1"), port + rule["hostPortRange"][0] - low), guest_addr
    return "", guest_addr


def statically_forwarded(all_rules: list[dict[str, Any]], port: int) -> bool:
    return any(r.get("static") and r["guestPortRange"][0] <= port <= r["guestPortRange"][1] for r in all_rules)


def _split_host(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _overlaps(a: str, b: str) -> bool:
    """Two host addresses on one port clash when their IPs are equal or either is a wildcard."""
    (ip_a, port_a), (ip_b, port_b) = _split_host(a), _split_host(b)
    if port_a != port_b:
        return False
    return ip_a == ip_b or _ip(ip_a).is_unspecified or _ip(ip_b).is_unspecified


def _held_elsewhere(ctx: Ctx, inst: Instance, host_addr: str) -> bool:
    for entry in sorted(os.listdir(ctx.lima_home)):
        if entry.startswith((".", "_")) or entry == inst.name:
            continue
        state = read_state(os.path.join(ctx.lima_home, entry))
        if state.get("status") != "Running" or machine.crashed(state):  # a crashed one's host agent is gone
            continue
        if any(f.get("held") and _overlaps(f["hostAddr"], host_addr) for f in state.get("forwards", [])):
            return True
    return False


def _listen_error(ctx: Ctx, inst: Instance, host_addr: str) -> OSError | None:
    """What net.Listen would say for host_addr now: taken by another instance's forward, or a host socket."""
    if _held_elsewhere(ctx, inst, host_addr):
        return OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
    ip, port = _split_host(host_addr)
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # Go sets it on Unix listeners
            probe.bind((ip, port))
            probe.listen(1)
    except OSError as e:
        return e
    return None


def _forward(ctx: Ctx, inst: Instance, state: dict[str, Any], guest_addr: str, host_addr: str) -> None:
    _log(inst, "info", f"Forwarding TCP from {guest_addr} to {host_addr}")
    _event(inst, {"running": True, "sshLocalPort": state["sshLocalPort"],
                  "portForward": {"type": "forwarding", "protocol": "tcp", "guestAddr": guest_addr,
                                  "hostAddr": host_addr}})
    if any(f["hostAddr"] == host_addr and f["guestAddr"] == guest_addr for f in state["forwards"]):
        return  # ClosableListeners already has this key
    error = _listen_error(ctx, inst, host_addr)
    held = error is None
    if error is not None:
        port = _split_host(host_addr)[1]
        text = f"listen tcp {host_addr}: bind: {os.strerror(error.errno or 0).lower()}"
        if error.errno == errno.EACCES or port == 53:  # logListenError's negligible reasons (details at debug)
            _log(inst, "info", f"Not forwarding TCP {host_addr}")
        else:
            _log(inst, "warning", f"failed to listen tcp: {host_addr}", error=text)
    state["forwards"].append({"guestAddr": guest_addr, "hostAddr": host_addr, "held": held})


def apply_listeners(ctx: Ctx, inst: Instance, listeners: list[tuple[str, int]]) -> None:
    """The guest agent reports this set of tcp listeners (ip, port): forward the added, stop the removed."""
    with lima_lock(ctx.lima_home):
        state = read_state(inst.dir)
        if state.get("status") != "Running":
            raise Fatal(f"fake limactl: instance {bq(inst.name)} is not running, so nothing in it listens")
        state.setdefault("forwards", [])
        before = [tuple(x) for x in state.get("guestListeners", [])]
        added = [x for x in listeners if x not in before]
        removed = [x for x in before if x not in listeners]
        all_rules = rules(inst, int(state["sshLocalPort"]))
        quiet = tcp_forwarding_off(inst)
        for ip, port in added:  # pkg/portfwd/forward.go OnEvent: added first, then removed
            if statically_forwarded(all_rules, port):
                continue
            host_addr, guest_addr = forwarding_addresses(all_rules, ip, port)
            if not host_addr:
                if not quiet:
                    _log(inst, "info", f"Not forwarding TCP {guest_addr}")
                    _event(inst, {"running": True, "sshLocalPort": state["sshLocalPort"],
                                  "portForward": {"type": "not-forwarding", "protocol": "tcp",
                                                  "guestAddr": guest_addr}})
                continue
            _forward(ctx, inst, state, guest_addr, host_addr)
        for ip, port in removed:
            host_addr, guest_addr = forwarding_addresses(all_rules, ip, port)
            if not host_addr:
                continue
            _event(inst, {"running": True, "sshLocalPort": state["sshLocalPort"],
                          "portForward": {"type": "stopping", "protocol": "tcp", "guestAddr": guest_addr,
                                          "hostAddr": host_addr}})
            state["forwards"] = [f for f in state["forwards"]
                                 if not (f["hostAddr"] == host_addr and f["guestAddr"] == guest_addr)]
        state["guestListeners"] = [list(x) for x in listeners]
        write_state(inst.dir, state)


def parse_listener(text: str) -> tuple[str, int]:
    """`tcp:IP:PORT` (IPv6 as `tcp:[::1]:PORT`)."""
    proto, _, rest = text.partition(":")
    if proto != "tcp" or ":" not in rest:
        raise Fatal(f"fake limactl: a listener is tcp:IP:PORT, not {text!r}")
    ip, port = _split_host(rest)
    _ip(ip)
    return ip, port


def listeners_process(ctx: Ctx, args: list[str]) -> int:
    """`limactl __listeners NAME [tcp:IP:PORT...]`: the double's stand-in for the guest agent's report."""
    if not args:
        raise Fatal("fake limactl: __listeners needs an instance name")
    try:
        inst = inspect(ctx, args[0])
    except NotExist:
        raise Fatal(f"instance {bq(args[0])} does not exist")
    apply_listeners(ctx, inst, [parse_listener(a) for a in args[1:]])
    return 0


def read_events(inst_dir: str) -> list[dict[str, Any]]:
    """The portForward events of ha.stdout.log, for the double's own tests."""
    try:
        with open(os.path.join(inst_dir, STDOUT_LOG), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line)["status"]["portForward"] for line in lines if '"portForward"' in line]
