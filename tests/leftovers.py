"""A pytest plugin: no agentbox proxy or broker process outlives the test run that started it (issue 36).

At configure time the run's controller (the xdist controller, or the only process without xdist) puts a mark of
its own in the environment, `AGENTBOX_TEST_RUN`, which its workers and every process they start inherit. When the
whole run ends (in the controller, after every worker finished), it looks through /proc for processes carrying
that mark whose command line runs the VM's proxy (`agentbox.credentials.broker.process`, `agentbox.net.guard`), gives
them GRACE_SEC to end (a proxy ends when its state folder goes, a broker when its VM is gone: both take a moment),
then kills those still there and fails the run, naming each. Processes of other runs (other marks) are left alone.

tests/conftest.py registers it; `python -m pytest -p tests.leftovers` loads it alone (tests/test_leftovers.py).
Linux only (/proc); elsewhere it finds nothing.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

RUN_MARK = "AGENTBOX_TEST_RUN"
PROGRAMS = (b"agentbox.credentials.broker.process", b"agentbox.net.guard")
GRACE_SEC = float(os.environ.get("AGENTBOX_TEST_LEFTOVER_GRACE", "10"))
_REPORT = pytest.StashKey[list[str]]()


def _controller(config: pytest.Config) -> bool:
    """Not an xdist worker (a worker's config has `workerinput`; its environment may not say: a run started from a
    worker of another run inherits PYTEST_XDIST_WORKER)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config):  # a run of its own, even one started from inside another run
        os.environ[RUN_MARK] = uuid.uuid4().hex


def found(mark: str) -> dict[int, str]:
    """{pid: command line} of this run's proxy and broker processes still running (zombies do not count)."""
    wanted = f"{RUN_MARK}={mark}".encode()
    hits: dict[int, str] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(word in PROGRAMS for word in words):
                continue
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(") ", 1)[1].startswith("Z"):
                continue
        except (OSError, IndexError):
            continue
        hits[int(entry.name)] = b" ".join(words).decode(errors="replace").strip()
    return hits


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    mark = os.environ.get(RUN_MARK)
    if not _controller(session.config) or not mark:
        return
    deadline = time.monotonic() + GRACE_SEC
    left = found(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = found(mark)
    if not left:
        return
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    session.config.stash[_REPORT] = [f"pid {pid}: {command}" for pid, command in sorted(left.items())]
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    lines = config.stash.get(_REPORT, [])
    if not lines:
        return
    terminalreporter.write_sep("!", f"{len(lines)} agentbox proxy processes outlived the run (killed now)",
                               red=True, bold=True)
    for line in lines:
        terminalreporter.write_line(line, red=True)
    terminalreporter.write_line(f"Each was still running {GRACE_SEC:g} s after the last test: a test left a VM's "
                                "proxy behind (a lease it held, a state folder outside tmp_path, a VM it never let "
                                "go). The run fails.", red=True, bold=True)
