"""What agentbox prints while it works: the live line in a real terminal, limactl's warnings, -q, pipes.

The terminal tests run agentbox under a pseudo-terminal of a set width (it is the controlling
terminal, so Ctrl-C and resizes behave as in a real one) and replay what the terminal received.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

import agentbox
from tests.helpers import FakeLima, run_cli, wait_for

NAME = "agentbox-myproject"
ROOT = str(Path(agentbox.__file__).resolve().parents[1])
LONG = "a-project-with-a-rather-long-name-for-a-narrow-window"
STEP_LINE = re.compile(r"^(Creating|Starting|Stopping) VM agentbox-\S*: (done|failed|interrupted) \(\d+s\)$")


# -- a terminal ------------------------------------------------------------------------------------


class Row(NamedTuple):
    text: str  # what the row shows at the end
    widest: int  # the farthest column anything reached on it, live frames included


class Screen:
    """Just enough of a terminal to replay agentbox's output: \\r, \\n, ESC[K and printable text."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._row: list[str] = []
        self._col = 0
        self._widest = 0

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            if text.startswith("\x1b[K", i):
                del self._row[self._col :]
                i += 3
                continue
            char = text[i]
            assert char != "\x1b", f"unexpected escape sequence {text[i:i + 8]!r}"
            if char == "\r":
                self._col = 0
            elif char == "\n":
                self.rows.append(Row("".join(self._row), self._widest))
                self._row, self._col, self._widest = [], 0, 0
            else:
                self._row[self._col : self._col + 1] = [char]
                self._col += 1
                self._widest = max(self._widest, self._col)
            i += 1

    def texts(self) -> list[str]:
        return [row.text for row in self.rows]


class Session(NamedTuple):
    code: int
    output: str
    chunks: list[tuple[float, str]]  # (arrival time, text) as the terminal received it


def set_width(fd: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))


def _controlling_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def in_terminal(
    cwd: Path,
    *args: str,
    columns: int,
    env: dict[str, str] | None = None,
    on_output: Callable[[int, str], None] | None = None,
    timeout: float = 90,
) -> Session:
    """Run `agentbox ARGS` in a pseudo-terminal COLUMNS wide; on_output(master_fd, all_text_so_far)."""
    master, slave = pty.openpty()
    set_width(slave, columns)
    environment = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": ROOT, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentbox", *args],
        cwd=cwd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=environment,
        preexec_fn=_controlling_terminal,
    )
    os.close(slave)
    chunks: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process that had the terminal open has left
                break
            if not data:
                break
            chunks.append((time.monotonic(), data.decode(errors="replace")))
            if on_output:
                on_output(master, "".join(text for _, text in chunks))
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return Session(code, "".join(text for _, text in chunks), chunks)


def screen_of(text: str) -> Screen:
    screen = Screen()
    screen.feed(text)
    return screen


@pytest.fixture
def long_project(home: Path) -> Path:
    path = home.parent / "work" / LONG
    path.mkdir(parents=True)
    return path


# -- item 3: the live line -------------------------------------------------------------------------


def test_live_line_fits_a_narrow_terminal_follows_a_resize_and_ends_with_one_line_per_step(
    long_project: Path, limactl: FakeLima
) -> None:
    resized: list[float] = []

    def shrink_once_starting(master: int, text: str) -> None:
        if not resized and "Starting VM" in text:
            set_width(master, 40)
            resized.append(time.monotonic())

    session = in_terminal(
        long_project, "start", columns=50, env={"FAKE_LIMACTL_START_STEPS_DELAY": "0.25"},
        on_output=shrink_once_starting,
    )
    assert session.code == 0, session.output
    assert resized, session.output

    # Until the resize every row stayed within 50 columns; frames drawn after it, within 40.
    settle = resized[0] + 0.4
    before = "".join(text for at, text in session.chunks if at < settle)
    after = "".join(text for at, text in session.chunks if at >= settle)
    first = after.find("\r\x1b[K")
    assert first >= 0, "no live frame was drawn after the resize"
    before, after = before + after[:first], after[first:]
    rows = screen_of(session.output).rows
    note = f"is running (workspace {long_project})"
    steps = [row for row in rows if not row.text.endswith(note)]
    assert all(row.widest <= 50 for row in screen_of(before).rows), screen_of(before).rows
    assert all(row.widest <= 50 for row in steps), steps
    frames = [frame.split("\r")[0].split("\n")[0] for frame in after.split("\r\x1b[K") if frame]
    assert frames and all(len(frame) <= 40 for frame in frames), frames

    # One line per step, cut to the width with its outcome kept; then the command's own note.
    texts = [row.text for row in rows]
    assert len(texts) == 3, texts
    assert texts[0].startswith("Creating VM agentbox-a-project") and STEP_LINE.match(texts[0]), texts
    assert texts[1].startswith("Starting VM agentbox-a-") and STEP_LINE.match(texts[1]), texts
    assert len(texts[1]) <= 39  # drawn after the resize to 40 columns
    assert "…" in texts[1] and texts[1].endswith(")")
    assert texts[2].endswith(note)
    # The narrow live line still showed what was going on, not only the start of the title.
    assert any(re.search(r"\[\d+s\] waiting for ssh$", frame) for frame in frames), frames


def test_dumb_terminal_gets_plain_lines_without_cursor_movement(project: Path, limactl: FakeLima) -> None:
    session = in_terminal(project, "start", columns=50, env={"TERM": "dumb"})
    assert session.code == 0, session.output
    assert "\x1b" not in session.output
    assert "\r" not in session.output.replace("\r\n", "\n")  # the terminal's own CR before LF only
    texts = screen_of(session.output.replace("\r\n", "\n")).texts()
    assert [STEP_LINE.match(text) is not None for text in texts] == [True, True, False], texts
    assert texts[0].startswith(f"Creating VM {NAME}: done")
    assert texts[1].startswith(f"Starting VM {NAME}: done")


def test_ctrl_c_in_the_terminal_marks_the_step_interrupted(project: Path, limactl: FakeLima, tmp_path: Path) -> None:
    sent: list[bool] = []
    marker = tmp_path / "limactl-under-way"  # the double names each sub-command as its 30 s begin

    def ctrl_c_while_starting(master: int, text: str) -> None:
        if not sent and "Starting VM" in text:
            wait_for(lambda: "start" in (marker.read_text().split() if marker.exists() else []), 60,
                     "limactl start to be under way")
            os.write(master, b"\x03")  # the terminal turns it into SIGINT for the foreground group
            sent.append(True)

    session = in_terminal(
        project, "start", columns=80, env={"FAKE_LIMACTL_LATENCY": "start=30", "FAKE_LIMACTL_LATENCY_MARKER": str(marker)},
        on_output=ctrl_c_while_starting,
    )
    assert sent and session.code == 130, session.output
    texts = screen_of(session.output.replace("\r\n", "\n")).texts()
    starting = [text for text in texts if "Starting VM" in text]
    assert len(starting) == 1 and re.search(r"Starting VM agentbox-myproject: interrupted \(\d+s\)$", starting[0])
    assert not any("failed" in text for text in texts), texts


def test_one_line_per_step_without_a_terminal(project: Path, limactl: FakeLima) -> None:
    start = run_cli("start", cwd=project)
    assert start.exit_code == 0, start.stderr
    lines = start.stderr.splitlines()
    assert [bool(STEP_LINE.match(line)) for line in lines] == [True, True, False], lines
    stop = run_cli("stop", cwd=project)
    assert stop.exit_code == 0
    assert len(stop.stderr.splitlines()) == 1 and re.match(
        rf"^Stopping VM {NAME}: done \(\d+s\)$", stop.stderr.splitlines()[0]
    ), stop.stderr
    assert run_cli("start", cwd=project).exit_code == 0
    forced = run_cli("stop", "--all", "--force", cwd=project)
    assert re.fullmatch(rf"Stopping VM {NAME} \(forced\): done \(\d+s\)\n", forced.stderr), forced.stderr


def test_the_live_line_names_no_phase_limactl_has_not_reached(project: Path, limactl: FakeLima) -> None:
    """A stop's (or a create's) line never says `starting`: until limactl names a phase, the title says it all."""
    assert run_cli("start", cwd=project).exit_code == 0
    session = in_terminal(project, "stop", columns=80, env={"FAKE_LIMACTL_LATENCY": "stop=0.6"})
    assert session.code == 0, session.output
    frames = [frame.split("\r")[0].split("\n")[0] for frame in session.output.split("\r\x1b[K") if frame]
    live = [frame for frame in frames if frame.startswith(tuple("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"))]
    assert live, session.output
    assert all(re.fullmatch(rf". Stopping VM {NAME} \[\d+s\]( shutting down| stopped)?", frame) for frame in live), live


# -- item 4: limactl's warnings and errors ------------------------------------------------------------

PROBE_STDERR = "agentbox provisioning did not install npm \x1b[2J\x1b[31mred\n"


def test_limactl_warnings_and_errors_are_shown_without_verbose_and_escaped(
    project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LIMACTL_PROBE_FAIL", PROBE_STDERR)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    error = next(line for line in lines if line.startswith("agentbox: limactl error: "))
    assert error.startswith(
        "agentbox: limactl error: [failed to satisfy the optional requirement 1 of 1 "
        '"agentbox provisioning to finish": '
    )
    assert 'stderr="agentbox provisioning did not install npm \\x1b[2J\\x1b[31mred\\n": exit status 1]' in error
    warning_index = lines.index(next(line for line in lines if line.startswith("agentbox: limactl warning: ")))
    assert lines[warning_index].startswith("agentbox: limactl warning: DEGRADED. The VM seems running")
    assert lines.index(error) < warning_index
    assert re.match(rf"^Starting VM {NAME}: failed \(\d+s\)$", lines[warning_index + 1]), lines
    assert "\x1b" not in result.stderr  # guest text cannot drive the terminal
    shown = result.stderr[: result.stderr.index("Last lines from limactl:")]  # then the failure's details
    assert "Waiting for the essential requirement" not in shown and "level=" not in shown  # no info chatter
    assert "agentbox: limactl warning: " not in run_cli("status", cwd=project).stderr


def test_limactl_warning_does_not_break_the_live_line(project: Path, limactl: FakeLima) -> None:
    session = in_terminal(
        project, "start", columns=60,
        env={"FAKE_LIMACTL_PROBE_FAIL": "npm missing", "FAKE_LIMACTL_START_STEPS_DELAY": "0.15"},
    )
    assert session.code == 1, session.output
    texts = screen_of(session.output.replace("\r\n", "\n")).texts()
    warnings = [text for text in texts if "limactl warning" in text]
    assert len(warnings) == 1 and warnings[0].startswith("agentbox: limactl warning: DEGRADED."), texts
    assert [text for text in texts if text.startswith("agentbox: limactl error: [failed to satisfy")], texts
    starting = [text for text in texts if "Starting VM" in text]
    assert len(starting) == 1 and STEP_LINE.match(starting[0]) and ": failed (" in starting[0], texts
    assert texts.index(starting[0]) > texts.index(warnings[0])


# -- item 13: -q ---------------------------------------------------------------------------------------


def test_quiet_lifecycle_prints_nothing_on_success(project: Path, limactl: FakeLima) -> None:
    for args in (("start",), ("start",), ("restart",), ("stop",), ("stop",), ("stop", "--all"), ("rm", "--yes")):
        result = run_cli("-q", *args, cwd=project)
        assert (result.exit_code, result.stdout, result.stderr) == (0, "", ""), (args, result.stderr)
    assert limactl.status(NAME) is None
    assert run_cli("--quiet", "ls", cwd=project).stderr == ""


def test_quiet_start_in_a_terminal_prints_nothing(project: Path, limactl: FakeLima) -> None:
    session = in_terminal(project, "-q", "start", columns=80)
    assert (session.code, session.output) == (0, "")
    assert limactl.status(NAME) == "Running"


def test_quiet_keeps_data_warnings_and_errors(
    project: Path, limactl: FakeLima, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("-q", "ls", cwd=project).stdout == run_cli("ls", cwd=project).stdout
    assert NAME in run_cli("-q", "ls", cwd=project).stdout
    assert run_cli("-q", "status", "--json", cwd=project).stdout == run_cli("status", "--json", cwd=project).stdout
    assert run_cli("-q", "rm", "--yes", cwd=project).exit_code == 0

    monkeypatch.setenv("FAKE_LIMACTL_PROBE_FAIL", "npm missing")
    failed = run_cli("-q", "start", cwd=project)
    assert failed.exit_code == 1
    assert "agentbox: limactl warning: DEGRADED." in failed.stderr
    assert re.search(rf"^Starting VM {NAME}: failed \(\d+s\)$", failed.stderr, re.M)
    assert "agentbox: error: `limactl --tty=false start" in failed.stderr
    assert f"Creating VM {NAME}" not in failed.stderr  # the step that succeeded stays silent


def test_quiet_and_verbose_together_are_refused(project: Path, limactl: FakeLima) -> None:
    result = run_cli("-q", "-v", "start", cwd=project)
    assert result.exit_code == 2
    assert "-q/--quiet and -v/--verbose cannot be used together" in result.stderr
    assert limactl.calls() == []


# -- item 6: closed pipes ------------------------------------------------------------------------------


def _agentbox(cwd: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=cwd, env=env, timeout=60, **kwargs)


def _closed_pipe() -> int:
    """The write end of a pipe whose reader is already gone: the first write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


@pytest.mark.parametrize("args", [("ls",), ("status",), ("status", "--json"), ("config",), ("--help",), ("--version",)])
def test_closed_stdout_ends_quietly_with_141(project: Path, limactl: FakeLima, args: tuple[str, ...]) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    stdout = _closed_pipe()
    try:
        result = _agentbox(project, *args, stdout=stdout, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(stdout)
    assert (result.returncode, result.stderr) == (141, "")


def test_closed_stderr_does_not_stop_the_work(project: Path, limactl: FakeLima) -> None:
    stderr = _closed_pipe()
    try:
        result = _agentbox(project, "start", stdout=subprocess.PIPE, stderr=stderr, text=True)
    finally:
        os.close(stderr)
    assert (result.returncode, result.stdout) == (0, "")
    assert limactl.status(NAME) == "Running"


def test_real_pipelines_never_report_an_internal_error(project: Path, limactl: FakeLima) -> None:
    assert run_cli("start", cwd=project).exit_code == 0
    agentbox_cmd = f"{sys.executable} -m agentbox"
    script = (
        f"{agentbox_cmd} ls | grep -q {NAME}; echo ls=${{PIPESTATUS[*]}};"
        f" {agentbox_cmd} status | head -1; echo status=${{PIPESTATUS[0]}};"
        f" {agentbox_cmd} config | head -1 >/dev/null; echo config=${{PIPESTATUS[0]}};"
        f" {agentbox_cmd} ls | {{ exec 0<&-; }}; echo closed=${{PIPESTATUS[0]}}"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    result = subprocess.run(["bash", "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"ls=(0|141) 0", lines[0]), lines
    assert lines[1] == f"name:      {NAME}"
    assert re.fullmatch(r"status=(0|141)", lines[2]) and re.fullmatch(r"config=(0|141)", lines[3]), lines
    assert lines[4] == "closed=141", lines


def test_a_warning_lima_repeats_is_shown_once(project: Path, limactl: FakeLima,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Lima 2.2 without /dev/kvm logs its TCG warning twice in a row (tests/fake_limactl/README.md)."""
    monkeypatch.setenv("FAKE_LIMACTL_NO_KVM", "1")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    kvm = [line for line in result.stderr.splitlines() if "/dev/kvm is not available" in line]
    assert kvm == ["agentbox: limactl warning: [hostagent] /dev/kvm is not available. Disabling KVM. Expect very poor "
                   "performance."], result.stderr
