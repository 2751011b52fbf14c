"""Interactive sessions on another machine (`agentbox AGENT --on HOST --detach`, `agentbox attach ID`) through the
real CLI against a real sshd on 127.0.0.1 and a second local user standing for the remote machine, the limactl
double on its PATH (tests/remotehost.py). The agent runs in tmux in the remote VM on a copy of the workspace;
`attach` joins it over ssh with a terminal, and when it ends its changes come home as a proposal. Each test makes
the remote VM (the double's, over ssh): about 10 s to 15 s each."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import make_repository, run_agentbox, run_cli, snapshot_tree, wait_for
from tests.remotehost import RemoteHost

Hosts = Callable[..., list[RemoteHost]]
pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("tasks")]

# The interactive agent: says it is ready, reads one line from its terminal, writes it into its folder, exits.
AGENT = r"""
import sys
print("ready for a line", flush=True)
line = sys.stdin.readline().strip()
with open("typed.txt", "w") as f:
    f.write(line + "\n")
print("wrote typed.txt", flush=True)
"""
CONFIG = ("notify: false\nagents:\n  stub:\n    binary: python3\n"
          f"    defaultArgs: [-c, {json.dumps(AGENT)}]\n")


@pytest.fixture
def remote_project(project: Path, home: Path, remote_hosts: Hosts) -> tuple[Path, RemoteHost]:
    host = remote_hosts(1)[0]
    make_repository(project, config=CONFIG)
    added = run_agentbox("hosts", "add", "big", host.url, "--no-check", cwd=project)
    assert added.returncode == 0, added.stderr
    assert run_agentbox("trust", cwd=project).returncode == 0
    return project, host


def record(project: Path, task_id: int) -> dict:
    result = run_agentbox("tasks", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    return next(t for t in json.loads(result.stdout) if t["id"] == task_id)


def start_session(project: Path) -> int:
    started = time.monotonic()
    result = run_agentbox("stub", "--on", "big", "--detach", cwd=project, timeout=240)
    assert result.returncode == 0, result.stderr
    task_id = int(result.stdout.strip())
    assert f"`agentbox attach {task_id}` joins it" in result.stderr
    assert time.monotonic() - started < 120  # it returns once the host took it, never waiting for the agent
    return task_id


def remote_key(task_id: int) -> str:
    from agentbox import paths

    return str(json.loads((paths.tasks_dir() / str(task_id) / "task.json").read_text())["remote_key"])


def tmux_sessions(host: RemoteHost, task: dict) -> bytes:
    """What the task's tmux server in the remote VM lists (empty when it runs no session)."""
    listed = host.run(["limactl", "shell", task["vm"], "--", "sh", "-c",
                       f"tmux -L {remote_key(task['id'])} ls 2>/dev/null || true"])
    assert listed.returncode == 0, listed.stderr
    return listed.stdout


def on_terminal(cwd: Path, args: list[str], answer: Callable[[str, float], bytes | None], timeout: float = 120
                ) -> tuple[int, str]:
    """`agentbox ARGS` in a pseudo-terminal; answer(all output so far, seconds since the last output) returns bytes
    to type, or None. It is asked at least twice a second."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, b"\x18\x00\x50\x00\x00\x00\x00\x00")  # 24 rows, 80 columns

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, "-m", "agentbox", *args], cwd=cwd, stdin=slave, stdout=slave,
                            stderr=slave, env={**os.environ, "TERM": "xterm"}, preexec_fn=controlling_terminal)
    os.close(slave)
    output = b""
    last = time.monotonic()
    deadline = last + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.25)
            if not ready:
                if proc.poll() is not None:
                    break
                typed = answer(output.decode(errors="replace"), time.monotonic() - last)
                if typed:
                    os.write(master, typed)
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # every process that had the terminal open left
                output += b"\n[EIO]"
                break
            if not data:
                break
            output += data
            last = time.monotonic()
        try:
            code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`agentbox {' '.join(args)}` did not end: {output!r}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, output.decode(errors="replace")


def test_a_session_on_a_host_runs_in_tmux_there_attach_joins_it_and_its_changes_come_home(
        remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    before = snapshot_tree(project)
    task_id = start_session(project)
    wait_for(lambda: record(project, task_id)["state"], 60, "the session running", until=lambda s: s == "Running")
    task = record(project, task_id)
    assert (task["host"], task["isolated"], task["session"]) == ("big", True, True)
    assert "Running on big" in run_agentbox("tasks", cwd=project).stdout.splitlines()[1]
    assert run_agentbox("tasks", cwd=project).stdout.splitlines()[1].endswith("(session)")
    # The agent waits in tmux in the remote VM, its session named after the task.
    assert tmux_sessions(host, task).startswith(f"{remote_key(task_id)}:".encode())
    typed: list[str] = []

    def answer(output: str, quiet: float) -> bytes | None:
        if "ready for a line" in output and quiet > 1 and not typed:  # tmux settled: no key is taken for its own
            typed.append("line")
            return b"typed on the laptop\r"
        return None

    code, output = on_terminal(project, ["attach", str(task_id)], answer)
    assert typed, output
    assert code == 0, output
    assert "proposal 1: 1 file changed" in output
    task = record(project, task_id)
    assert (task["state"], task["proposal"]) == ("Completed", 1)
    assert tmux_sessions(host, task) == b""
    review = run_cli("review", "1", cwd=project)
    assert review.exit_code == 0 and "+typed on the laptop" in review.stdout
    assert snapshot_tree(project) == before  # the laptop's workspace is not touched until `apply`


def test_detaching_leaves_the_session_running_there(remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    task_id = start_session(project)
    wait_for(lambda: record(project, task_id)["state"], 60, "the session running", until=lambda s: s == "Running")
    sent: list[float] = []

    def answer(output: str, quiet: float) -> bytes | None:
        # tmux's prefix, then d: detach; once tmux settled, and again should a key have been lost in its start
        if "ready for a line" in output and quiet > 1 and (not sent or time.monotonic() - sent[-1] > 5):
            sent.append(time.monotonic())
            return b"\x02d"
        return None

    code, output = on_terminal(project, ["attach", str(task_id)], answer)
    assert code == 0, output
    assert f"detached from task {task_id}: stub goes on on big" in output
    task = record(project, task_id)
    assert task["state"] == "Running"
    assert tmux_sessions(host, task).startswith(f"{remote_key(task_id)}:".encode())
    assert run_agentbox("cancel", str(task_id), cwd=project, timeout=120).returncode == 0


def test_cancel_ends_the_session_s_tmux_there(remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    task_id = start_session(project)
    wait_for(lambda: record(project, task_id)["state"], 60, "the session running", until=lambda s: s == "Running")
    task = record(project, task_id)
    assert tmux_sessions(host, task) != b""
    cancelled = run_agentbox("cancel", str(task_id), cwd=project, timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr
    done = run_agentbox("wait", str(task_id), cwd=project, timeout=120)
    assert done.returncode == 130 and "Cancelled" in done.stderr
    assert tmux_sessions(host, task) == b""
    # Wide enough for the whole row: at 80 columns the PROMPT column, cut first, may lose it to a long STATE.
    wide = {**os.environ, "COLUMNS": "200"}
    assert "(session)" in run_agentbox("tasks", cwd=project, env=wide).stdout


def test_on_without_detach_is_refused_before_anything_is_made(remote_project: tuple[Path, RemoteHost]) -> None:
    project, host = remote_project
    refused = run_agentbox("stub", "--on", "big", "hello", cwd=project)
    assert refused.returncode == 2, refused.stderr
    assert "--on big needs --detach: a session on another machine always runs detached" in refused.stderr
    assert "`agentbox stub --on big --detach [ARGS]...` starts it" in refused.stderr
    for args, says in ((["--on", "local", "-d"], "--on takes a host added with `agentbox hosts add`, not local"),
                       (["--on", "big", "-d", "--worktree", "w"], "--worktree do not go together"),
                       (["--on"], "--on needs a host's name")):
        other = run_agentbox("stub", *args, cwd=project)
        assert other.returncode == 2 and says in other.stderr, other.stderr
    assert json.loads(run_agentbox("tasks", "--json", cwd=project).stdout) == []
    assert not (host.home / ".agentbox-remote").exists()
    # The control: with --detach the same command starts the session.
    task_id = start_session(project)
    assert record(project, task_id)["session"] is True
    assert (host.home / ".agentbox-remote").exists()
    assert run_agentbox("cancel", str(task_id), cwd=project, timeout=120).returncode == 0



def test_the_far_end_attaches_only_to_a_task_it_knows(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from agentbox.remote import far

    ran: list[list[str]] = []

    def execv(program: str, argv: list[str]) -> None:
        ran.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(far, "limactl_path", lambda: "/opt/limactl")
    monkeypatch.setattr(far.os, "execv", execv)
    for key, says in (("t9-laptop-0123abcd", "task t9-laptop-0123abcd is not known on this host"),
                      ("../elsewhere", "is not a task key")):
        assert far.main(["attach", key]) == 3
        assert says in json.loads(capsys.readouterr().out)["error"]
    assert ran == []
    # The control: a task submitted here (its VM in the index) is attached, in that VM, to its own tmux session.
    (home / ".agentbox-remote" / "tasks").mkdir(parents=True)
    (home / ".agentbox-remote" / "tasks" / "t9-laptop-0123abcd").write_text("agentbox-myproject-0123abcd\n")
    with pytest.raises(SystemExit):
        far.main(["attach", "t9-laptop-0123abcd"])
    assert ran == [["/opt/limactl", "shell", "agentbox-myproject-0123abcd", "--", "sh", "-c", far.ATTACH_SCRIPT, "sh",
                    "t9-laptop-0123abcd"]]
