"""The run's own check that no proxy or broker outlives it (tests/leftovers.py), run on a test run of its own:
a process left behind fails that run and is killed; one that ends within the grace period, or one of another run,
does not count."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent

PROBE = '''
import subprocess, sys

def test_starts_a_proxy_like_process():
    # its command line names the proxy's module, as `python -m agentbox.net.guard VM` does
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep({sleep})", "agentbox.net.guard"],
                             start_new_session=True)
    open({pid_file!r}, "w").write(str(child.pid))
'''


def inner_run(tmp_path: Path, sleep: float) -> tuple[subprocess.CompletedProcess[str], int]:
    pid_file = tmp_path / f"pid-{sleep}"
    probe = tmp_path / f"test_probe_{str(sleep).replace('.', '_')}.py"
    probe.write_text(PROBE.format(sleep=sleep, pid_file=str(pid_file)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTBOX_TEST_LEFTOVER_GRACE": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.leftovers", "-p", "no:cacheprovider",
                             "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-n", "1", "-q",
                             str(probe)], capture_output=True, text=True, timeout=90, cwd=tmp_path, env=env)
    return result, int(pid_file.read_text())


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].startswith("Z")
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the check reads /proc (Linux)")
def test_a_proxy_left_running_fails_the_run_and_is_killed(tmp_path: Path) -> None:
    result, pid = inner_run(tmp_path, 60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 agentbox proxy processes outlived the run (killed now)" in result.stdout
    assert f"pid {pid}: " in result.stdout and "agentbox.net.guard" in result.stdout
    assert "1 passed" in result.stdout  # the test itself passed: the leftover is what failed the run
    wait_for(lambda: gone(pid), 10, "the leftover to be killed")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the check reads /proc (Linux)")
def test_one_that_ends_within_the_grace_period_does_not_count(tmp_path: Path) -> None:
    started = time.monotonic()
    result, pid = inner_run(tmp_path, 0.3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "outlived the run" not in result.stdout and gone(pid)
    assert time.monotonic() - started < 60
