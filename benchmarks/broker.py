#!/usr/bin/env python3
"""Measure what the credential broker adds on loopback; print a table.

    python3 benchmarks/broker.py [--runs 300] [--download-mib 100] [--downloads 5]

The upstream is tests/fake_upstream.py (one HTTPS server standing for api.anthropic.com and example.org) and the
proxy with its broker is agentbox.net.proxy; each runs in a process of its own, as in use (the broker is its own
process, the real host another machine). Rows:
- "kept connection": the median time of one `GET` with an Authorization header and its JSON answer, on a connection
  already open (what an agent CLI does for its API calls); through the broker the request is read strictly, the
  placeholder put in its place, the answer scanned for every real value, on a TLS connection to the broker and
  another from the broker to the upstream;
- "new connection": TCP, TLS handshake(s) and the request; through the broker that is the CONNECT, the guest's
  TLS with the broker's leaf, and the broker's own TLS to the upstream;
- "tunnel": a host that is not a credential host, through a plain CONNECT tunnel (no interception);
- "placement + answer scan": the broker's own judging of one request, in process: the head read, the credential
  placed, and an 8 KB answer scanned for 8 real values (what the rows above include);
- "download": a body of --download-mib MiB, direct and through the broker (its answer scanned as it streams for
  --held real values), the median of --downloads runs each: as fast as loopback goes, and from an upstream that
  sends at --link-mbit (as a host on the internet does); the rows give the ratio and the broker process's CPU time
  for one download.
Targets: an intercepted request adds at most 5 ms at the median and a tunnel at most 2 ms (issue 26); placement and
scan at most 1 ms, a download through the broker within 10% of a direct one (issue 36).
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox.net import certauthority, httpwire, placement, scan
from agentbox.net import proxy as netproxy
from agentbox.net.broker import Brokering, Secret
from tests.fake_upstream import FakeUpstream, Response

HOST = "api.anthropic.com"
OTHER = "example.org"
PLACEHOLDER = "sk-ant-oat01-agentbox-ph-" + "0" * 24
REAL = "sk-ant-oat01-real-token-for-the-benchmark"
HELD = [REAL, "sk-ant-ort01-refresh-token-for-the-benchmark", "gho_benchmarkGitHubToken0123456789",
        "ya29.a0-benchmark-google-access-token", "1//0g-benchmark-google/refresh-token",
        "sk-proj-benchmark-openai-api-key-0123", "AIzaSyBenchmarkGeminiKey0123456789ab",
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJiZW5jaCJ9.signature-of-the-benchmark"]
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


def download(tls: ssl.SSLSocket, host: str, token: str, size: int, rate: int) -> None:
    tls.sendall(f"GET /big?rate={rate} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    got = 0
    head = b""
    while b"\r\n\r\n" not in head:
        head += tls.recv(1 << 20)
    got = len(head.partition(b"\r\n\r\n")[2])
    while got < size:
        piece = tls.recv(1 << 20)
        assert piece, f"the download ended after {got} bytes"
        got += len(piece)


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


# -- the two other processes ---------------------------------------------------------------------------------

def serve_upstream(folder: Path, size: int, ready: Any, stop: Any) -> None:
    block = os.urandom(1 << 16)

    def big(rfile: Any, wfile: Any, rate: int = 0) -> None:
        """`size` bytes, at most `rate` bytes a second (0: as fast as it can)."""
        left = size
        started = time.perf_counter()
        while left:
            wfile.write(block[:min(left, len(block))])
            left -= min(left, len(block))
            if rate:
                ahead = (size - left) / rate - (time.perf_counter() - started)
                if ahead > 0:
                    time.sleep(ahead)

    with FakeUpstream(folder, [HOST, OTHER]) as upstream:
        upstream.route("GET", "/v1/models", {"data": []})
        upstream.route("GET", "/big", handler=lambda request: Response(
            200, headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            stream=lambda rfile, wfile: big(rfile, wfile, int(request.path.partition("rate=")[2] or 0))))
        ready.send(upstream.address)
        stop.wait()


def serve_proxy(folder: Path, address: tuple[str, int], held: list[str], ready: Any, stop: Any) -> None:
    authority = certauthority.load("agentbox-broker-bench")
    assert authority is not None
    brokering = Brokering(leaves={HOST: certauthority.server_context(authority.leaf(HOST))},
                          secrets=(Secret("claude", PLACEHOLDER, frozenset({HOST}), lambda: REAL),),
                          held=lambda: held,
                          upstream_context=ssl.create_default_context(cafile=str(folder / "upstream-ca.pem")),
                          upstream_address=lambda host, port: address)
    tunnel = f"127.0.0.1:{address[1]}"
    with netproxy.start(netproxy.Policy(allow=[HOST, tunnel], allow_loopback=True), folder / "log.jsonl",
                        broker=brokering) as proxy:
        ready.send(proxy.port)
        while not stop.wait(0.05):
            if ready.poll():
                ready.recv()
                ready.send(resource.getrusage(resource.RUSAGE_SELF))


# -- in process: the broker's own judging ----------------------------------------------------------------------

def judging_ms(runs: int) -> float:
    secrets = [Secret("claude", PLACEHOLDER, frozenset({HOST}), lambda: REAL)]
    view = placement.host_view(HOST, secrets)
    raw = (f"POST /v1/messages?beta=true HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n"
           "Content-Type: application/json\r\nanthropic-version: 2023-06-01\r\nanthropic-beta: oauth-2025-04-20\r\n"
           "User-Agent: claude-cli/2.0 (external, cli)\r\nAccept: application/json\r\nContent-Length: 512\r\n"
           "X-Stainless-Lang: js\r\nX-Stainless-Package-Version: 0.60.0\r\nX-Stainless-OS: Linux\r\n\r\n").encode()
    answer = (b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"' + b"word " * 1500
              + b'"}}\n\n')[:8192]
    needles = scan.variants(HELD)

    def judge() -> None:
        head = httpwire.parse_request(raw)
        path, _, query = head.first[1].partition("?")
        placement.place(view, head.first[0], path, httpwire.normal_path(path), query, head.headers, lambda s: REAL)
        scanner = scan.Scanner(needles)
        scanner.feed(answer[:4096])
        scanner.feed(answer[4096:])
        scanner.flush()

    return median_ms(judge, runs * 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--download-mib", type=int, default=100)
    parser.add_argument("--downloads", type=int, default=5)
    parser.add_argument("--link-mbit", type=int, default=1000,
                        help="the upstream's rate for the second download rows, as a host on the internet sends")
    parser.add_argument("--held", type=int, default=len(HELD),
                        help="how many real values the broker holds (its answers are scanned for each)")
    args = parser.parse_args()
    size = args.download_mib << 20
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["AGENTBOX_STATE_DIR"] = str(Path(scratch) / "state")
        authority = certauthority.ensure("agentbox-broker-bench", [HOST])
        folder = Path(scratch) / "upstream"
        stop = context.Event()
        upstream_end, upstream_ready = context.Pipe()
        proxy_end, proxy_ready = context.Pipe()
        processes = [context.Process(target=serve_upstream, args=(folder, size, upstream_ready, stop))]
        processes[0].start()
        address = tuple(upstream_end.recv())
        processes.append(context.Process(target=serve_proxy, args=(folder, address, HELD[:args.held], proxy_ready,
                                                                    stop)))
        processes[1].start()
        port = proxy_end.recv()
        try:
            rows = measure(args, authority, folder, address, port, size, proxy_end)
        finally:
            stop.set()
            for process in processes:
                process.join(10)
    print(f"{'row':<46} {'median':>10} {'added':>9} {'target':>7}")
    for name, value, added, ok in rows:
        print(f"{name:<46} {value:>10} {added:>9} {ok:>7}")


def measure(args: argparse.Namespace, authority: certauthority.BrokerCA, folder: Path, address: tuple[str, int],
            port: int, size: int, proxy: Any) -> list[tuple[str, str, str, str]]:
    tunnel = f"127.0.0.1:{address[1]}"
    guest = ssl.create_default_context(cafile=str(authority.cert))  # what the VM trusts
    guest.load_verify_locations(cafile=str(folder / "upstream-ca.pem"))  # the fake's CA stands for the public roots
    openers: dict[str, tuple[Opener, str, str]] = {
        "direct": (lambda: guest.wrap_socket(tcp(address), server_hostname=HOST), HOST, REAL),
        "through the broker": (lambda: guest.wrap_socket(connect(port, f"{HOST}:443"), server_hostname=HOST),
                               HOST, PLACEHOLDER),
        "CONNECT tunnel": (lambda: guest.wrap_socket(connect(port, tunnel), server_hostname=OTHER), OTHER, REAL),
    }
    rows: list[tuple[str, str, str, str]] = []
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
                rows.append((f"{kind}, {name}", f"{value:.2f} ms", "", ""))
            else:
                limit = 5.0 if "broker" in name else 2.0
                rows.append((f"{kind}, {name}", f"{value:.2f} ms", f"{value - base:.2f}",
                             "ok" if value - base <= limit else "OVER"))
    judged = judging_ms(args.runs)
    rows.append(("placement + answer scan (in process)", f"{judged:.3f} ms", f"{judged:.3f}",
                 "ok" if judged <= 1.0 else "OVER"))
    mib = args.download_mib
    for rate, label in ((0, "loopback"), (args.link_mbit * 125_000, f"{args.link_mbit} Mbit/s upstream")):
        walls: dict[str, list[float]] = {"direct": [], "through the broker": []}
        cpu: list[float] = []
        for _ in range(args.downloads):
            for name in walls:
                opener, host, token = openers[name]
                with opener() as tls:
                    proxy.send("usage")
                    before = proxy.recv()
                    started = time.perf_counter()
                    download(tls, host, token, size, rate)
                    walls[name].append(time.perf_counter() - started)
                    proxy.send("usage")
                    after = proxy.recv()
                if name != "direct":
                    cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        direct, brokered = statistics.median(walls["direct"]), statistics.median(walls["through the broker"])
        rows.append((f"download {mib} MiB ({label}), direct", f"{direct:.3f} s", "", ""))
        rows.append((f"download {mib} MiB ({label}), broker", f"{brokered:.3f} s", f"{brokered / direct:.2f}x",
                     "ok" if brokered <= direct * 1.10 else "OVER"))
        rows.append((f"  the broker's CPU per {mib} MiB ({args.held} held)", f"{statistics.median(cpu):.3f} s", "",
                     ""))
    return rows


if __name__ == "__main__":
    main()
