"""A size-capped log of every limactl call (argv with secrets masked, duration, exit code)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Sequence

from agentbox import lazyre, paths

MAX_BYTES = 1_000_000
_SECRET_ASSIGNMENT = lazyre.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$")
_SECRET_NAME = lazyre.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH", re.IGNORECASE)


def mask(argv: Sequence[str]) -> list[str]:
    masked = []
    for arg in argv:
        match = _SECRET_ASSIGNMENT.match(arg)
        if match and _SECRET_NAME.search(match.group(1)):
            arg = f"{match.group(1)}=***"
        masked.append(arg)
    return masked


def record(argv: Sequence[str], duration: float, exit_code: int, echo: bool = False) -> None:
    shown = mask(argv)
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": shown,
        "duration": round(duration, 4),
        "exit": exit_code,
    }
    if echo:
        print(f"[debug] {' '.join(shown)}  ({duration:.3f}s, exit {exit_code})", file=sys.stderr)
    log = paths.state_dir() / "limactl.log"
    try:
        log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if log.exists() and log.stat().st_size > MAX_BYTES:
            os.replace(log, log.with_suffix(".log.1"))
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
    except OSError:
        pass  # the log is a diagnostic aid; never fail a command because of it
