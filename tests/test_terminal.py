"""What a session leaves in the terminal cannot hide what agentbox prints after it (agentbox.terminal)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shlex
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from agentbox import terminal
from agentbox.review import tripwire
from tests.helpers import NAME, FakeLima, needs_bwrap, run_cli, wait_for, write, write_trusted

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
        assert restored < output.index(b"the session ended without an exit status (exit 255)") < warning
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
    # No full reset (ESC c), no erase (ESC [ J / K), no 1049 (moves it), no cursor move other than by origin mode
    # off and DECSTBM, which both home it: they come only between a save and a restore of the cursor.
    sequence = terminal.RESTORE
    for forbidden in ("\x1bc", "[J", "[2J", "[K", "[H", "?1049"):
        assert forbidden not in sequence
    saved = "\x1b7\x1b[?6l\x1b[r\x1b8"
    assert sequence.count(saved) == 1
    assert "?6l" not in sequence.replace(saved, "") and "[r" not in sequence.replace(saved, "")
    for wanted in ("\x1b[0m", "\x1b[?1047l", "\x1b[?25h", "\x1b(B", "\x0f", "\x1b[4l", "\x1b[?7h"):
        assert wanted in sequence


def tmux(socket: Path, *args: str) -> str:
    return subprocess.run(["tmux", "-S", str(socket), *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout


# A real terminal (tmux at 80x24): lines printed before a VM command stay where they are, and what follows the
# command is written below them. Origin mode off and the scroll-region reset each home the cursor, which put the
# next output and the prompt over row 1 after every session.
@pytest.mark.needs("tmux")
@pytest.mark.parametrize("command", [("shell", "--", "true"), ("claude", "-p", "hello")])
def test_after_a_vm_command_the_cursor_stays_below_what_was_printed(vm: FakeLima, project: Path, tmp_path: Path,
                                                                    command: tuple[str, ...]) -> None:
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n")
    finished = tmp_path / "finished"
    script = write(tmp_path / "day.sh", "printf 'first line\\nsecond line\\nthird line\\n'\n"
                   + shlex.join([sys.executable, "-m", "agentbox", *command]) + "\n"
                   + f"echo \"after: $?\"\ntouch {shlex.quote(str(finished))}\nexec sleep 600\n")
    socket = tmp_path / "tmux"
    env = {name: value for name, value in os.environ.items() if name not in ("TMUX", "TMUX_PANE")}
    subprocess.run(["tmux", "-S", str(socket), "-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24",
                    "-c", str(project), "sh", str(script)], env=env, check=True, timeout=30)
    try:
        wait_for(finished.exists, 120, "the command to end in tmux")
        cursor = int(tmux(socket, "display", "-p", "#{cursor_y}"))
        screen = tmux(socket, "capture-pane", "-p").splitlines()
    finally:
        subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True, timeout=30)
    assert screen[:3] == ["first line", "second line", "third line"], screen
    after = screen.index("after: 0")
    assert cursor == after + 1, (cursor, screen)
