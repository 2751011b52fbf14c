#!/usr/bin/env python3
"""agentbox and the previous TypeScript agentbox side by side, in one run; print the ratio table.

    python3 benchmarks/compare.py [--runs 10] [--slow-runs 3] [--ts-tool DIR] [--latency ...] [--quick]

Both tools run against the same limactl double (tests/fake_limactl) at macOS-like latencies, each in a
sandbox of its own (HOME, LIMA_HOME, state folder: both name a project's VM `agentbox-FOLDER`), in the
same project folders, alternating run by run (agentbox first on even runs, the TypeScript tool first on
odd ones), so a busy moment costs both alike. Both sandboxes hold the same fake host logins (logins(): Claude
Code's two files, Codex's auth.json, the GitHub CLI's hosts.yml, fake tokens of the real shapes), so each
tool does what it does for a user who is logged in: the TypeScript tool copies them in with `limactl copy`
at every launch (17 calls for a warm one), agentbox brokers them.

"floor" is the time agentbox's limactl calls took, as the double reports it (its own start-up and the
simulated latency): what no tool making those calls can go below. "wall / own ms" is wall time and wall
time minus the time inside limactl. "own CPU" is the CPU time (user + system) of the tool's process tree,
everything it waited for, measured with getrusage(RUSAGE_CHILDREN) around each run, minus the CPU the
double says its calls used: unlike wall time it hardly moves when the machine is busy. The ratio is
agentbox's own CPU over the TypeScript tool's (medians), and the warm row's target is on it. The machine's
load is printed before the table and under it: compare figures from runs at a similar load.

The TypeScript tool is sky1core/agentbox at TS_COMMIT, run with `node DIR/dist/index.js`; DIR defaults to
~/.cache/agentbox-bench/ts-TS_COMMIT and must hold a build of that commit. This script does not build it
(nor fetch it); without a build, or without node, its columns say "skipped" and why. To build it:

    git clone <sky1core/agentbox on GitHub> ts-src
    mkdir -p ~/.cache/agentbox-bench/ts-TS_COMMIT
    git -C ts-src archive TS_COMMIT | tar -x -C ~/.cache/agentbox-bench/ts-TS_COMMIT
    cd ~/.cache/agentbox-bench/ts-TS_COMMIT && npm install && npm run build

The agentbox measured is the one `import agentbox` finds in the benchmark's environment (the header
names it): to measure a checkout, run with PYTHONPATH=<the checkout>.

--quick (for tests/test_benchmarks.py): one run of each row, a 200-file repository instead of 50,000,
no simulated latency.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import pwd
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402  (benchmarks/run.py: the sandbox and the double's install)

TS_REPOSITORY = "sky1core/agentbox"
TS_COMMIT = "90477b4a74439331d4b93d09fb02db992cd158c3"  # 2026-02-11, the TypeScript tool's last commit
# the account's home, not $HOME (a test's HOME is a temporary folder)
DEFAULT_TS_DIR = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "agentbox-bench" / f"ts-{TS_COMMIT}"
# The latencies (list 30 ms, shell 150 ms, start 20 s, create 2 s, clone 1 s), and those of the
# other calls a launch can make, as benchmarks/run.py has them.
DEFAULT_LATENCY = "list=0.03,shell=0.15,start=20,create=2,clone=1,copy=0.25,stop=3,rename=0.1"
QUICK_LATENCY = "*=0"
LAUNCH = ["codex", "exec", "true"]  # the same argv for both tools; codex is /bin/true in both configs
LARGE_FILES = 50_000
PLAN_SETTLE = 2.1  # agentbox saves a launch's verified plan once what it read is two seconds old
QUICK_FILES = 200

ROWS = ("warm", "warm, 50k-file repo", "allowlist warm", "cold from a base", "stopped", "--help",
        "bare interpreter start")
NOT_IN_TS = {
    "allowlist warm": "n/a: the TypeScript tool has no network policy",
    "cold from a base": "n/a: the TypeScript tool has no base VM (it creates each VM from an image)",
}
COLUMNS = ("row", "limactl calls (agentbox / TS)", "floor ms", "agentbox wall / own ms", "TS wall / own ms",
           "agentbox own CPU ms", "TS own CPU ms", "own CPU ratio", "target")
LOGIN_LIFETIME = 30 * 86400  # the fake logins expire in 30 days: neither tool refreshes them during a run


@dataclass(frozen=True)
class Sample:
    """One run of a tool: its wall time and its process tree's CPU, and what the limactl calls in it took."""

    wall: float
    tree_cpu: float
    calls: list[dict[str, Any]]

    @property
    def inside(self) -> float:
        return sum(call.get("duration") or 0 for call in self.calls)

    @property
    def own_cpu(self) -> float:
        return self.tree_cpu - sum(call.get("cpu") or 0 for call in self.calls)


@dataclass
class Tool:
    """One of the two tools, with its sandbox (its own HOME, LIMA_HOME and state folder)."""

    name: str
    command: list[str]
    box: bench.Sandbox
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def run(self, args: list[str], cwd: Path, env: dict[str, str] | None = None,
            command: list[str] | None = None) -> Sample:
        before = len(bench.read_calls(self.box.lima_home))
        argv = [*(command if command is not None else self.command), *args]
        cpu_before = tree_cpu()
        started = time.perf_counter()
        result = subprocess.run(argv, cwd=cwd, env={**self.box.env, **(env or {})}, capture_output=True,
                                stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - started
        cpu = tree_cpu() - cpu_before
        if result.returncode != 0:
            raise SystemExit(f"{self.name}: `{' '.join(argv)}` in {cwd} failed ({result.returncode}):\n"
                             f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}")
        return Sample(wall, cpu, bench.read_calls(self.box.lima_home)[before:])

    def limactl(self, *args: str, input: str | None = None) -> None:
        subprocess.run(["limactl", *args], env=self.box.env, input=input, text=True, capture_output=True,
                       check=True)


def tree_cpu() -> float:
    """User + system CPU seconds of every child this process has waited for (and of theirs, recursively)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def jwt(claims: dict[str, Any]) -> str:
    """A token of a JWT's shape (header, claims, signature) with a fake signature."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    return ".".join([part(b'{"alg":"RS256","typ":"JWT"}'), part(json.dumps(claims).encode()), part(b"benchsig")])


def logins(now: float) -> dict[str, str]:
    """The host login files both sandboxes hold (path under HOME: text): those of the TypeScript tool's list
    (src/sync/presets.ts, injectCredentials) that a user of Claude Code, Codex and the GitHub CLI has, in their
    real shapes with fake tokens. It copies each in with a `limactl copy` of its own and four shells more: the 9
    calls of a warm launch without logins become 17."""
    expires = int(now) + LOGIN_LIFETIME
    account = {"chatgpt_account_id": "00000000-bench-0000-0000-000000000000"}
    codex = {"OPENAI_API_KEY": None, "tokens": {
        "id_token": jwt({"email": "bench@example.com", "https://api.openai.com/auth": account, "exp": expires}),
        "access_token": jwt({"exp": expires, "https://api.openai.com/auth": account}),
        "refresh_token": "rt_BENCHFAKEREFRESHTOKEN0123456789", "account_id": account["chatgpt_account_id"]},
        "last_refresh": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
    claude = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-BENCHFAKEACCESS0123456789abcdef",
                                "refreshToken": "sk-ant-ort01-BENCHFAKEREFRESH0123456789abcdef",
                                "expiresAt": expires * 1000, "scopes": ["user:inference", "user:profile"],
                                "subscriptionType": "max"}}
    claude_state = {"numStartups": 12, "hasCompletedOnboarding": True, "userID": "0" * 64,
                    "oauthAccount": {"accountUuid": "00000000-bench-0000-0000-000000000001",
                                     "emailAddress": "bench@example.com"}, "projects": {}}
    gh = ("github.com:\n    users:\n        bench:\n            oauth_token: gho_BENCHFAKETOKEN0123456789abcdefghij\n"
          "    git_protocol: https\n    oauth_token: gho_BENCHFAKETOKEN0123456789abcdefghij\n    user: bench\n")
    return {".claude/.credentials.json": json.dumps(claude), ".claude.json": json.dumps(claude_state, indent=2),
            ".codex/auth.json": json.dumps(codex, indent=2), ".config/gh/hosts.yml": gh}


def write_logins(home: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)


def ts_tool(directory: Path) -> tuple[list[str] | None, str]:
    """The TypeScript tool's command, or None and why it is skipped."""
    node = shutil.which("node")
    entry = directory / "dist" / "index.js"
    if node is None:
        return None, "skipped: node is not on PATH"
    if not entry.is_file():
        return None, f"skipped: no build of {TS_REPOSITORY}@{TS_COMMIT[:7]} in {directory} (dist/index.js)"
    return [node, str(entry)], f"{TS_REPOSITORY}@{TS_COMMIT[:7]} in {directory}"


def git_repository(path: Path, files: int) -> Path:
    """A git repository of `files` small committed files in 100 folders."""
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    for index in range(files):
        sub = path / "src" / f"d{index % 100}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{index}.txt").write_text(f"{index}\n")
    identity = ["-c", "user.name=bench", "-c", "user.email=bench@example.com"]
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", *identity, "commit", "-q", "-m", f"{files} files"], cwd=path, check=True)
    return path


def ts_vm(tool: Tool, project: Path) -> None:
    """The TypeScript tool's VM for a project, made running in the double: the workspace mounted writable at
    its own path, as the tool's template has it (its vz, Rosetta and provisioning do not apply to the double)."""
    name = f"agentbox-{project.name}"
    spec = ("images:\n- location: https://cloud-images.ubuntu.com/releases/24.04/release/"
            "ubuntu-24.04-server-cloudimg-amd64.img\n  arch: x86_64\n"
            f"mounts:\n- location: {project}\n  mountPoint: {project}\n  writable: true\n")
    tool.limactl("--tty=false", "create", "--name", name, "-", input=spec)
    tool.limactl("--tty=false", "start", name)


def alternate(tools: list[Tool], row: str, runs: int, measure: Callable[[Tool], Sample],
              before: Callable[[Tool], None] | None = None) -> None:
    """runs of measure(tool) for each tool, the order swapped every run."""
    for index in range(runs):
        for tool in tools if index % 2 == 0 else tools[::-1]:
            if before is not None:
                before(tool)
            tool.samples.setdefault(row, []).append(measure(tool))


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def own_ms(samples: list[Sample]) -> float:
    return median_ms([sample.wall - sample.inside for sample in samples])


def own_cpu_ms(samples: list[Sample]) -> float:
    return median_ms([sample.own_cpu for sample in samples])


def wall_own(samples: list[Sample]) -> str:
    return f"{median_ms([sample.wall for sample in samples]):.1f} / {own_ms(samples):.1f}"


def calls_of(samples: list[Sample]) -> str:
    return "/".join(str(count) for count in sorted({len(sample.calls) for sample in samples}))


def table(agentbox: Tool, ts: Tool | None, ts_note: str) -> list[tuple[str, ...]]:
    """The rows, in ROWS' order: cells as printed."""
    rows: list[tuple[str, ...]] = []
    warm_own = own_ms(agentbox.samples["warm"])
    for row in ROWS:
        ours = agentbox.samples[row]
        theirs = ts.samples.get(row) if ts is not None else None
        reason = NOT_IN_TS.get(row) if ts is not None else ts_note
        ratio = own_cpu_ms(ours) / own_cpu_ms(theirs) if theirs else None
        rows.append((
            row,
            f"{calls_of(ours)} / {calls_of(theirs) if theirs else '-'}",
            f"{median_ms([sample.inside for sample in ours]):.1f}",
            wall_own(ours),
            wall_own(theirs) if theirs else str(reason),
            f"{own_cpu_ms(ours):.1f}",
            f"{own_cpu_ms(theirs):.1f}" if theirs else "n/a",
            f"{ratio:.2f}x" if ratio is not None else "n/a",
            target(row, ours, ratio, warm_own),
        ))
    return rows


def target(row: str, ours: list[Sample], ratio: float | None, warm_own: float) -> str:
    """The issue's target for a row, and whether this run met it."""

    def verdict(ok: bool) -> str:
        return "OK" if ok else "MISSED"

    def ratio_target(limit: float) -> str:
        if ratio is None:
            return f"<= {limit}x TS: n/a"
        return f"<= {limit}x TS: {verdict(ratio <= limit)}"

    if row == "warm":
        calls = max(len(sample.calls) for sample in ours)
        return f"1 limactl call: {verdict(calls <= 1)} ({calls}); own CPU {ratio_target(0.6)}"
    if row in ("warm, 50k-file repo", "allowlist warm"):
        limit = 30 if row == "warm, 50k-file repo" else 20
        extra = own_ms(ours) - warm_own
        return f"own <= warm + {limit} ms: {verdict(extra <= limit)} ({extra:+.1f} ms)"
    if row == "--help":
        return ratio_target(0.8)
    return "-"


def machine() -> str:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} cores {model}".strip()


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def load_line(before: str, after: str) -> str:
    return (f"load (1, 5, 15-minute averages, {os.cpu_count()} cores): {before} before, {after} after; "
            "own CPU compares across loads, wall time does not")


def measured_agentbox(box: bench.Sandbox) -> str:
    """Which agentbox the sandbox's environment imports, and its checkout's commit when it is one."""
    result = subprocess.run([sys.executable, "-c", "import agentbox; print(agentbox.__file__)"], env=box.env,
                            cwd=box.root, capture_output=True, text=True, check=True)
    folder = Path(result.stdout.strip()).parent.parent
    commit = subprocess.run(["git", "-C", str(folder), "describe", "--always", "--dirty"], capture_output=True,
                            text=True)
    return f"{folder}" + (f" at {commit.stdout.strip()}" if commit.returncode == 0 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="runs of each fast row, per tool")
    parser.add_argument("--slow-runs", type=int, default=3, help="runs of the stopped and cold rows, per tool")
    parser.add_argument("--latency", default=None, help=f"the double's latency per sub-command (s); "
                        f"default {DEFAULT_LATENCY}")
    parser.add_argument("--ts-tool", type=Path, default=DEFAULT_TS_DIR,
                        help="a build of the TypeScript tool at TS_COMMIT (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="one run each, a small repository, no latency")
    options = parser.parse_args(argv)
    if options.quick:
        options.runs = options.slow_runs = 1
    latency = options.latency or (QUICK_LATENCY if options.quick else DEFAULT_LATENCY)
    repository_files = QUICK_FILES if options.quick else LARGE_FILES
    ts_command, ts_note = ts_tool(options.ts_tool)

    started_at, load_before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load()
    boxes: list[bench.Sandbox] = []
    try:
        ours = bench.Sandbox(latency)
        boxes.append(ours)
        agentbox = Tool("agentbox", bench.agentbox_command(), ours)
        tools = [agentbox]
        ts: Tool | None = None
        if ts_command is not None:
            ts = Tool("TS", ts_command, bench.Sandbox(latency))
            boxes.append(ts.box)
            tools.append(ts)
        which = measured_agentbox(ours)
        files = logins(time.time())
        for tool in tools:
            tool.box.stub_agent()  # both read agents.codex.binary from ~/.config/agentbox/config.yml
            write_logins(tool.box.home, files)

        plain = ours.project("bench")
        large = git_repository(ours.root / "work" / "large", repository_files)
        time.sleep(1.1)  # files written in the second of the index are hashed again (racy-clean)
        agentbox.run(["start"], plain)
        agentbox.run(["start"], large)
        agentbox.run(LAUNCH, plain)  # the first launch in a VM stages what later ones find staged
        agentbox.run(LAUNCH, large)  # the first checkpoint reads every file
        time.sleep(2.1)  # files read within 2 s of a checkpoint are read again by the next one
        agentbox.run(LAUNCH, large)
        if ts is not None:
            for project in (plain, large):
                ts_vm(ts, project)
                ts.run(LAUNCH, project)  # its first launch in a VM installs its git and gh wrappers

        alternate(tools, "--help", options.runs, lambda tool: tool.run(["--help"], plain))
        bare = {"agentbox": [sys.executable, "-c", "pass"], "TS": [shutil.which("node") or "node", "-e", "0"]}
        alternate(tools, "bare interpreter start", options.runs,
                  lambda tool: tool.run([], plain, command=bare[tool.name]))
        alternate(tools, "warm", options.runs, lambda tool: tool.run(LAUNCH, plain))
        alternate(tools, "warm, 50k-file repo", options.runs, lambda tool: tool.run(LAUNCH, large))

        (plain / "agentbox.yml").write_text("network:\n  mode: allowlist\n")
        agentbox.run(LAUNCH, plain)  # the first launch in allowlist mode configures the VM's network
        time.sleep(PLAN_SETTLE)  # as a user's next launches find it: the config's change settled, a plan saved
        agentbox.run(LAUNCH, plain)
        alternate([agentbox], "allowlist warm", options.runs, lambda tool: tool.run(LAUNCH, plain))
        (plain / "agentbox.yml").unlink()
        agentbox.run(LAUNCH, plain)

        def stop(tool: Tool) -> None:
            tool.run(["stop"], plain)  # each tool stops its VM its own way

        alternate(tools, "stopped", options.slow_runs, lambda tool: tool.run(LAUNCH, plain), before=stop)

        base = {"AGENTBOX_VM_BASE": "auto"}
        agentbox.run(["base", "build"], plain, base)
        fresh = iter(range(options.slow_runs))
        alternate([agentbox], "cold from a base", options.slow_runs,
                  lambda tool: tool.run(LAUNCH, tool.box.project(f"cold{next(fresh)}"), base))

        rows = table(agentbox, ts, ts_note)
    finally:
        for box in boxes:
            box.remove()

    print(f"agentbox and the TypeScript tool side by side: {started_at}, {machine()}, "
          f"load {load_before} before, {load()} after")
    print(f"agentbox: {which}; TypeScript tool: {ts_note}")
    print(f"runs per tool: {options.runs} (stopped, cold: {options.slow_runs}), alternating; double latency "
          f"{latency}; 50k row: {repository_files} files; launch: `agentbox {' '.join(LAUNCH)}`; "
          f"host logins in both: {', '.join(files)}\n")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print(f"\n{load_line(load_before, load())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
