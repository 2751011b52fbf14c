"""The benchmark scripts still run and print their tables (their figures are not checked here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import compare  # noqa: E402


def table_rows(output: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in output.splitlines()
            if line.startswith("|") and not line.startswith("|---")]


def test_the_typescript_tool_is_skipped_with_the_reason_when_not_built(tmp_path: Path) -> None:
    command, note = compare.ts_tool(tmp_path)
    assert command is None
    assert note == f"skipped: no build of sky1core/agentbox@90477b4 in {tmp_path} (dist/index.js)"
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "index.js").write_text("")
    command, note = compare.ts_tool(tmp_path)  # the control: a build is used
    assert command is not None and command[-1] == str(tmp_path / "dist" / "index.js")


@pytest.mark.timeout(900)
def test_compare_quick_prints_the_ratio_table_of_every_row() -> None:
    """One quick run: the TypeScript tool's build is used when this machine has one, else its columns
    say why it was skipped; either way every row is there, in order, each cell in its place."""
    built = compare.ts_tool(compare.DEFAULT_TS_DIR)[0] is not None
    assert not str(compare.DEFAULT_TS_DIR).startswith(os.environ["HOME"] + os.sep)  # the account's, not a test's
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compare.py"), "--quick"], env=env,
                            capture_output=True, text=True, timeout=850)
    assert result.returncode == 0, result.stderr
    assert f"agentbox: {REPO}" in result.stdout  # the checkout's agentbox was measured
    assert ("host logins in both: .claude/.credentials.json, .claude.json, .codex/auth.json, .config/gh/hosts.yml"
            in result.stdout)
    header, *rows = table_rows(result.stdout)
    assert tuple(header) == compare.COLUMNS
    assert header[3:8] == ["agentbox wall / own ms", "TS wall / own ms", "agentbox own CPU ms", "TS own CPU ms",
                           "own CPU ratio"]
    assert tuple(row[0] for row in rows) == compare.ROWS
    by_row = {row[0]: row for row in rows}
    for row in rows:
        assert len(row) == len(compare.COLUMNS), row
        float(row[2])  # the floor
        wall, own = (float(cell) for cell in row[3].split(" / "))
        assert 0 < own <= wall, row
        assert float(row[5]) > 0, row  # agentbox's own CPU: its tree's minus the double's
    assert by_row["warm"][1].startswith(("1 / ", "2 / "))
    assert by_row["warm"][8].startswith("1 limactl call: ") and "; own CPU <= 0.6x TS: " in by_row["warm"][8]
    assert by_row["--help"][1].startswith("0 / ")
    for row in ("allowlist warm", "cold from a base"):
        assert by_row[row][7] == "n/a"
    if built:
        assert by_row["allowlist warm"][4].startswith("n/a: the TypeScript tool has no network policy")
        for row in ("warm", "warm, 50k-file repo", "stopped", "--help"):
            wall, own = (float(cell) for cell in by_row[row][4].split(" / "))
            assert 0 < own <= wall and float(by_row[row][6]) > 0, by_row[row]
            ratio = float(by_row[row][5]) / float(by_row[row][6])
            assert abs(float(by_row[row][7].removesuffix("x")) - ratio) < 0.02, by_row[row]  # of own CPU
        # with the logins present it copies each in: list, four shells and a copy per file, the agent
        assert by_row["warm"][1].endswith(" / 17")
        assert by_row["stopped"][1].endswith(" / 19")  # and start, and its readiness poll
    else:
        for row in rows:
            assert by_row[row[0]][4].startswith("skipped: ") and row[7] == "n/a"
    last = result.stdout.rstrip().splitlines()[-1]
    assert last.startswith("load (1, 5, 15-minute averages, ") and " before, " in last, last


@pytest.mark.timeout(120)
def test_importtime_prints_the_warm_launchs_figure_and_writes_it_unless_checking(tmp_path: Path) -> None:
    """Two runs of benchmarks/importtime.py (each starts a VM in the double and launches three times, ~10 s)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = [sys.executable, str(REPO / "benchmarks" / "importtime.py"), "--output", str(tmp_path / "figures")]
    checked = subprocess.run([*script, "--check"], env=env, capture_output=True, text=True, timeout=100)
    assert checked.returncode == 0, checked.stderr
    assert not (tmp_path / "figures").exists()  # --check writes nothing
    lines = checked.stdout.splitlines()
    version = subprocess.run([sys.executable, "-c", "import agentbox; print(agentbox.__version__)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert lines[0] == (f"agentbox {version}: the imports of a warm `agentbox codex exec true` "
                        "(limactl calls: 1, shell), python -X importtime")
    assert lines[1] == "the launch ran from its verified plan"  # as a user's warm launches do
    head, lines = lines[:2], lines[2:]
    assert lines[1].startswith("load ") and f"agentbox: {REPO}" in lines[1]
    assert lines[2] == "" and lines[6] == ""
    counts = dict(line.split(": ", 1) for line in lines[3:6])
    modules, ours = int(counts["modules imported"]), int(counts["agentbox modules"])
    assert 0 < ours < modules
    total = int(counts["total import time"].removesuffix(" µs (cumulative, top-level imports)").replace(",", ""))
    assert lines[8].split() == ["cumulative", "µs", "self", "µs", "module"]
    rows = [line.split() for line in lines[9:]]
    assert 0 < len(rows) <= 25 and lines[7] == f"the {len(rows)} slowest top-level imports:"
    cumulative = [int(row[0].replace(",", "")) for row in rows]
    assert cumulative == sorted(cumulative, reverse=True) and sum(cumulative) <= total
    assert any(row[2].startswith("agentbox.") for row in rows)
    assert head and max(len(line) for line in lines[2:]) <= 80

    written = subprocess.run(script, env=env, capture_output=True, text=True, timeout=100)
    assert written.returncode == 0, written.stderr
    figure = tmp_path / "figures" / f"{version}.txt"
    text, note = written.stdout.rsplit("\n\n", 1)
    assert note == f"written to {figure}\n"
    assert figure.read_text() == text + "\n" and os.listdir(figure.parent) == [figure.name]


@pytest.mark.timeout(300)
def test_the_broker_benchmark_prints_every_row() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "broker.py"), "--runs", "5", "--download-mib",
                             "2", "--downloads", "1", "--link-mbit", "100", "--held", "3"], env=env,
                            capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stderr
    names = [line[:46].strip() for line in result.stdout.splitlines()[1:]]
    downloads = [f"download 2 MiB ({label}), {who}" for label in ("loopback", "100 Mbit/s upstream")
                 for who in ("direct", "broker", "")]
    assert names == ["kept connection, direct", "kept connection, through the broker",
                     "kept connection, CONNECT tunnel", "new connection, direct", "new connection, through the broker",
                     "new connection, CONNECT tunnel", "placement + answer scan (in process)",
                     *[name if not name.endswith(", ") else "the broker's CPU per 2 MiB (3 held)" for name in downloads]]


def test_the_report_benchmark_prints_every_row() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), "--runs", "3", "--log-lines",
                             "2000", "--records", "20"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    names = [line[:64].strip() for line in result.stdout.splitlines()[2:]]
    assert names == ["the record: network and broker summaries from the log's tail",
                     "signing it into the chain (head, key, one file, the head again)",
                     "added to a session end (target: at most 20 ms)",
                     "control: the whole log read, as `net log --hosts` does"]
