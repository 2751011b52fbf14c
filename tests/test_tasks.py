"""Background tasks through the CLI against the limactl double, whose guest keeps what a shell left
running: `agentbox run`, `tasks`, `logs`, `wait`, `cancel`, `tasks prune`, `diff --since task:ID`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, git, make_repository, run_agentbox, run_cli, write

pytestmark = pytest.mark.xdist_group("tasks")

# A stand-in agent for tasks: prints its arguments as JSON, then does what a prompt starting with `do:` asks
# (`;`-separated): sleep:S, exit:N, write:FILE:TEXT (in its folder), spam:MB (MiB on stdout), err:TEXT,
# ignore-term (TERM does not stop it).
TASK_AGENT = r"""#!/usr/bin/python3
import json, os, signal, sys, time
prompt = sys.argv[-1]
print(json.dumps({"args": sys.argv[1:], "cwd": os.getcwd()}), flush=True)
code = 0
if prompt.startswith("do:"):
    for step in prompt[3:].split(";"):
        what, _, arg = step.partition(":")
        if what == "sleep":
            time.sleep(float(arg))
        elif what == "exit":
            code = int(arg)
        elif what == "write":
            name, _, text = arg.partition(":")
            with open(name, "a") as f:
                f.write(text + "\n")
        elif what == "spam":
            block = b"x" * 1023 + b"\n"
            for _ in range(int(arg) * 1024):
                sys.stdout.buffer.write(block)
            sys.stdout.flush()
        elif what == "err":
            print(arg, file=sys.stderr, flush=True)
        elif what == "ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.exit(code)
"""


@pytest.fixture
def tasks_vm(project: Path, vm: FakeLima) -> FakeLima:
    """The project as a git repository (committed files, a local config), its VM running, the stand-in agent."""
    make_repository(project, config="tasks:\n  maxConcurrent: 2\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "work in progress")
    bin_dir = vm.home / NAME / "guestfs" / "usr-local" / "bin"
    write(bin_dir / "claude", TASK_AGENT, mode=0o755)
    vm.clear()
    return vm


def run_task(project: Path, *args: str, input: str | None = None) -> int:
    result = run_cli("run", *args, cwd=project, input=input)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout.strip())


def listing(project: Path, *args: str) -> list[dict]:
    result = run_cli("tasks", "--json", *args, cwd=project)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def task(project: Path, task_id: int) -> dict:
    return next(t for t in listing(project, "--all") if t["id"] == task_id)


def wait(project: Path, task_id: int, *args: str) -> subprocess.CompletedProcess:
    return run_agentbox("wait", *args, str(task_id), cwd=project, timeout=90)


def test_a_task_runs_the_agents_non_interactive_form_with_the_prompt_byte_for_byte(project: Path,
                                                                                    tasks_vm: FakeLima) -> None:
    prompt = "it's \"quoted\", $HOME and `cmd`,\nnew lines\n\n, tabs\t, unicode ✓ é 𝄞, and a trailing newline\n"
    task_id = run_task(project, "--", prompt)
    # A warm VM: one list and one shell, and `run` returned before the agent ended.
    assert tasks_vm.subcommands() == ["list", "shell"]
    done = wait(project, task_id)
    assert done.returncode == 0, done.stderr
    out = run_agentbox("logs", str(task_id), cwd=project)
    report = json.loads(out.stdout.splitlines()[0])
    assert report["args"] == ["--dangerously-skip-permissions", "-p", prompt]
    assert report["cwd"] == str(project)
    record = task(project, task_id)
    assert record["state"] == "Completed" and record["exitCode"] == 0
    assert [t["state"] for t in record["transitions"]] == ["Pending", "Queued", "Running", "Completed"]
    assert record["argv"] == ["claude", "--dangerously-skip-permissions", "-p"]
    assert record["checkpoint"] is not None


def test_the_prompt_can_come_from_stdin(project: Path, tasks_vm: FakeLima) -> None:
    task_id = run_task(project, "--agent", "claude", input="from stdin\n")
    assert wait(project, task_id).returncode == 0
    out = run_agentbox("logs", str(task_id), cwd=project)
    assert json.loads(out.stdout.splitlines()[0])["args"][-1] == "from stdin\n"
