"""agentbox's tables through the CLI: one time format, columns that line up at any terminal width (wide
characters included), and `tasks ls` / `sessions ls` as the bare listings."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from agentbox import tables
from agentbox.tasks import records
from agentbox.tasks import transitions as taskstate
from tests.gitrepo import commit_all, init
from tests.helpers import FakeLima, run_cli, write

pytestmark = pytest.mark.timeout(60)

STARTED = 1_790_000_000.0  # a fixed moment, shown in the test machine's time zone
SHOWN = time.strftime("%Y-%m-%d %H:%M", time.localtime(STARTED))
LONG_PROMPT = "Make the failing tests in tests/ pass, then tidy the module they cover, please"  # 80: kept whole


def ended_task(project: Path, name: str | None, prompt: str) -> records.Task:
    task = records.create(records.NewTask("agentbox-x", project, "claude", ["claude"], str(project), prompt.encode(), name=name,
                          timeout=None, worktree=None))
    records.advance(task, taskstate.QUEUED, at=STARTED)
    records.advance(task, taskstate.RUNNING, at=STARTED)
    records.advance(task, taskstate.COMPLETED, at=STARTED + 75, exit_code=0, harvested=True)
    records.save(task)
    return task


def columns_of(line: str) -> int:
    return tables.display_width(line)


def start_of(line: str, text: str) -> int:
    """The display column where text begins in line."""
    return tables.display_width(line[: line.index(text)])


@pytest.fixture
def two_tasks(project: Path) -> Path:
    ended_task(project, "tests", LONG_PROMPT)
    ended_task(project, "修正", "短い")  # wide characters: two columns each
    return project


def listing(project: Path, *args: str, width: int | None) -> list[str]:
    env = {"COLUMNS": str(width)} if width else {"COLUMNS": ""}
    result = run_cli(*args, cwd=project, env=env)
    assert result.exit_code == 0, result.stderr
    return result.stdout.splitlines()


def test_tasks_table_lines_up_with_wide_characters_and_whole_cells_in_a_pipe(two_tasks: Path) -> None:
    lines = listing(two_tasks, "tasks", width=None)
    assert len(lines) == 3
    assert lines[1].endswith(LONG_PROMPT)  # nothing cut where there is no terminal
    starts = {start_of(lines[0], "STARTED"), start_of(lines[1], SHOWN), start_of(lines[2], SHOWN)}
    assert len(starts) == 1, lines
    prompts = {start_of(lines[0], "PROMPT"), start_of(lines[1], "Make"), start_of(lines[2], "短い")}
    assert len(prompts) == 1, lines
    assert "1m15s" in lines[1]


@pytest.mark.parametrize("width", [80, 200])
def test_tasks_table_fits_the_terminal_and_cuts_only_the_free_text(two_tasks: Path, width: int) -> None:
    lines = listing(two_tasks, "tasks", width=width)
    assert len(lines) == 3
    assert all(columns_of(line) <= width for line in lines), lines
    assert {start_of(lines[0], "PROMPT"), start_of(lines[1], "Make"), start_of(lines[2], "短い")} == \
        {start_of(lines[0], "PROMPT")}
    assert SHOWN in lines[1] and SHOWN in lines[2]  # times are never cut
    if width == 80:
        assert lines[1].endswith("…") and LONG_PROMPT not in lines[1]
    else:
        assert lines[1].endswith(LONG_PROMPT)


def test_a_terminal_too_narrow_for_columns_gets_one_block_per_row(two_tasks: Path) -> None:
    lines = listing(two_tasks, "tasks", width=40)
    assert all(columns_of(line) <= 40 for line in lines), lines
    first = lines[: lines.index("")]
    assert [line.split()[0] for line in first] == ["ID", "NAME", "AGENT", "STATE", "EXIT", "STARTED", "TIME",
                                                   "PROMPT"]
    assert {start_of(line, line.split(None, 1)[1]) for line in first} == {len("STARTED  ")}
    assert f"STARTED  {SHOWN}" in first
    assert first[-1].startswith("PROMPT   Make the failing") and first[-1].endswith("…")


def test_tasks_ls_is_the_tasks_listing(two_tasks: Path) -> None:
    assert listing(two_tasks, "tasks", "ls", width=200) == listing(two_tasks, "tasks", width=200)
    assert listing(two_tasks, "tasks", "ls", "--all", width=200) == listing(two_tasks, "tasks", "--all", width=200)
    as_json = run_cli("tasks", "ls", "--json", cwd=two_tasks)
    assert [task["name"] for task in json.loads(as_json.stdout)] == ["tests", "修正"]
    assert run_cli("tasks", "--json", "ls", cwd=two_tasks).stdout == as_json.stdout


def test_sessions_ls_is_the_sessions_listing(project: Path, limactl: FakeLima) -> None:
    bare = run_cli("sessions", cwd=project)
    aliased = run_cli("sessions", "ls", cwd=project)
    assert (aliased.exit_code, aliased.stdout, aliased.stderr) == (bare.exit_code, bare.stdout, bare.stderr)
    assert aliased.exit_code == 0 and "is not running, so no session is" in aliased.stderr
    assert run_cli("sessions", "ls", "--json", cwd=project).stdout == "[]\n"


def test_checkpoints_show_times_in_the_tables_format(project: Path, limactl: FakeLima) -> None:
    init(project)
    write(project / "a.txt", "a\n")
    commit_all(project)
    assert run_cli("checkpoint", "-m", "by hand", cwd=project).exit_code == 0
    recorded = json.loads(run_cli("checkpoints", "--json", cwd=project).stdout)[0]["time"]
    lines = listing(project, "checkpoints", width=200)
    assert lines[0].split()[:2] == ["ID", "TIME"]
    assert re.search(r"  (\d{4}-\d\d-\d\d \d\d:\d\d)  ", lines[1])
    assert tables.local_time(recorded) in lines[1]
    assert start_of(lines[0], "MESSAGE") == start_of(lines[1], "by hand")


@pytest.mark.parametrize(
    ("recorded", "epoch"),
    [
        ("2026-11-27T13:05:09Z", 1795784709),  # checkpoints, base ls, tasks' JSON
        ("2026-11-27T13:05:09+00:00", 1795784709),  # proposals
        (1795784709, 1795784709),  # sessions, tasks
    ],
)
def test_every_recorded_time_reads_the_same(recorded: str | int, epoch: int) -> None:
    assert tables.local_time(recorded) == time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))
    assert tables.local_time(None) == "-"


def away_task(project: Path) -> records.Task:
    """A task running on a host that stopped answering: its STATE is the longest a task shows."""
    task = records.create(records.NewTask("agentbox-x", project, "claude", ["claude"], str(project), LONG_PROMPT.encode(),
                          name="tests", timeout=None, worktree=None, host="build-server-east", isolated=True))
    records.advance(task, taskstate.QUEUED, at=STARTED)
    records.advance(task, taskstate.RUNNING, at=STARTED, handed=True, seen=STARTED + 60,
                    unreachable_since=STARTED + 90)
    records.save(task)
    return task


@pytest.mark.parametrize("width", [70, 80])
def test_a_long_state_is_cut_and_the_tasks_table_stays_one_line_a_row(two_tasks: Path, width: int) -> None:
    away_task(two_tasks)
    lines = listing(two_tasks, "tasks", width=width)
    assert len(lines) == 4, lines  # the header and one line a task: no blocks
    assert all(columns_of(line) <= width for line in lines), lines
    assert lines[0].split()[:4] == ["ID", "NAME", "AGENT", "STATE"]
    away = lines[3]
    state = away[len(lines[0][: lines[0].index("STATE")]):].split("  ")[0]
    assert state.startswith("Run") and state.endswith("…"), lines  # the state's start, cut
    assert SHOWN in away  # the time it started is never cut
    starts = {start_of(lines[0], "STARTED"), *(start_of(line, SHOWN) for line in lines[1:])}
    assert len(starts) == 1, lines
    # The control: with room for it, the whole state is shown.
    wide = listing(two_tasks, "tasks", width=250)
    assert f"(unreachable since {tables.local_time(STARTED + 90)}; seen {tables.local_time(STARTED + 60)})" \
        in wide[3]
