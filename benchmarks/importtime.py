#!/usr/bin/env python3
"""What a warm launch imports: one `agentbox codex exec true` under `python -X importtime`, as a short figure.

    python3 benchmarks/importtime.py [--check] [--output DIR]

In a benchmark sandbox (benchmarks/run.py's: the limactl double, a throwaway HOME, codex stubbed as /bin/true)
the VM is started and launched in, then the measured launch is repeated (two seconds apart) until it runs from
its verified plan (agentbox.session.plan), as a user's warm launches do (one limactl call); that launch
runs the console script a user runs under `python -X importtime`, and its stderr gives the figure: the number
of modules imported, how many of them are agentbox's, the total import time (the cumulative time of the
top-level imports, in µs) and the slowest top-level imports. It is written to
benchmarks/importtime/<agentbox version>.txt (one per release, `--output` names another folder); `--check`
prints it and writes nothing. Import times move with the machine's load (printed in the figure): compare the
module counts first, the times between runs at a similar load.

The agentbox measured is the one `import agentbox` finds in the benchmark's environment (the figure names it):
to measure a checkout, run with PYTHONPATH=<the checkout>.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  (benchmarks/compare.py: the machine, the load, which agentbox is measured)
import run as bench  # noqa: E402  (benchmarks/run.py: the sandbox and the double's install)

DEFAULT_OUTPUT = HERE / "importtime"
SLOWEST = 25
LATENCY = "*=0"  # the double's latency does not change what agentbox imports


@dataclass(frozen=True)
class Import:
    """One line of `-X importtime`: a module imported for the first time."""

    name: str
    self_us: int
    cumulative_us: int
    depth: int  # 0 for a top-level import, 1 for one it made, ...


def parse(stderr: str) -> list[Import]:
    """The imports in `-X importtime` output, in its order; other lines (the tool's own output) are skipped."""
    imports = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        own, cumulative, name = line[len("import time:"):].split("|", 2)
        if not own.strip().isdigit():  # the header line
            continue
        stripped = name.lstrip(" ")
        imports.append(Import(stripped.rstrip(), int(own), int(cumulative), (len(name) - len(stripped) - 1) // 2))
    return imports


def figure(imports: list[Import], header: list[str]) -> str:
    """The figure's text: the header lines, the counts, the total and the slowest top-level imports."""
    top = [item for item in imports if item.depth == 0]
    ours = [item for item in imports if item.name == "agentbox" or item.name.startswith("agentbox.")]
    slowest = sorted(top, key=lambda item: item.cumulative_us, reverse=True)[:SLOWEST]
    lines = [*header, "",
             f"modules imported: {len(imports)}",
             f"agentbox modules: {len(ours)}",
             f"total import time: {sum(item.cumulative_us for item in top):,} µs (cumulative, top-level imports)",
             "", f"the {len(slowest)} slowest top-level imports:",
             f"{'cumulative µs':>14}  {'self µs':>9}  module"]
    lines += [f"{item.cumulative_us:>14,}  {item.self_us:>9,}  {item.name}" for item in slowest]
    return "\n".join(lines) + "\n"


SETTLE = 2.1  # agentbox.session.plan saves a plan once the launch's inputs are two seconds old
PLAN_ATTEMPTS = 4
FULL_PATH_MODULE = "agentbox.cli.commands.agent"  # loaded by a full launch, never by one from its plan


def launch_command() -> list[str]:
    """The warm launch as a user runs it (the console script, whose own `import re` counts), under importtime."""
    script = Path(sys.executable).parent / "agentbox"
    entry = [str(script)] if script.exists() else ["-m", "agentbox"]
    return [sys.executable, "-X", "importtime", *entry, *bench.LAUNCH]


def measure(box: bench.Sandbox) -> tuple[str, list[dict]]:
    """A warm launch's stderr under importtime, and the limactl calls it made."""
    project = box.project("bench")
    box.stub_agent()
    box.run(["start"], project)
    box.run(bench.LAUNCH, project)  # the first launch after a start checks the VM and stages
    env = {key: value for key, value in box.env.items() if key != "PYTHONPROFILEIMPORTTIME"}
    for _ in range(PLAN_ATTEMPTS):  # the same command until it runs from its verified plan, as warm launches do
        time.sleep(SETTLE)
        before = len(bench.read_calls(box.lima_home))
        result = subprocess.run(launch_command(), cwd=project, env=env, capture_output=True, text=True,
                                stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise SystemExit(f"the warm launch failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        if FULL_PATH_MODULE not in result.stderr:
            break
    return result.stderr, bench.read_calls(box.lima_home)[before:]


def version(box: bench.Sandbox) -> str:
    result = subprocess.run([sys.executable, "-c", "import agentbox; print(agentbox.__version__)"], env=box.env,
                            cwd=box.root, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="print the figure, write nothing")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help="the folder of the figures (default %(default)s)")
    options = parser.parse_args(argv)
    box = bench.Sandbox(LATENCY)
    try:
        load_before = compare.load()
        stderr, calls = measure(box)
        measured, release = compare.measured_agentbox(box), version(box)
    finally:
        box.remove()
    commands = ", ".join(next(word for word in call["argv"] if not word.startswith("-")) for call in calls)
    path_taken = "the full launch (no plan held)" if FULL_PATH_MODULE in stderr else "from its verified plan"
    header = [f"agentbox {release}: the imports of a warm `agentbox {' '.join(bench.LAUNCH)}` "
              f"(limactl calls: {len(calls)}, {commands}), python -X importtime",
              f"the launch ran {path_taken}",
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {compare.machine()}, "
              f"Python {sys.version.split()[0]}",
              f"load {load_before} before, {compare.load()} after; agentbox: {measured}"]
    text = figure(parse(stderr), header)
    if options.check:
        print(text, end="")
        return 0
    path = options.output / f"{release}.txt"
    write(path, text)
    print(text, end="")
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
