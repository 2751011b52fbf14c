"""Checkpoints off a launch's critical path (issue 28): the shell starts while the start checkpoint is taken and
launch.sh starts the program only once the host recorded it (the go marker); a live session's end checkpoint is
taken after the CLI returned, and every command that reads checkpoints waits for it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agentbox import paths, staginglayout
from agentbox.git import store as hostgit
from tests.gitrepo import commit_all, init
from tests.helpers import NAME, FakeLima, run_agentbox, run_cli, write

pytestmark = pytest.mark.needs("git")

REPO = Path(__file__).resolve().parent.parent
SLOW = 2.0  # seconds the host's git takes to record a checkpoint's ref, when armed


@pytest.fixture
def repo(project: Path) -> Path:
    init(project)
    write(project / "keep.txt", "keep\n")
    commit_all(project)
    return project


@pytest.fixture
def slow_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A host `git` first on PATH that, while the returned file exists, takes SLOW seconds more to record a
    checkpoint's ref (`update-ref --no-deref`, its last step) and logs the time it finished, one line each, in
    the file's `.log` sibling. (agentbox gives git a PATH and nothing else of the environment: paths are built in.)"""
    real = shutil.which("git")
    assert real is not None
    armed = tmp_path / "slow-git"
    log = tmp_path / "slow-git.log"
    write(tmp_path / "slow-bin" / "git", f"""#!/bin/sh
for arg in "$@"; do
  if [ "$arg" = --no-deref ] && [ -e '{armed}' ]; then
    sleep {SLOW}
    '{real}' "$@"; code=$?
    python3 -c 'import time; print(repr(time.time()))' >> '{log}'
    exit $code
  fi
done
exec '{real}' "$@"
""", mode=0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'slow-bin'}{os.pathsep}{os.environ['PATH']}")
    return armed


def recorded_at(armed: Path) -> list[float]:
    log = armed.with_name(armed.name + ".log")
    return [float(line) for line in log.read_text().split()] if log.exists() else []


def shell_started(vm: FakeLima) -> float:
    from tests import fake_limactl

    return next(call["start"] for call in fake_limactl.read_calls(vm.home) if "shell" in call["argv"])


def tree_of(repo: Path, commit: str) -> list[str]:
    listing = subprocess.run(["git", f"--git-dir={hostgit.store_dir(repo)}", "ls-tree", "-r", "--name-only", commit],
                             capture_output=True, text=True, check=True)
    return listing.stdout.split()


def go_folder() -> Path:
    return paths.staging_dir(NAME) / staginglayout.GO_MARKERS


AGENT = 'python3 -c "import time; print(repr(time.time()))" > ran-at && echo "${AGENTBOX_CHECKPOINT-unset}" > got'


def test_the_shell_starts_at_once_and_the_program_only_once_the_start_checkpoint_is_recorded(
        repo: Path, vm: FakeLima, slow_git: Path) -> None:
    go = go_folder()
    go.mkdir(parents=True, exist_ok=True)
    (go / "0123456789abcdef").write_text("7\n999999999\n")  # a crashed launch's (no such process): swept
    (go / "fedcba9876543210").write_text(f"\n{os.getpid()}\n")  # a launch still running: kept
    slow_git.touch()
    result = run_agentbox("shell", "--", "sh", "-c", AGENT, cwd=repo, timeout=120)
    assert result.returncode == 0, result.stderr
    start_recorded = recorded_at(slow_git)[0]
    assert shell_started(vm) < start_recorded - SLOW / 2  # the shell did not wait for the checkpoint
    assert float((repo / "ran-at").read_text()) > start_recorded  # the program did
    assert (repo / "got").read_text() == "1\n"  # and got its id

    found = json.loads(run_cli("checkpoints", "--json", cwd=repo).stdout)
    assert [(r["id"], r["kind"]) for r in found] == [(1, "start"), (2, "end")]
    assert "ran-at" not in tree_of(repo, found[0]["commit"]) and "ran-at" in tree_of(repo, found[1]["commit"])
    assert sorted(os.listdir(go)) == ["fedcba9876543210"]  # this launch's marker is gone, the stale one too


def test_the_cli_returns_before_a_slow_end_checkpoint_and_readers_wait_for_it(
        repo: Path, vm: FakeLima, slow_git: Path) -> None:
    slow_git.touch()
    result = run_agentbox("shell", "--", "sh", "-c", "echo after > keep.txt", cwd=repo, timeout=120)
    returned = time.time()
    assert result.returncode == 0, result.stderr
    assert len(recorded_at(slow_git)) == 1  # the start checkpoint's; the end one is still being recorded
    listed = run_agentbox("checkpoints", "--json", cwd=repo)  # at once: it waits for the end checkpoint
    assert listed.returncode == 0, listed.stderr
    assert len(recorded_at(slow_git)) == 2 and recorded_at(slow_git)[1] > returned
    assert [(r["id"], r["kind"]) for r in json.loads(listed.stdout)] == [(1, "start"), (2, "end")]
    assert "waiting for the last session's end checkpoint" in listed.stderr
    diff = run_agentbox("diff", "--since", "2", "--name-only", cwd=repo)
    assert diff.returncode == 0 and diff.stdout == "" and "waiting" not in diff.stderr  # nothing pending now


def test_a_failed_start_checkpoint_still_runs_the_program(repo: Path, vm: FakeLima) -> None:
    store = hostgit.store_dir(repo)
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("in the way\n")  # the store cannot be made
    result = run_agentbox("shell", "--", "sh", "-c", AGENT, cwd=repo, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "the start checkpoint was not taken, the session goes on without it" in result.stderr
    assert (repo / "got").read_text() == "unset\n"
    assert os.listdir(go_folder()) == []


# -- the part on its own ---------------------------------------------------------------------------------------

PART = REPO / "provision" / "launch" / "checkpoint.sh"


def wait_for_go(stage: Path, token: str, path: str) -> subprocess.CompletedProcess:
    program = (f"set -euo pipefail\nstaging={stage}\ngo={token}\nsource {REPO / 'provision/launch/common.sh'}\n"
               f"source {PART}\ngo_limit=1\nPATH={path}\nwait_for_go\nprintf '%s' \"${{AGENTBOX_CHECKPOINT-unset}}\"\n")
    return subprocess.run([shutil.which("bash") or "/bin/bash", "-c", program], capture_output=True, text=True,
                          timeout=30)


def test_launch_sh_runs_no_process_when_the_marker_is_there_and_stops_when_it_never_comes(tmp_path: Path) -> None:
    stage = tmp_path / "staging"
    (stage / "go").mkdir(parents=True)
    (stage / "go" / "abc").write_text("12\n4242\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    there = wait_for_go(stage, "abc", str(empty))  # no program on PATH at all: nothing runs
    assert there.returncode == 0 and there.stdout == "12" and there.stderr == ""

    missing = wait_for_go(stage, "other", os.environ["PATH"])
    assert missing.returncode == staginglayout.GO_TIMED_OUT
    assert "did not record the workspace's start checkpoint within 1s, so the program was not started" \
           in missing.stderr
    assert f"go_limit={staginglayout.GO_LIMIT} " in PART.read_text()
    assert f"go_timed_out={staginglayout.GO_TIMED_OUT} " in PART.read_text()


def test_an_isolated_session_returns_before_its_slow_end_checkpoint_too(
        repo: Path, vm: FakeLima, slow_git: Path) -> None:
    # The end checkpoint of the workspace is not what the proposal is made from (the agent's copy is): an isolated
    # session hands it to a process of its own like a live one, and readers wait for it the same way.
    slow_git.touch()
    # The VM was created live: it still mounts the workspace, where the host's side changes during the session.
    during = f"echo copy > made.txt && echo host > '{repo}/keep.txt'"
    result = run_agentbox("shell", "--isolated", "--", "sh", "-c", during, cwd=repo, timeout=120)
    returned = time.time()
    assert result.returncode == 0, result.stderr
    assert "agentbox: proposal 1: 1 file changed;" in result.stderr
    before = recorded_at(slow_git)  # the start checkpoint's and the copy's base's refs; the end one is still to come
    listed = run_agentbox("checkpoints", "--json", cwd=repo)
    assert listed.returncode == 0, listed.stderr
    assert "waiting for the last session's end checkpoint" in listed.stderr
    assert len(recorded_at(slow_git)) == len(before) + 1 and recorded_at(slow_git)[-1] > returned
    found = json.loads(listed.stdout)
    assert [(r["id"], r["kind"]) for r in found] == [(1, "start"), (2, "end")]
    assert "made.txt" not in tree_of(repo, found[1]["commit"])  # the workspace's end, not the agent's copy
    shown = run_agentbox("diff", "--since", "session", "--name-only", cwd=repo)
    assert (shown.returncode, shown.stdout) == (0, "keep.txt\n")


def test_a_session_ending_while_anothers_end_checkpoint_is_taken_returns_at_once(
        repo: Path, vm: FakeLima, slow_git: Path) -> None:
    """Two sessions in one workspace: the first ends, its end checkpoint takes SLOW seconds more; the second ends
    meanwhile and returns without waiting for it. Both end checkpoints are recorded, the first session's first."""
    import sys

    def session(seconds: float, name: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c",
                                 f"sleep {seconds}; echo {name} > {name}.txt"], cwd=repo,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = session(3, "first")
    time.sleep(0.5)
    second = session(4, "second")
    time.sleep(2)  # both start checkpoints are recorded (git not slowed yet); from here each ref takes SLOW more
    slow_git.touch()
    assert first.wait(timeout=120) == 0, first.communicate()[1]
    _, second_err = second.communicate(timeout=120)
    second_returned = time.time()
    assert second.returncode == 0, second_err
    listed = run_agentbox("checkpoints", "--json", cwd=repo)  # waits for both end checkpoints
    assert listed.returncode == 0, listed.stderr
    first_end, second_end = recorded_at(slow_git)
    assert second_returned < first_end, "the second session waited for the first's end checkpoint"
    assert first_end < second_end
    ends = [r["commit"] for r in json.loads(listed.stdout) if r["kind"] == "end"]
    assert len(ends) == 2
    assert "first.txt" in tree_of(repo, ends[0]) and "second.txt" not in tree_of(repo, ends[0])  # the first's
    assert "second.txt" in tree_of(repo, ends[1])  # then the second's
