#!/usr/bin/env python3
"""Measure what `network.inspect: all` costs on loopback: an allowed host tunnelled versus inspected; print a table.

    python3 benchmarks/inspection.py [--runs 300] [--upload-mib 100] [--uploads 5]

The upstream (a TLS server that reads each request's body and answers `{}`) and the proxy each run in a process of
their own, as in use. The proxy serves the host two ways: as a CONNECT tunnel it does not look into (what
`inspect: credentials` does for a host that is no credential host), and TLS-terminated with the VM's CA (what
`inspect: all` does: the request read strictly, checked for placeholders, its bytes counted against
network.uploadLimit, the answer scanned). Rows:
- "request, kept connection": the median time of one small POST and its answer on an open connection;
- "new connection": the CONNECT, the TLS handshake(s) and one request;
- "upload": a body of --upload-mib MiB, the median of --uploads runs each, with the ratio and the proxy process's
  CPU time for one upload.
Targets (issue 41): inspection adds at most 2 ms per request at the median, and an upload through it stays within
15% of a tunnelled one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox.net import certauthority
from agentbox.net import proxy as netproxy
from agentbox.net.broker import Brokering
from benchmarks.broker import connect, median_ms

HOST = "files.example.org"
VM = "agentbox-inspect-bench"
UPSTREAM = "agentbox-inspect-bench-upstream"  # the upstream's own CA: it stands for the public roots
CHUNK = 1 << 16
Opener = Callable[[], ssl.SSLSocket]


def post(tls: ssl.SSLSocket, size: int, block: bytes) -> None:
    """One POST of `size` bytes on an open connection, its answer read whole."""
    tls.sendall(f"POST /upload HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {size}\r\n\r\n".encode())
    left = size
    while left:
        piece = block[:min(left, len(block))]
        tls.sendall(piece)
        left -= len(piece)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = tls.recv(65536)
        assert piece, "the connection ended before the answer"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    while len(body) < 2:
        body += tls.recv(65536)


# -- the two other processes ---------------------------------------------------------------------------------

def serve_upstream(rate: Any, ready: Any, stop: Any) -> None:
    """`rate`: a shared value, the bytes a second the upstream reads a body at (0: as fast as it can), as a host on
    the internet takes an upload."""
    authority = certauthority.load(UPSTREAM)
    assert authority is not None
    context = certauthority.server_context(authority.leaf(HOST))
    listener = socket.create_server(("127.0.0.1", 0))

    def one(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as tls:
            reader = tls.makefile("rb", buffering=1 << 20)
            while True:
                length = -1
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    if line in (b"\r\n", b"\n"):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                left = max(length, 0)
                started, limit = time.perf_counter(), rate.value
                while left:
                    left -= len(reader.read(min(left, 1 << 20)) or b"x" * left)
                    ahead = (length - left) / limit - (time.perf_counter() - started) if limit else 0
                    if ahead > 0:
                        time.sleep(ahead)
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    ready.send(listener.getsockname()[:2])
    stop.wait()


def serve_proxy(address: tuple[str, int], ready: Any, stop: Any) -> None:
    authority = certauthority.load(VM)
    upstream_ca = certauthority.load(UPSTREAM)
    assert authority is not None and upstream_ca is not None
    brokering = Brokering(leaves={HOST: certauthority.server_context(authority.leaf(HOST))},
                          upstream_context=ssl.create_default_context(cafile=str(upstream_ca.cert)),
                          upstream_address=lambda host, port: address, inspected=frozenset({HOST}))
    tunnel = f"127.0.0.1:{address[1]}"
    policy = netproxy.Policy(allow=[HOST, tunnel], allow_loopback=True, upload_limit=1 << 40)  # counted, no cap hit
    with tempfile.TemporaryDirectory() as logs, \
            netproxy.start(policy, Path(logs) / "log.jsonl", broker=brokering) as proxy:
        ready.send(proxy.port)
        while not stop.wait(0.05):
            if ready.poll():
                ready.recv()
                ready.send(resource.getrusage(resource.RUSAGE_SELF))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--upload-mib", type=int, default=100)
    parser.add_argument("--uploads", type=int, default=5)
    parser.add_argument("--link-mbit", type=int, default=1000,
                        help="the upstream's rate for the second upload rows, as a host on the internet takes it")
    args = parser.parse_args()
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["AGENTBOX_STATE_DIR"] = str(Path(scratch) / "state")
        authority = certauthority.ensure(VM, [HOST])
        upstream_ca = certauthority.ensure(UPSTREAM, [HOST])
        stop = context.Event()
        rate = context.Value("q", 0)
        upstream_end, upstream_ready = context.Pipe()
        proxy_end, proxy_ready = context.Pipe()
        processes = [context.Process(target=serve_upstream, args=(rate, upstream_ready, stop))]
        processes[0].start()
        address = tuple(upstream_end.recv())
        processes.append(context.Process(target=serve_proxy, args=(address, proxy_ready, stop)))
        processes[1].start()
        port = proxy_end.recv()
        try:
            rows = measure(args, authority, upstream_ca, address, port, proxy_end, rate)
        finally:
            stop.set()
            for process in processes:
                process.join(10)
    print(f"{'row':<50} {'median':>10} {'added':>9} {'target':>7}")
    for name, value, added, ok in rows:
        print(f"{name:<50} {value:>10} {added:>9} {ok:>7}")


def measure(args: argparse.Namespace, authority: certauthority.BrokerCA, upstream_ca: certauthority.BrokerCA,
            address: tuple[str, int], port: int, proxy: Any, rate: Any) -> list[tuple[str, str, str, str]]:
    guest = ssl.create_default_context(cafile=str(authority.cert))  # what the VM trusts: its CA ...
    guest.load_verify_locations(cafile=str(upstream_ca.cert))  # ... and the public roots
    tunnel = f"127.0.0.1:{address[1]}"
    openers: dict[str, Opener] = {
        "tunnelled": lambda: guest.wrap_socket(connect(port, tunnel), server_hostname=HOST),
        "inspected": lambda: guest.wrap_socket(connect(port, f"{HOST}:443"), server_hostname=HOST),
    }
    small = b"x" * 512
    block = os.urandom(CHUNK)
    rows: list[tuple[str, str, str, str]] = []
    for kind in ("request, kept connection", "request, new connection"):
        base = 0.0
        for name, opener in openers.items():
            if kind == "request, kept connection":
                tls = opener()
                value = median_ms(lambda tls=tls: post(tls, len(small), small), args.runs)
                tls.close()
            else:
                def fresh(opener: Opener = opener) -> None:
                    with opener() as tls:
                        post(tls, len(small), small)
                value = median_ms(fresh, max(args.runs // 3, 10))
            if name == "tunnelled":
                base = value
                rows.append((f"{kind}, {name}", f"{value:.2f} ms", "", ""))
            else:
                rows.append((f"{kind}, {name}", f"{value:.2f} ms", f"{value - base:.2f}",
                             "ok" if value - base <= 2.0 else "OVER"))
    for limit, label in ((0, "loopback"), (args.link_mbit * 125_000, f"{args.link_mbit} Mbit/s upstream")):
        rate.value = limit
        rows += uploads(args, openers, proxy, block, label)
    return rows


def uploads(args: argparse.Namespace, openers: dict[str, Opener], proxy: Any, block: bytes,
            label: str) -> list[tuple[str, str, str, str]]:
    size = args.upload_mib << 20
    walls: dict[str, list[float]] = {name: [] for name in openers}
    cpu: dict[str, list[float]] = {name: [] for name in openers}
    for _ in range(args.uploads):
        for name, opener in openers.items():  # alternately, so that load on the machine falls on both
            with opener() as tls:
                proxy.send("usage")
                before = proxy.recv()
                started = time.perf_counter()
                post(tls, size, block)
                walls[name].append(time.perf_counter() - started)
                proxy.send("usage")
                after = proxy.recv()
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    tunnelled, inspected = statistics.median(walls["tunnelled"]), statistics.median(walls["inspected"])
    mib = args.upload_mib
    return [
        (f"upload {mib} MiB ({label}), tunnelled", f"{tunnelled:.3f} s", "", ""),
        (f"upload {mib} MiB ({label}), inspected", f"{inspected:.3f} s", f"{inspected / tunnelled:.2f}x",
         "ok" if inspected <= tunnelled * 1.15 else "OVER"),
        *((f"  the proxy's CPU per {mib} MiB, {name}", f"{statistics.median(cpu[name]):.3f} s", "", "")
          for name in openers),
    ]


if __name__ == "__main__":
    main()
