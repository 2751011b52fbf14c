#!/usr/bin/env python3
"""Measure what writing a session's report (agentbox.session.endreport) adds to a session's end; print a table.

    python3 benchmarks/report.py [--runs 50] [--log-lines 20000] [--records 5000]

In a throwaway state folder: a proxy log of LOG_LINES lines across earlier upload windows (and 40 of the session's
own at its end), a push ledger, and a chain of RECORDS signed reports already there. Each sample builds the
session's record (its network and broker summaries from the log's tail) and signs it into the chain, as a
session's end does; the rows split the two. The control row reads the whole log the way `net log --hosts` does,
which is what a session's end must not do. Target (issue 42): at most 20 ms at the median, whatever the log's and
the chain's length.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentbox import paths
from agentbox.net import pushes, uploads
from agentbox.review import reportchain
from agentbox.session import endreport

VM = "agentbox-bench-0000"
HOSTS = ("api.anthropic.com", "github.com", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org")


def _stamp(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def make_log(lines: int, session_start: float) -> None:
    """LOG_LINES lines over the day before the session, each window an hour, then the session's own 40."""
    log = paths.vm_network_dir(VM) / uploads.LOG_FILE
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        for number in range(lines):
            moment = session_start - 86400 + number * 86000 / lines
            handle.write(json.dumps({"client": "127.0.0.1:1", "method": "CONNECT", "host": HOSTS[number % 5],
                                     "port": 443, "decision": "allow", "reason": "listed", "bytes_up": 2000,
                                     "bytes_down": 9000, "time": _stamp(moment),
                                     "window": _stamp(moment - moment % 3600)}) + "\n")
        for number in range(40):
            handle.write(json.dumps({"method": "POST", "host": HOSTS[number % 5], "port": 443,
                                     "decision": "deny" if number % 10 == 0 else "allow", "bytes_up": 4000,
                                     "bytes_down": 1000, "time": _stamp(session_start + 1),
                                     "window": "session"}) + "\n")
    ledger = pushes.ledger_path(VM)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text("".join(json.dumps({"time": _stamp(session_start - 3600), "outcome": "ok",
                                          "updates": [{"ref": f"refs/heads/agentbox/x/{n}", "old": "0" * 40,
                                                       "new": "1" * 40}]}) + "\n" for n in range(500)))


def make_chain(records: int) -> None:
    record = {"kind": "session", "agent": "claude", "vm": VM, "workspace": "/work/p", "state": "ended",
              "files": {"added": 3, "modified": 5, "removed": 1, "paths": [f"src/file{n}.py" for n in range(9)],
              "more": 0}}
    for _ in range(records):
        reportchain.append(record)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--log-lines", type=int, default=20000)
    parser.add_argument("--records", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentbox-report-bench-") as state:
        os.environ["AGENTBOX_STATE_DIR"] = state
        start = time.time() - 60
        make_log(args.log_lines, start)
        make_chain(args.records)
        facts = endreport.Facts("session", "claude", VM, "/work/p", False, "allowlist")
        build, sign, whole = [], [], []
        for _ in range(args.runs):
            began = time.perf_counter()
            record = endreport.draft(facts, _stamp(start), 0)
            built = time.perf_counter()
            reportchain.append(record)
            signed = time.perf_counter()
            build.append(built - began)
            sign.append(signed - built)
            with open(paths.vm_network_dir(VM) / uploads.LOG_FILE, "rb") as handle:
                uploads.per_host(handle, "session")
            whole.append(time.perf_counter() - signed)
        assert record["network"]["requests"] == 40 and record["network"]["denials"] == 4, record["network"]
        size = (paths.vm_network_dir(VM) / uploads.LOG_FILE).stat().st_size
        print(f"proxy log: {args.log_lines + 40} lines ({size >> 10} KiB); chain: {args.records + args.runs} "
              f"records; median of {args.runs}")
        print(f"{'what':64} {'ms':>8}")
        rows = [("the record: network and broker summaries from the log's tail", median_ms(build)),
                ("signing it into the chain (head, key, one file, the head again)", median_ms(sign))]
        for label, value in rows:
            print(f"{label:64} {value:8.2f}")
        total = median_ms([a + b for a, b in zip(build, sign, strict=True)])
        print(f"{'added to a session end (target: at most 20 ms)':64} {total:8.2f}")
        print(f"{'control: the whole log read, as `net log --hosts` does':64} {median_ms(whole):8.2f}")


if __name__ == "__main__":
    main()
