#!/usr/bin/env python3
"""What a held VM's connection costs (agentbox.net.hold); print a table.

    python3 benchmarks/hold.py [--runs 30]

In a held VM every new connection the guest makes to the proxy goes through QEMU's `guestfwd`, which starts
agentbox.net.holdconnector for it; the connector hands the connection to the proxy process and ends. Each sample
here does what QEMU does (a socket pair, the connector started on one end) and waits for the proxy's answer to a
CONNECT without credentials (407) on the other; the baseline is the same request over a TCP connection to the
proxy's port, as an unheld VM makes it. Medians in ms; the machine's load is printed with them.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox.net import hold as nethold
from agentbox.net import proxy as netproxy

REQUEST = b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:443\r\n\r\n"
CONNECTOR = Path(nethold.__file__).with_name("holdconnector.py")


def answered(sock: socket.socket) -> None:
    sock.settimeout(10)
    sock.sendall(REQUEST)
    if not sock.recv(64).startswith(b"HTTP/1.1 407"):
        raise SystemExit("the proxy did not answer 407")
    sock.close()


def tcp(port: int) -> None:
    answered(socket.create_connection(("127.0.0.1", port)))


def held(path: Path) -> None:
    guest, qemu_side = socket.socketpair()
    subprocess.Popen([sys.executable, "-I", "-S", str(CONNECTOR), f"proxy:{path}"], stdin=qemu_side, stdout=qemu_side)
    qemu_side.close()
    answered(guest)


def median_ms(run: Callable[[], None], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="abhold-"))
    os.chmod(folder, 0o700)
    path = folder / nethold.GUEST_SOCKET
    with netproxy.start(netproxy.Policy(allow=["example.org"]), folder / "log.jsonl", secret="ab" * 16,
                        guest_socket=path) as proxy:
        direct = median_ms(lambda: tcp(proxy.port), args.runs)
        through = median_ms(lambda: held(path), args.runs)
    print(f"load average {os.getloadavg()[0]:.2f}; a CONNECT answered by the VM's proxy, median of {args.runs}")
    print(f"{'path':<34} {'median ms':>10} {'added ms':>9}")
    print(f"{'unheld: TCP to the proxy port':<34} {direct:>10.2f} {0:>9.2f}")
    print(f"{'held: guestfwd connector, handed':<34} {through:>10.2f} {through - direct:>9.2f}")


if __name__ == "__main__":
    main()
