"""README.md's "A five-minute tour", walked in order through the CLI against the limactl double: each step's commands
as the README writes them, one after the other in one project, so a step that breaks what an earlier one made
(issue 37: `--isolated` after step 1's live VM) fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, agentbox, git, needs_bwrap, write

pytestmark = pytest.mark.timeout(300)

# The agent: what it was asked goes to agent.log, its work to README.md (in whatever tree it runs: the live
# workspace, the isolated copy, a task's worktree or copy).
TOUR_AGENT = r"""#!/bin/bash
printf '%s\n' "$*" >> agent.log
printf 'fixed by the agent\n' >> README.md
"""
FIXED = "my project\nfixed by the agent\n"


def readme_tour() -> str:
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return text[text.index("## A five-minute tour"):text.index("\n## ", text.index("## A five-minute tour") + 1)]


def tour_commands(tour: str, step: int) -> list[str]:
    """The `$ agentbox ...` lines of a step's console blocks, without their comments."""
    start = tour.index(f"**{step}. ")
    end = tour.index(f"**{step + 1}. ") if f"**{step + 1}. " in tour else len(tour)
    lines = re.findall(r"^\$ (.*)$", tour[start:end], re.M)
    return [line.split("  #")[0].strip() for line in lines]


def test_the_readme_tour_works_in_order(project: Path, limactl: FakeLima) -> None:
    """One test, about a minute against the double: the tour's steps build on one another, which is its point."""
    needs_bwrap()
    tour = readme_tour()
    # The commands the test runs are the README's (ids and names as a fresh project gets them).
    assert tour_commands(tour, 1) == ["cd ~/work/my-project", "agentbox claude"]
    assert tour_commands(tour, 2) == ["agentbox diff --stat", "agentbox checkpoints", "agentbox undo",
                                      "agentbox undo 14"]
    assert tour_commands(tour, 3) == ['agentbox claude --isolated -p "fix the failing tests"', "agentbox review",
                                      "agentbox apply"]
    assert tour_commands(tour, 4)[:2] == [
        "agentbox run --worktree --name tests -- 'Make the failing tests in tests/ pass'", "agentbox tasks"]
    write(project / "README.md", "my project\n")
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "init")

    # 1. Start an agent: the first run creates the VM (live) and runs the agent on the workspace.
    first = agentbox(project, "claude", timeout=300)
    assert first.returncode == 0, first.stderr
    assert "Creating VM agentbox-myproject" in first.stderr
    # In place of the stand-in the double's npm installed (it only prints): one that edits.
    for stand_in in (limactl.home / NAME / "guestfs").rglob("claude"):
        if stand_in.is_file() and b"(stand-in)" in stand_in.read_bytes():
            write(stand_in, TOUR_AGENT, mode=0o755)
    again = agentbox(project, "claude")  # a later run reuses the running VM
    assert again.returncode == 0, again.stderr
    assert (project / "README.md").read_text() == FIXED

    # 2. See what it changed, and take it back (and undo the undo, with the id undo names).
    stat = agentbox(project, "diff", "--stat")
    assert stat.returncode == 0, stat.stderr
    assert "README.md" in stat.stdout
    assert agentbox(project, "checkpoints").returncode == 0
    undo = agentbox(project, "undo")
    assert undo.returncode == 0, undo.stderr
    assert (project / "README.md").read_text() == "my project\n", undo.stderr
    taken = re.search(r"`agentbox undo (\d+)` returns to it", undo.stdout)
    assert taken, undo.stderr
    redo = agentbox(project, "undo", taken.group(1))
    assert redo.returncode == 0, redo.stderr
    assert (project / "README.md").read_text() == FIXED
    git(project, "add", "-A")
    git(project, "commit", "-qm", "the agent's fix")

    # 3. Keep the agent off your files: on the live VM step 1 made, the session runs on a copy.
    before = (project / "agent.log").read_text()
    isolated = agentbox(project, "claude", "--isolated", "-p", "fix the failing tests")
    assert isolated.returncode == 0, isolated.stderr
    assert "agentbox: proposal 1: 2 files changed;" in isolated.stderr
    assert (project / "agent.log").read_text() == before  # the workspace was not touched
    review = agentbox(project, "review")
    assert review.returncode == 0, review.stderr
    assert "+-p fix the failing tests" in review.stdout.replace("--dangerously-skip-permissions ", "")
    applied = agentbox(project, "apply")
    assert applied.returncode == 0, applied.stderr
    assert (project / "agent.log").read_text().endswith("-p fix the failing tests\n")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "applied")

    # 4. Background tasks: one in a worktree of its own, one on a copy.
    task = agentbox(project, "run", "--worktree", "--name", "tests", "--", "Make the failing tests in tests/ pass")
    assert task.returncode == 0, task.stderr
    assert task.stdout == "1\n"
    assert agentbox(project, "tasks").returncode == 0
    waited = agentbox(project, "wait", "tests")
    assert waited.returncode == 0, waited.stderr + waited.stdout
    subprocess.run(["git", "merge", "-q", "--no-edit", "agentbox/task-1"], cwd=project, check=True,
                   capture_output=True)
    assert (project / "agent.log").read_text().endswith("Make the failing tests in tests/ pass\n")
    on_copy = agentbox(project, "run", "--on", "local", "--", "Refactor the parser")
    assert on_copy.returncode == 0, on_copy.stderr
    waited = agentbox(project, "wait", on_copy.stdout.strip())
    assert waited.returncode == 0, waited.stderr + waited.stdout
    assert "proposal 2" in waited.stdout + waited.stderr

    # 5. Close the network: the README's agentbox.yml, then its commands (`net log` without -f, which follows).
    assert tour_commands(tour, 5) == ["agentbox net test https://example.org", "agentbox net log -f",
                                      "agentbox net log --hosts", "agentbox net log --leaks"]
    block = re.search(r"```yaml\n# agentbox.yml\n(.*?)```", tour, re.S)
    assert block
    write(project / "agentbox.yml", block.group(1))
    probe = agentbox(project, "net", "test", "https://example.org")  # one of: allowed, blocked by policy, no route
    assert probe.returncode == 1
    assert probe.stdout.startswith("https://example.org: blocked by policy (host not in the allow list)")
    log = agentbox(project, "net", "log")
    assert log.returncode == 0, log.stderr
    assert "deny   CONNECT example.org:443" in log.stdout
    hosts = agentbox(project, "net", "log", "--hosts")
    assert hosts.returncode == 0 and "example.org" in hosts.stdout, hosts.stdout + hosts.stderr
    leaks = agentbox(project, "net", "log", "--leaks")
    assert leaks.returncode == 0 and "example.org" not in leaks.stdout, leaks.stdout + leaks.stderr

    # 6. Configure, trust, check.
    shown = agentbox(project, "config")
    assert shown.returncode == 0, shown.stderr
    assert 'network.mode: "allowlist"  # local' in shown.stdout
    trusted = agentbox(project, "trust")
    assert trusted.returncode == 0, trusted.stderr
    doctor = agentbox(project, "doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert "0 problems" in doctor.stdout
