#!/usr/bin/env python3
"""Measure agentbox at scale against the limactl double; print a table with the targets (issue 28, item 6).

    python3 benchmarks/scale.py [--runs 5] [--files 2000] [--tasks 1000] [--tree 50000] [--only sync|tasks|review]

Rows:
- first sync of 2,000 skill files: a warm `claude --version` launch after the staged copies, the VM's copies and
  its records were forgotten, minus the same launch with nothing to sync (host + VM, the double's simulated
  latency left out: it is the same in both); the VM's part is launch.sh's own setup step (--timings).
- `agentbox tasks` with 1,000 records (two of them running, so it asks Lima once), with the state folder where
  users have it (platformdirs' default under HOME, not AGENTBOX_STATE_DIR).
- `agentbox diff --name-only` and `agentbox undo --dry-run` in a git repository of 50,000 files, each beside
  `git status --porcelain -uall` of the same tree, in the same round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Sandbox, agentbox_command, record_tasks

TARGETS = {"first sync": 1.0, "tasks": 0.300}
RATIO_TARGET = 1.3
# macOS-like, but a VM start of 1 s: the rows measure agentbox's own time, the starts only prepare them.
LATENCY = "list=0.03,shell=0.15,copy=0.25,start=1,create=1,clone=1,stop=0.5,rename=0.1"


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.1f}"


def own(box: Sandbox, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    wall, inside, _ = box.run(args, cwd, env)
    return wall - inside


def setup_step(stderr: str) -> float:
    line = next((line for line in stderr.splitlines() if "setup step (launch.sh)" in line), None)
    return float(line.split()[-2]) / 1000 if line else 0.0


def sync_rows(box: Sandbox, runs: int, files: int) -> list[tuple[str, str, str, str]]:
    project = box.project("sync")
    box.stub_agent()
    box.run(["start"], project)
    box.run(["claude", "--version"], project)
    nothing = []
    for _ in range(runs):
        nothing.append((own(box, ["--timings", "claude", "--version"], project), setup_step(box.last_stderr)))
    box.synced_files(files)
    box.run(["claude", "--version"], project)  # so that each round forgets a sync that happened
    first = []
    for _ in range(runs):
        box.forget_sync(project)
        first.append((own(box, ["--timings", "claude", "--version"], project), setup_step(box.last_stderr)))
    base_total = statistics.median(t for t, _ in nothing)
    base_vm = statistics.median(v for _, v in nothing)
    added = [t - base_total for t, _ in first]
    added_vm = [v - base_vm for _, v in first]
    added_host = [a - v for a, v in zip(added, added_vm, strict=True)]
    total = statistics.median(added)
    return [
        (f"first sync, {files} files: added", median_ms(added), f"<= {TARGETS['first sync'] * 1000:.0f} ms",
         "OK" if total <= TARGETS["first sync"] else "MISSED"),
        ("  of which host", median_ms(added_host), "-", "-"),
        ("  of which VM (launch.sh)", median_ms(added_vm), "-", "-"),
    ]


def tasks_rows(box: Sandbox, runs: int, count: int) -> list[tuple[str, str, str, str]]:
    project = box.project("tasks")
    box.stub_agent()
    box.run(["start"], project)
    # The state folder where users have it: platformdirs' answer under HOME, computed as a launch computes it.
    state = box.home / ".local" / "state" / "agentbox"
    saved = box.env["AGENTBOX_STATE_DIR"]
    box.env["AGENTBOX_STATE_DIR"] = str(state)
    record_tasks(box, project, count)
    (state / "vms").mkdir(parents=True, exist_ok=True)
    del box.env["AGENTBOX_STATE_DIR"]
    try:
        samples = []
        for _ in range(runs):
            for heartbeat in state.glob("vms/*/outbox/tasks/*/heartbeat"):
                heartbeat.write_text(f"{int(time.time())}\n")
            wall, inside, _ = box.run(["tasks"], project)
            samples.append(wall - inside)
    finally:
        box.env["AGENTBOX_STATE_DIR"] = saved
    value = statistics.median(samples)
    return [(f"tasks, {count} recorded (own)", median_ms(samples), f"<= {TARGETS['tasks'] * 1000:.0f} ms",
             "OK" if value <= TARGETS["tasks"] else "MISSED")]


def big_tree(box: Sandbox, count: int) -> Path:
    project = box.project("review")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    folders = max(1, count // 500)
    for folder in range(folders):
        sub = project / "src" / f"d{folder}"
        sub.mkdir(parents=True)
        for index in range(count // folders):
            (sub / f"f{index}.txt").write_text(f"{folder} {index}\n")
    identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", *identity, "commit", "-q", "-m", "files"], cwd=project, check=True)
    return project


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr.decode()}")
    return elapsed


def review_rows(box: Sandbox, runs: int, count: int) -> list[tuple[str, str, str, str]]:
    project = big_tree(box, count)
    git_status = ["git", "--no-optional-locks", "status", "--porcelain", "-uall"]
    subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=project, check=True, capture_output=True)
    box.run(["checkpoint"], project)
    for folder in range(0, max(1, count // 500), 2):  # 50 changed files, one created
        (project / "src" / f"d{folder}" / "f1.txt").write_text("changed\n")
    (project / "new.txt").write_text("new\n")
    time.sleep(2.1)  # past the racy-clean window of the index and the snapshot's cache
    box.run(["diff", "--since", "1", "--name-only"], project)  # settles the snapshot's cache, as any later command finds it
    subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=project, check=True, capture_output=True)
    samples: dict[str, list[float]] = {"git status": [], "diff": [], "undo --dry-run": []}
    for _ in range(runs):  # alternating, so a busy moment costs each alike
        samples["git status"].append(timed(git_status, project, box.env))
        samples["diff"].append(timed([*agentbox_command(), "diff", "--since", "1", "--name-only"], project, box.env))
        samples["undo --dry-run"].append(timed([*agentbox_command(), "undo", "--dry-run", "1"], project, box.env))
    floor = statistics.median(samples["git status"])
    rows = [(f"git status -uall, {count} files", median_ms(samples["git status"]), "floor", "-")]
    for label in ("diff", "undo --dry-run"):
        ratio = statistics.median(samples[label]) / floor
        rows.append((f"{label}, {count} files", median_ms(samples[label]), f"<= {RATIO_TARGET}x git status",
                     f"{'OK' if ratio <= RATIO_TARGET else 'MISSED'} ({ratio:.2f}x)"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--tree", type=int, default=50_000)
    parser.add_argument("--latency", default=LATENCY, help="the double's simulated latency per subcommand (s)")
    parser.add_argument("--only", choices=("sync", "tasks", "review"))
    options = parser.parse_args()
    rows: list[tuple[str, str, str, str]] = []
    for name, make in (("sync", lambda box: sync_rows(box, options.runs, options.files)),
                       ("tasks", lambda box: tasks_rows(box, options.runs, options.tasks)),
                       ("review", lambda box: review_rows(box, options.runs, options.tree))):
        if options.only not in (None, name):
            continue
        box = Sandbox(options.latency)
        try:
            rows += make(box)
        finally:
            box.remove()
    print(f"agentbox at scale: {options.runs} runs, medians; double latency {options.latency}; "
          f"agentbox from {agentbox_command()[-1]} ({os.environ.get('PYTHONPATH', 'installed')})")
    print(f"{'case':38} {'ms':>8}  {'target':24} verdict")
    for label, value, target, verdict in rows:
        print(f"{label:38} {value:>8}  {target:24} {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
