#!/usr/bin/env python3
"""Remote tasks (issue 29): what a submit to a warm remote VM costs, and `agentbox tasks` with remote tasks
recorded, against a real sshd on 127.0.0.1 with a second local user standing for the host (tests/remotehost.py)
and the limactl double on both sides; print a table. Needs root (it starts sshd and leases a test user).

    sudo python3 benchmarks/remote.py [--runs 5] [--tasks 200]

Rows: the first task (the remote VM made on first use), warm submits (wall time of `agentbox run --on big` until
it returns; ssh invocations by kind: a command on the host is a round trip, a `-O` control request goes over the
open master (`-O forward` is one round trip too, `-O check` none); limactl calls on the host; bundle bytes sent),
and `agentbox tasks` with N remote tasks recorded, the host unreachable (wall time; ssh invocations: must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import remotehost  # noqa: E402
from tests.fake_limactl import install, read_calls, read_ssh_passthrough  # noqa: E402

AGENT = "import sys; print(sys.argv[-1])"
CONFIG = ("notify: false\nagents:\n  stub:\n    binary: python3\n"
          f"    defaultArgs: [-c, {json.dumps(AGENT)}]\n")
TASKS_BUDGET = 0.300


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=200)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (it starts sshd and uses a second local user)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="abremote"))
    scratch = tempfile.mkdtemp(prefix="abrd", dir="/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    os.chmod(scratch, 0o755)
    lima_home = Path(tempfile.mkdtemp(prefix="lh", dir="/tmp"))
    home = root / "home"
    home.mkdir()
    bin_dir = root / "bin"
    install(bin_dir, lima_home)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("AGENTBOX_", "XDG_", "FAKE_LIMACTL"))},
           "HOME": str(home), "LIMA_HOME": str(lima_home), "AGENTBOX_STATE_DIR": str(root / "state"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    double_bin = remotehost.install_double(Path(scratch) / "d")
    rows: list[tuple[str, str, str, str, str]] = []
    try:
        with remotehost.hosts_factory(home, double_bin, scratch) as factory:
            host = factory(1)[0]
            project = root / "work" / "myproject"
            project.mkdir(parents=True)
            (project / "agentbox.yml").write_text(CONFIG)
            for index in range(200):
                (project / f"file{index}.txt").write_text(f"content {index}\n" * 50)
            git = ["git", "-c", "user.name=b", "-c", "user.email=b@b"]
            subprocess.run([*git, "init", "-q"], cwd=project, check=True)
            subprocess.run([*git, "add", "-A"], cwd=project, check=True)
            subprocess.run([*git, "commit", "-qm", "init"], cwd=project, check=True)

            def agentbox(*words: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
                return subprocess.run([sys.executable, "-m", "agentbox", *words], cwd=project, env=env,
                                      capture_output=True, text=True, timeout=timeout)

            assert agentbox("hosts", "add", "big", host.url, "--no-check").returncode == 0
            assert agentbox("trust").returncode == 0
            vms = root / "state" / "vms"

            def quiet() -> None:
                """Every keeper ended (they poll the host): what follows counts only its own ssh calls."""
                from agentbox.tasks import keeper

                os.environ["AGENTBOX_STATE_DIR"] = env["AGENTBOX_STATE_DIR"]
                deadline = time.monotonic() + 60
                tasks_dir = root / "state" / "tasks"
                while time.monotonic() < deadline and tasks_dir.exists() and any(
                        keeper.running(int(p.name)) for p in tasks_dir.iterdir() if p.name.isdigit()):
                    time.sleep(0.2)

            def submit(label: str, prompt: str) -> tuple[float, dict[str, int], int, int]:
                quiet()
                ssh_before = len(read_ssh_passthrough(lima_home))
                calls_before = len(read_calls(host.lima_home))
                bundles_before = {p.name for p in vms.glob("*.on-big/staging/bundles/*.bundle")}
                started = time.monotonic()
                result = agentbox("--timings", "run", "--agent", "stub", "--on", "big", prompt)
                if os.environ.get("AGENTBOX_BENCH_SHOW_TIMINGS"):
                    print(label, result.stderr, file=sys.stderr)
                took = time.monotonic() - started
                if result.returncode != 0:
                    raise SystemExit(f"{label}: {result.stderr}")
                kinds: dict[str, int] = {}
                for call in read_ssh_passthrough(lima_home)[ssh_before:]:
                    argv = call["argv"]
                    kind = f"-O {argv[argv.index('-O') + 1]}" if "-O" in argv else "command"
                    kinds[kind] = kinds.get(kind, 0) + 1
                calls = len(read_calls(host.lima_home)) - calls_before
                new = [p for p in vms.glob("*.on-big/staging/bundles/*.bundle") if p.name not in bundles_before]
                waited = agentbox("wait", result.stdout.strip())
                if waited.returncode != 0:
                    raise SystemExit(f"{label}: {waited.stderr}")
                return took, kinds, calls, sum(p.stat().st_size for p in new)

            took, kinds, calls, sent = submit("first", "first")
            rows.append(("first task (remote VM made)", f"{took * 1000:.0f}", _kinds(kinds), str(calls), str(sent)))
            walls, last = [], None
            for run in range(args.runs):
                (project / "file0.txt").write_text(f"changed {run}\n")
                last = submit("warm", f"warm {run}")
                walls.append(last[0])
            assert last is not None
            rows.append((f"warm submit, one file changed (median of {args.runs})",
                         f"{statistics.median(walls) * 1000:.0f}", _kinds(last[1]), str(last[2]), str(last[3])))

            # `tasks` with many remote tasks recorded, the host gone: last known state, nothing asked.
            tasks_dir = root / "state" / "tasks"
            template = json.loads((tasks_dir / "1" / "task.json").read_text())
            next_id = max(int(p.name) for p in tasks_dir.iterdir() if p.name.isdigit()) + 1
            for offset in range(args.tasks):
                number = next_id + offset
                (tasks_dir / str(number)).mkdir()
                (tasks_dir / str(number) / "task.json").write_text(json.dumps(
                    {**template, "id": number, "state": "Running", "harvested": False, "handed": True}))
            (tasks_dir / "next").write_text(f"{next_id + args.tasks}\n")
            import fcntl

            held = []  # their keepers, as if running: the listing starts none (it never waits for a host anyway)
            for number in range(next_id, next_id + args.tasks):
                handle = open(tasks_dir / str(number) / "keeper.lock", "w")  # noqa: SIM115
                fcntl.flock(handle, fcntl.LOCK_EX)
                held.append(handle)
            quiet()
            host.close()
            ssh_before = len(read_ssh_passthrough(lima_home))
            times = []
            for _ in range(args.runs):
                started = time.monotonic()
                listed = agentbox("tasks")
                times.append(time.monotonic() - started)
                assert listed.returncode == 0, listed.stderr
            asked = len(read_ssh_passthrough(lima_home)) - ssh_before
            median = statistics.median(times)
            verdict = "OK" if median <= TASKS_BUDGET and asked == 0 else "MISSED"
            rows.append((f"tasks, {args.tasks + args.runs + 1} remote recorded, host down",
                         f"{median * 1000:.0f} ({verdict}: <= 300)", f"{asked}", "0", "-"))
            for handle in held:
                handle.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(lima_home, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    header = ("row", "wall ms", "ssh invocations", "limactl calls there", "bundle bytes sent")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0


def _kinds(kinds: dict[str, int]) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "0"


if __name__ == "__main__":
    sys.exit(main())
