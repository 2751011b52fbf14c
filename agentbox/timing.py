"""Per-phase timings, printed to stderr when AGENTBOX_TIMING=1 (or --timings) so users see where time goes."""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

_STARTED = time.perf_counter()
NAME_WIDTH = 34  # the phase names' column (wider when a name is longer); the numbers follow, right-aligned
_phases: list[tuple[str, float]] = []
_enabled = os.environ.get("AGENTBOX_TIMING", "") not in ("", "0")
_registered = False


def enable() -> None:
    global _enabled
    _enabled = True
    _register()


def enabled() -> bool:
    return _enabled


@contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        record(name, time.perf_counter() - started)


def record(name: str, seconds: float) -> None:
    if _enabled:
        _register()
        _phases.append((name, seconds))


def _register() -> None:
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_report)


def _report() -> None:
    if not _phases:
        return
    total = time.perf_counter() - _STARTED
    rows = [*_phases, ("total (since agentbox was loaded)", total)]
    # At least NAME_WIDTH (launch.sh's block in the VM uses it too), wider when a name needs it.
    width = max(NAME_WIDTH, *(len(name) for name, _ in rows))
    lines = ["agentbox timings:"]
    for name, seconds in rows:
        lines.append(f"  {name:{width}} {seconds * 1000:8.1f} ms")
    print("\n".join(lines), file=sys.stderr, flush=True)
