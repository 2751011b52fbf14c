#!/usr/bin/env python3
"""Measure what the egress proxy adds to a connection's setup on loopback; print a table.

    python3 benchmarks/proxy.py [--runs 200] [--lifecycle]

Each sample opens a TCP connection to a local echo server and waits for one byte to come back:
directly, or through `agentbox.net.proxy` (CONNECT handshake included, with the proxy credentials every VM's
proxy asks for, as a VM sends them: their check is part of what is measured). The name row resolves through
the policy's resolver hook (no DNS: what DNS costs is the same with or without the proxy).
Target (issue 17): the proxy adds under 5 ms at the median.

--lifecycle: the VM's proxy process as a launch without the credential broker starts and stops it
(agentbox.net.guard): what `begin` costs the launch, when `Lease.port` is known, when the first CONNECT is
answered (the process serves), and what `release` (its stop) costs; medians over --runs (default 20 here).
"""

from __future__ import annotations

import argparse
import base64
import socket
import socketserver
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox.net import proxy as netproxy

SECRET = "0123456789abcdef0123456789abcdef"  # a VM's proxy secret (agentbox.net.guard.secret)


def credentials(secret: str) -> str:
    return f"Proxy-Authorization: Basic {base64.b64encode(f'agentbox:{secret}'.encode()).decode()}\r\n"


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


def direct(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"


def through(proxy_port: int, target: str) -> None:
    with socket.create_connection(("127.0.0.1", proxy_port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{credentials(SECRET)}\r\n".encode())
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"


def median_ms(run: Callable[[], None], runs: int) -> float:
    for _ in range(10):
        run()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def refused(port: int, secret: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"CONNECT blocked.example:443 HTTP/1.1\r\nHost: blocked.example:443\r\n"
                     + f"{credentials(secret)}\r\n".encode())
        assert sock.recv(12).startswith(b"HTTP/1.1 403")


def lifecycle(runs: int) -> None:
    import os

    from agentbox.net import guard
    from agentbox.net import policy as netpolicy

    samples: dict[str, list[float]] = {"begin (launch pays)": [], "port known": [], "first CONNECT answered": [],
                                       "release (stop)": []}
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["AGENTBOX_STATE_DIR"] = scratch
        for _ in range(runs):
            started = time.perf_counter()
            lease = guard.begin(netpolicy.NetworkSettings(mode="allowlist"), "bench", {})
            assert lease is not None
            samples["begin (launch pays)"].append(time.perf_counter() - started)
            port = lease.port
            samples["port known"].append(time.perf_counter() - started)
            refused(port, guard.secret("bench"))
            samples["first CONNECT answered"].append(time.perf_counter() - started)
            stopping = time.perf_counter()
            lease.release()
            samples["release (stop)"].append(time.perf_counter() - stopping)
    print(f"the VM's proxy process (no broker), median of {runs}, ms since begin() was called")
    for name, values in samples.items():
        print(f"{name:<26} {statistics.median(values) * 1000:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--lifecycle", action="store_true", help="the proxy process's start and stop instead")
    args = parser.parse_args()
    if args.lifecycle:
        lifecycle(args.runs or 20)
        return
    args.runs = args.runs or 200

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    policy = netproxy.Policy(allow=[f"echo.test:{port}", f"127.0.0.1:{port}"], allow_lan=True, allow_loopback=True,
                             resolver=lambda host, _port: ["127.0.0.1"])
    with tempfile.TemporaryDirectory() as scratch, netproxy.start(policy, Path(scratch) / "net.log",
                                                                            secret=SECRET) as proxy:
        base = median_ms(lambda: direct(port), args.runs)
        rows = [
            ("direct", base),
            ("proxy, listed name", median_ms(lambda: through(proxy.port, f"echo.test:{port}"), args.runs)),
            ("proxy, listed IP literal", median_ms(lambda: through(proxy.port, f"127.0.0.1:{port}"), args.runs)),
        ]
    server.shutdown()
    print(f"connection setup + 1-byte round trip on loopback, median of {args.runs}")
    print(f"{'path':<26} {'median ms':>10} {'added ms':>9}")
    for name, value in rows:
        print(f"{name:<26} {value:>10.3f} {value - base:>9.3f}")
    worst = max(value - base for _, value in rows)
    print(f"target: proxy adds < 5 ms -> {'met' if worst < 5 else 'MISSED'} ({worst:.3f} ms)")


if __name__ == "__main__":
    main()
