"""What a session leaves in the terminal cannot hide what agentbox prints after it (agentbox.terminal)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from agentbox import terminal
from agentbox.review import tripwire
from tests.helpers import NAME, FakeLima, needs_bwrap, run_cli, write

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]
# Concealed text, the alternate screen, a scroll region, no cursor, the line-drawing charset: then a change the
# tripwire reports.
LEAVES = r"printf 'last words\n\033[8m\033[?1049h\033[5;10r\033[?25l\033(0'; echo 'export X=1' > .envrc"


@pytest.fixture
def repo(project: Path, limactl: FakeLima) -> Path:
    needs_bwrap()
    subprocess.run([*GIT, "init", "-q", str(project)], check=True)
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    return project


def on_terminal(project: Path, *args: str) -> tuple[int, bytes]:
    """Run agentbox with a pseudo-terminal as its controlling terminal, stdin, stdout and stderr."""

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentbox", *args], cwd=project, stdin=follower, stdout=follower,
                            stderr=follower, preexec_fn=controlling_terminal)
    os.close(follower)
    output = b""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    break  # the last holder of the terminal closed it
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return code, output


# The shell exits 255, which agentbox explains after the session (ssh's code): that note comes before the warning.
@pytest.mark.parametrize("command", [("shell", "--", "sh", "-c", LEAVES + "; exit 255"), ("claude",)])
def test_the_terminal_is_restored_before_the_warning_which_comes_last(repo: Path, limactl: FakeLima,
                                                                       command: tuple[str, ...]) -> None:
    if command == ("claude",):
        agent = limactl.home / NAME / "guestfs" / "usr-local" / "bin" / "claude"
        write(agent, f"#!/bin/sh\n{LEAVES}\n", mode=0o755)
    code, output = on_terminal(repo, *command)
    assert code == (0 if command == ("claude",) else 255), output
    left = output.index(b"\x1b(0")
    restored = output.index(terminal.RESTORE.encode(), left)
    warning = output.index(b"agentbox: WARNING: the session changed 1 watched file", restored)
    assert output.index(b"last words") < left < restored < warning
    if code == 255:
        assert restored < output.index(b"exit 255 is how ssh reports") < warning
    # Nothing after the summary: it is the last thing on the screen.
    assert output.rstrip().endswith(tripwire.BAR.encode()), output[-400:]
    assert output.count(terminal.RESTORE.encode()) == 1


def test_without_a_terminal_no_restore_bytes_are_written(repo: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "sh", "-c", LEAVES], cwd=repo,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert b"the session changed 1 watched file" in result.stderr  # the session did end and report
    for stream in (result.stdout, result.stderr):
        assert b"\x1b[?1047l" not in stream and b"\x1b[0m" not in stream and b"\x1b[r" not in stream
    assert result.stdout.endswith(b"last words\n\x1b[8m\x1b[?1049h\x1b[5;10r\x1b[?25l\x1b(0")


def test_the_restore_leaves_the_screen_and_the_cursor_where_they_are() -> None:
    # No full reset (ESC c), no erase (ESC [ J / K), no cursor move other than around DECSTBM, no 1049 (moves it).
    sequence = terminal.RESTORE
    for forbidden in ("\x1bc", "[J", "[2J", "[K", "[H", "?1049"):
        assert forbidden not in sequence
    assert "\x1b7\x1b[r\x1b8" in sequence
    for wanted in ("\x1b[0m", "\x1b[?1047l", "\x1b[?25h", "\x1b(B", "\x0f", "\x1b[4l", "\x1b[?6l", "\x1b[?7h"):
        assert wanted in sequence
