#!/usr/bin/env python3
"""Measure what the leak checks at the doors (agentbox.net.doors) add to an upload; print a table.

    python3 benchmarks/doors.py [--runs 200]

Each sample POSTs a 64 KiB body (JSON-like text, what an agent's API call carries) through agentbox.net.proxy to a
local HTTP server, a new connection each time (plain HTTP through the proxy is one request per connection), to two
proxies alternately: one without canaries or fingerprints, one with KEPT sessions' canaries and 1 MiB of private
files fingerprinted (the bounds: agentbox.session.canaries.KEPT, agentbox.session.privatefiles.MAX_TOTAL). The last
row is the check alone, in process: the same BodyCheck the broker runs on an intercepted request's body.
Target (issue 41): the checks add at most 2 ms at the median.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox.net import doors, fingerprints
from agentbox.net import proxy as netproxy
from agentbox.session import canaries

BODY = 64 << 10


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def body() -> bytes:
    words = [b"the", b"model", b"answer", b"function", b"return", b"value", b"import", b"class", b"{", b"}", b"\n"]
    rng = random.Random(7)
    text = b'{"messages": [{"role": "user", "content": "'
    while len(text) < BODY:
        text += rng.choice(words) + b" "
    return text[:BODY]


def post(proxy_port: int, target: str, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", proxy_port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"POST http://{target}/v1 HTTP/1.1\r\nHost: {target}\r\nContent-Length: {len(data)}\r\n\r\n"
                     .encode() + data)
        answer = b""
        while b"\r\n\r\nok" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer


def median_ms(run: Callable[[], None], runs: int) -> float:
    run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def plant(folder: Path) -> None:
    sessions = [{"id": str(n), "started": 0, "values": canaries.make()} for n in range(canaries.KEPT)]
    (folder / fingerprints.CANARIES_FILE).write_text(json.dumps({"sessions": sessions}))
    private = os.urandom(1 << 20)
    records = []
    for n in range(4):
        crcs, checks = fingerprints.window_hashes(private[n << 18:(n + 1) << 18])
        records.append({"path": f"secret{n}", "crc": base64.b64encode(crcs.tobytes()).decode(),
                        "check": base64.b64encode(checks.tobytes()).decode()})
    (folder / fingerprints.PRIVATE_FILE).write_text(json.dumps({"window": fingerprints.WINDOW, "files": records}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    data = body()
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    target = f"up.test:{sink.server_address[1]}"
    policy = netproxy.Policy(allow=[target], allow_loopback=True, resolver=lambda host, port: ["127.0.0.1"])
    rows = []
    with tempfile.TemporaryDirectory() as plain_dir, tempfile.TemporaryDirectory() as doors_dir, \
            netproxy.start(policy, Path(plain_dir) / "log.jsonl") as plain, \
            netproxy.start(policy, Path(doors_dir) / "log.jsonl") as checked:
        plant(Path(doors_dir))
        post(checked.port, target, data)  # the proxy reads the files once, at its first request
        times: dict[int, list[float]] = {plain.port: [], checked.port: []}
        for _ in range(args.runs):  # alternately: a busy machine slows both alike
            for port, samples in times.items():
                start = time.perf_counter()
                post(port, target, data)
                samples.append(time.perf_counter() - start)
        rows.append(("64 KiB POST, no canaries or fingerprints", statistics.median(times[plain.port]) * 1000))
        rows.append((f"64 KiB POST, {canaries.KEPT} sessions' canaries, 1 MiB fingerprinted",
                     statistics.median(times[checked.port]) * 1000))
        loaded = doors.load(Path(doors_dir))
        pieces = [data[at:at + 65536] for at in range(0, len(data), 65536)]

        def check() -> None:
            checker = loaded.body(None)
            for piece in pieces:
                assert checker.feed(piece) is None
            assert checker.end() is None

        rows.append(("the check alone (in process)", median_ms(check, args.runs)))
    sink.shutdown()
    print(f"{'what (median of ' + str(args.runs) + ')':66} {'ms':>8}")
    for label, value in rows:
        print(f"{label:66} {value:8.2f}")
    added = rows[1][1] - rows[0][1]
    print(f"{'added by the checks (target: at most 2 ms)':66} {added:8.2f}")


if __name__ == "__main__":
    main()
