#!/usr/bin/env python3
"""Measure what the credential broker adds to an HTTPS request on loopback; print a table.

    python3 benchmarks/broker.py [--runs 300]

The upstream is tests/fake_upstream.py (one HTTPS server standing for api.anthropic.com and example.org). Each
row is the median time of one `GET` with an Authorization header and its JSON answer:
- "kept connection": on a connection already open (what an agent CLI does for its API calls); through the
  broker the placeholder is checked and swapped and the request re-framed, on a TLS connection to the broker and
  another from the broker to the upstream;
- "new connection": TCP, TLS handshake(s) and the request; through the broker that is the CONNECT, the guest's
  TLS with the broker's leaf, and the broker's own TLS to the upstream;
- "tunnel": a host that is not a credential host, through a plain CONNECT tunnel (no interception).
Targets (issue 26): an intercepted request adds at most 5 ms at the median, a CONNECT tunnel at most 2 ms.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox.net import ca
from agentbox.net import proxy as netproxy
from agentbox.net.broker import Brokering, Secret
from tests.fake_upstream import FakeUpstream

HOST = "api.anthropic.com"
OTHER = "example.org"
PLACEHOLDER = "sk-ant-oat01-agentbox-ph-" + "0" * 24
REAL = "sk-ant-oat01-real-token-for-the-benchmark"
Opener = Callable[[], ssl.SSLSocket]


def median_ms(run: Callable[[], None], runs: int) -> float:
    for _ in range(20):
        run()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def ask(tls: ssl.SSLSocket, host: str, token: str) -> None:
    """One GET on an open connection, its answer read whole."""
    tls.sendall(f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += tls.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += tls.recv(65536)


def tcp(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def connect(proxy_port: int, target: str) -> socket.socket:
    sock = tcp(("127.0.0.1", proxy_port))
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["AGENTBOX_STATE_DIR"] = str(Path(scratch) / "state")
        authority = ca.ensure("agentbox-broker-bench", [HOST])
        with FakeUpstream(Path(scratch) / "upstream", [HOST, OTHER]) as upstream:
            upstream.route("GET", "/v1/models", {"data": []})
            brokering = Brokering(leaves={HOST: ca.server_context(authority.leaf(HOST))},
                                  secrets=(Secret("claude", PLACEHOLDER, frozenset({HOST}), lambda: REAL),),
                                  upstream_context=upstream.client_context(),
                                  upstream_address=lambda host, port: upstream.address)
            tunnel = f"127.0.0.1:{upstream.port}"
            guest = ssl.create_default_context(cafile=str(authority.cert))  # what the VM trusts
            guest.load_verify_locations(cafile=str(upstream.ca_file))  # the fake's CA stands for the public roots
            with netproxy.start(netproxy.Policy(allow=[HOST, tunnel]), Path(scratch) / "log.jsonl",
                                broker=brokering) as proxy:
                openers: dict[str, tuple[Opener, str, str]] = {
                    "direct": (lambda: guest.wrap_socket(tcp(upstream.address),
                                                         server_hostname=HOST), HOST, REAL),
                    "through the broker": (lambda: guest.wrap_socket(connect(proxy.port, f"{HOST}:443"),
                                                                     server_hostname=HOST), HOST, PLACEHOLDER),
                    "CONNECT tunnel": (lambda: guest.wrap_socket(connect(proxy.port, tunnel),
                                                                 server_hostname=OTHER), OTHER, REAL),
                }
                rows: list[tuple[str, float, float | None]] = []
                for kind in ("kept connection", "new connection"):
                    base = 0.0
                    for name, (opener, host, token) in openers.items():
                        if kind == "kept connection":
                            tls = opener()
                            value = median_ms(lambda tls=tls, host=host, token=token: ask(tls, host, token), args.runs)
                            tls.close()
                        else:
                            def fresh(opener: Opener = opener, host: str = host, token: str = token) -> None:
                                with opener() as tls:
                                    ask(tls, host, token)
                            value = median_ms(fresh, max(args.runs // 3, 10))
                        if name == "direct":
                            base = value
                        limit = None if name == "direct" else (5.0 if "broker" in name else 2.0)
                        rows.append((f"{kind}, {name}", value, None if limit is None else (value - base, limit)))
            brokered = [r.headers.get("authorization") for r in upstream.requests if r.host == HOST]
            assert set(brokered) == {f"Bearer {REAL}"}, set(brokered)  # every placeholder was swapped
    print(f"{'row':<38} {'median ms':>10} {'added ms':>9} {'target':>7}")
    for name, value, added in rows:
        if added is None:
            print(f"{name:<38} {value:>10.2f} {'':>9} {'':>7}")
        else:
            print(f"{name:<38} {value:>10.2f} {added[0]:>9.2f} {'ok' if added[0] <= added[1] else 'OVER':>7}")


if __name__ == "__main__":
    main()
