"""Detachable sessions through the CLI against the limactl double: `agentbox AGENT --detach`, session.keepAlive,
`agentbox attach`, `agentbox sessions`; the VM side is provision/session.sh under the guest's real tmux."""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox.session import detached as sessions
from tests.helpers import NAME, FakeLima, notify_send_stand_in, run_cli, write, write_trusted

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.needs("tmux")

# An interactive stand-in: says it started (with its arguments and whether it has a terminal), then waits
# for a line and exits with the code it reads.
WAITING_AGENT = r"""#!/bin/bash
printf 'stand-in agent up: %s tty=%s\n' "$*" "$([ -t 0 ] && echo yes || echo no)"
printf 'session=%s\n' "${AGENTBOX_SESSION:-none}"
IFS= read -r line
printf 'got %s\n' "$line"
exit "${line:-0}"
"""


def install(limactl: FakeLima, script: str = WAITING_AGENT, binary: str = "claude") -> None:
    path = limactl.home / NAME / "guestfs" / "usr-local" / "bin" / binary
    write(path, script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def on_terminal(cwd: Path, args: list[str], steps: list[tuple[bytes, bytes]], timeout: float = 40) -> tuple[int, str]:
    """Run agentbox with stdin, stdout and stderr on a pseudo-terminal; when the output shows a step's text, type
    its keys. Returns the exit status and everything shown."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentbox", *args], cwd=cwd, stdin=slave, stdout=slave,
                            stderr=slave, start_new_session=True, env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    output = b""
    pending = list(steps)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                output += chunk
            while pending and pending[0][0] in output:
                time.sleep(0.3)  # the program reads the keys once it waits for them
                os.write(master, pending.pop(0)[1])
            if proc.poll() is not None and not ready:
                break
        else:
            proc.kill()
            pytest.fail(f"agentbox {' '.join(args)} did not end; shown:\n{output.decode(errors='replace')}")
    finally:
        os.close(master)
    return proc.wait(timeout=30), output.decode(errors="replace")


@pytest.fixture
def kept(vm: FakeLima, project: Path) -> FakeLima:
    """The project's VM with session.keepAlive on and the waiting stand-in as claude."""
    write_trusted(project, "session:\n  keepAlive: true\n")
    install(vm)
    return vm


def test_keep_alive_runs_a_terminal_launch_in_a_session_and_exits_with_the_agents_code(
    kept: FakeLima, project: Path
) -> None:
    code, shown = on_terminal(project, ["claude", "hello"], [(b"session=claude", b"7\r")])
    assert code == 7, shown
    assert "stand-in agent up: --dangerously-skip-permissions hello tty=yes" in shown
    assert "agentbox: claude" in shown  # the status line of agentbox's tmux, with the session's name
    assert "Ctrl-b d: detach" in shown
    assert kept.subcommands() == ["list", "shell"]


HOOKED_AGENT = r"""#!/bin/bash
printf '{"message":"Claude needs your permission to use Bash"}' | bash "$HOME/.agentbox/bin/attention" notification
printf 'hook ran\n'
IFS= read -r line
exit 0
"""


def test_an_attached_session_that_needs_you_rings_and_says_so_in_the_title(kept: FakeLima, project: Path) -> None:
    """Claude Code's hooks are in its managed settings in the VM; the hook's bell and title reach the terminal
    through tmux; attached, no desktop notification is asked for."""
    install(kept, HOOKED_AGENT)
    code, shown = on_terminal(project, ["claude"], [(b"hook ran", b"\r")])
    assert code == 0, shown
    managed = kept.home / NAME / "guestfs" / "etc" / "claude-code" / "managed-settings.json"
    assert json.loads(managed.read_text()) == json.loads((REPO / "provision" / "claude-hooks.json").read_text())
    assert "\x07" in shown
    assert "claude: Claude needs your permission to use Bash" in shown  # the title: session, then the message
    events = sessions.events_folder(NAME)
    assert not any(events.glob("*.event")) if events.exists() else True


def test_notify_false_takes_the_hooks_away(kept: FakeLima, project: Path) -> None:
    install(kept, HOOKED_AGENT)
    code, shown = on_terminal(project, ["claude"], [(b"hook ran", b"\r")])
    assert code == 0, shown
    managed = kept.home / NAME / "guestfs" / "etc" / "claude-code" / "managed-settings.json"
    assert managed.exists()
    write_trusted(project, "session:\n  keepAlive: true\nnotify: false\n")
    code, shown = on_terminal(project, ["claude"], [(b"hook ran", b"\r")])
    assert code == 0, shown
    assert not managed.exists()


def test_keep_alive_leaves_a_piped_launch_as_it_is(vm: FakeLima, project: Path) -> None:
    out = project / ".stub-out.json"
    write_trusted(project, f"session:\n  keepAlive: true\nenv:\n  AGENTBOX_TEST_OUT: {out}\n")
    result = subprocess.run([sys.executable, "-m", "agentbox", "claude", "-p", "hi"], cwd=project, input="piped",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(out.read_text())
    assert got["args"] == ["--dangerously-skip-permissions", "-p", "hi"]
    assert got["stdin"] == "piped"
    assert "AGENTBOX_SESSION" not in got["env"] and "TMUX" not in got["env"]


def test_what_the_vm_says_is_checked_before_it_is_used() -> None:
    from agentbox.session import detached as sessions

    listed = sessions.parse_list(
        b"claude\tclaude\t1700000000\t1\trunning\t\t\n"
        b"codex-2\tcodex\t1700000100\t0\texited\t3\t1700000200\n"
        b"../etc\tclaude\t1\t0\trunning\t\t\n"  # not a name
        b"x\tclaude\t1\t0\tzombie\t\t\n"  # not a state
        b"short\tline\n"
        b"gem\t\x1b]2;evil\x07\tnope\t0\texited\t\t\n"  # an agent that is not a name, a start that is no number
    )
    assert [row.to_json("vm") for row in listed] == [
        {"name": "gem", "agent": "", "vm": "vm", "started": None, "attached": False, "state": "exited",
         "exitCode": None, "ended": None},
        {"name": "claude", "agent": "claude", "vm": "vm", "started": "2023-11-14T22:13:20Z", "attached": True,
         "state": "running", "exitCode": None, "ended": None},
        {"name": "codex-2", "agent": "codex", "vm": "vm", "started": "2023-11-14T22:15:00Z", "attached": False,
         "state": "exited", "exitCode": 3, "ended": "2023-11-14T22:16:40Z"},
    ]
    reply = sessions.parse_reply(b"outcome=exited\nname=claude\nagent=claude\ncode=9\noutcome=started\n", b"bye\n")
    assert reply == sessions.Reply("exited", "claude", "claude", 9, (), None, "bye\n")
    assert sessions.parse_reply(b"outcome=rm -rf /\n") is None
    assert sessions.parse_reply(b"outcome=ambiguous\nnames=a b/c d\n") == sessions.Reply(
        "ambiguous", None, None, None, ("a", "d"), None, None)
    assert sessions.base_name("my agent.v2") == "my-agent-v2" and sessions.base_name("...") == "agent"


def test_the_resume_hint_comes_from_the_agent_registry() -> None:
    from agentbox.session import detached as sessions

    assert sessions.resume_command(None, "claude") == "agentbox claude --continue"
    assert sessions.resume_command(None, "codex") == "agentbox codex resume --last"
    assert sessions.resume_command(None, "gemini") == "agentbox gemini --resume latest"
    assert sessions.resume_command(None, "mine") is None


def agentbox_run(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=project, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def listed(project: Path) -> list[dict[str, object]]:
    result = agentbox_run(project, "sessions", "--json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def test_attach_to_a_session_that_does_not_exist(vm: FakeLima, project: Path) -> None:
    code, shown = on_terminal(project, ["attach", "nope"], [])
    assert code == 2, shown
    assert "agentbox: error: agentbox-myproject has no session nope" in shown
    code, shown = on_terminal(project, ["attach"], [])
    assert code == 1, shown
    assert "agentbox-myproject has no sessions" in shown


def test_attach_needs_a_terminal_and_a_session_name(vm: FakeLima, project: Path) -> None:
    result = agentbox_run(project, "attach")
    assert result.returncode == 2 and "`agentbox attach` needs a terminal" in result.stderr
    code, shown = on_terminal(project, ["attach", "a;b"], [])
    assert code == 2 and "a;b is not a session name" in shown
    assert vm.subcommands() == []


def test_detach_is_agentboxs_only_right_after_the_agent_and_not_for_shell_or_an_isolated_session(
    isolated_vm: FakeLima, project: Path
) -> None:
    result = agentbox_run(project, "claude", "-d", "shell")
    assert result.returncode == 2 and "--detach starts the agent itself in a session" in result.stderr
    result = agentbox_run(project, "claude", "--detach")
    assert result.returncode == 2, result.stderr
    assert "an isolated session cannot be detached" in result.stderr
    assert "shell" not in isolated_vm.subcommands()


# -- detached sessions: they outlive the `limactl shell` that started them (the double's persistent guest) --

def test_detach_returns_and_attach_follows_the_session_to_its_end(vm: FakeLima, project: Path) -> None:
    install(vm)
    started = agentbox_run(project, "claude", "--detach", "hello", "it's $HOME; \"quoted\"")
    assert started.returncode == 0, started.stderr
    assert started.stdout == "claude\n"
    assert "claude runs in the session claude in agentbox-myproject: `agentbox attach claude`" in started.stderr
    assert vm.subcommands() == ["list", "shell"]
    [row] = listed(project)
    assert {key: row[key] for key in ("name", "agent", "vm", "attached", "state", "exitCode", "ended")} == {
        "name": "claude", "agent": "claude", "vm": NAME, "attached": False, "state": "running", "exitCode": None,
        "ended": None}
    assert isinstance(row["started"], str) and row["started"].endswith("Z")

    vm.clear()
    code, shown = on_terminal(project, ["attach"], [(b"session=claude", b"5\r")])
    assert code == 5, shown
    assert "stand-in agent up: --dangerously-skip-permissions hello it's $HOME; \"quoted\" tty=yes" in shown
    assert vm.subcommands() == ["list", "shell"]
    shell = next(argv for argv in vm.calls() if "shell" in argv)
    script = (REPO / "provision" / "session.sh").read_text()
    assert shell[shell.index(NAME):-1] == [NAME, "--", "bash", "-c", script, "session.sh", "attach", "--reply"]
    assert Path(shell[-1]).parent == sessions.outbox_folder(NAME) and Path(shell[-1]).name.startswith("reply-")
    assert not Path(shell[-1]).exists()  # read, then removed
    [row] = listed(project)
    assert (row["state"], row["exitCode"], row["attached"]) == ("exited", 5, False)

    code, shown = on_terminal(project, ["attach", "claude"], [])
    assert code == 5, shown
    assert "got 5" in shown  # its last screen
    assert "claude exited with code 5" in shown and "`agentbox claude --continue` resumes its conversation" in shown


def test_an_interrupted_attach_leaves_the_session_running(vm: FakeLima, project: Path) -> None:
    import pty

    install(vm)
    assert agentbox_run(project, "claude", "-d").returncode == 0
    master, slave = pty.openpty()
    attach = subprocess.Popen([sys.executable, "-m", "agentbox", "attach", "claude"], cwd=project, stdin=slave,
                              stdout=slave, stderr=slave, start_new_session=True, env={**os.environ, "TERM": "xterm"})
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 60
    while b"session=claude" not in output and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            output += os.read(master, 65536)
    assert b"session=claude" in output, output
    os.killpg(attach.pid, signal.SIGKILL)  # agentbox, limactl and the tmux client go; the terminal too
    attach.wait(timeout=30)
    os.close(master)
    time.sleep(1)
    [row] = listed(project)
    assert (row["state"], row["attached"]) == ("running", False)
    code, shown = on_terminal(project, ["attach"], [(b"session=claude", b"0\r")])
    assert code == 0, shown


def test_a_second_session_gets_its_own_name_and_attach_asks_which(vm: FakeLima, project: Path) -> None:
    install(vm)
    for expected in ("claude\n", "claude-2\n"):
        started = agentbox_run(project, "claude", "-d")
        assert started.stdout == expected, started.stderr
    assert [row["name"] for row in listed(project)] == ["claude", "claude-2"]
    code, shown = on_terminal(project, ["attach"], [])
    assert code == 2, shown
    assert "several sessions run in agentbox-myproject: claude, claude-2" in shown
    table = agentbox_run(project, "sessions")
    assert table.stdout.splitlines()[0].split() == ["NAME", "AGENT", "STARTED", "STATE", "ATTACHED"]
    assert [line.split()[0] for line in table.stdout.splitlines()[1:]] == ["claude", "claude-2"]


NEEDY_AGENT = r"""#!/bin/bash
sleep 1
printf '{"message":"Claude needs your permission to use Bash"}' | bash "$HOME/.agentbox/bin/attention" notification
sleep 2
exit 3
"""


def test_a_detached_session_that_needs_you_is_a_desktop_notification(
    vm: FakeLima, project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sys.platform == "darwin":
        pytest.skip("the stand-in is Linux's notify-send")
    log = notify_send_stand_in(tmp_path, monkeypatch)
    install(vm, NEEDY_AGENT)
    assert agentbox_run(project, "claude", "-d").returncode == 0
    deadline = time.monotonic() + 30
    while not (log.exists() and len(log.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert log.read_text().splitlines() == [
        "--app-name=agentbox -- agentbox: claude needs you session claude in agentbox-myproject: Claude needs your "
        "permission to use Bash. `agentbox attach claude` to answer.",
        "--app-name=agentbox -- agentbox: claude ended session claude in agentbox-myproject: exited with code 3. "
        "`agentbox attach claude` shows its last screen."]


def test_the_keys_in_config(project: Path) -> None:
    write(project / "agentbox.yml", "session:\n  keepAlive: true\nnotify: false\n")
    data = json.loads(run_cli("config", "--json", cwd=project).stdout)
    assert (data["session"]["keepAlive"], data["notify"]) == (True, False)
    write(project / "agentbox.yml", "notify: sometimes\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2 and "notify" in result.stderr


def test_detaching_from_a_kept_session_returns_and_the_agent_goes_on(kept: FakeLima, project: Path) -> None:
    code, shown = on_terminal(project, ["claude"], [(b"session=claude", b"\x02d")])
    assert code == 0, shown
    assert "detached from the session claude: claude goes on in agentbox-myproject; `agentbox attach claude`" in shown
    [row] = listed(project)
    assert (row["name"], row["state"], row["attached"]) == ("claude", "running", False)
    code, shown = on_terminal(project, ["attach", "claude"], [(b"session=claude", b"4\r")])
    assert code == 4, shown
    assert "got 4" in shown


def test_sessions_and_attach_reach_an_agent_that_has_a_vm_of_its_own(vm: FakeLima, project: Path) -> None:
    install(vm)
    write_trusted(project, "agents:\n  codex:\n    vmName: agentbox-codexvm\n")
    created = agentbox_run(project, "codex", "shell", "--", "true")
    assert created.returncode == 0, created.stderr
    codex_bin = vm.home / "agentbox-codexvm" / "guestfs" / "usr-local" / "bin" / "codex"
    write(codex_bin, WAITING_AGENT)
    codex_bin.chmod(0o755)
    assert agentbox_run(project, "codex", "-d").stdout == "codex\n"
    assert agentbox_run(project, "claude", "-d").stdout == "claude\n"
    vm.clear()
    assert {(row["name"], row["vm"]) for row in listed(project)} == {("claude", NAME), ("codex", "agentbox-codexvm")}
    assert vm.subcommands() == ["list", "shell", "shell"]  # one list, one shell per running VM of the project
    table = agentbox_run(project, "sessions").stdout.splitlines()
    assert table[0].split() == ["NAME", "AGENT", "STARTED", "STATE", "ATTACHED", "VM"]
    code, shown = on_terminal(project, ["attach"], [])
    assert code == 2, shown
    assert "several sessions run: claude (in agentbox-myproject), codex (in agentbox-codexvm)" in shown
    code, shown = on_terminal(project, ["attach", "codex"], [(b"session=codex", b"4\r")])
    assert code == 4, shown


# -- what a stop ends: listed and asked on a terminal, said without one (issue 27, item 3) ----------------

SLEEPING_TASK = "#!/bin/sh\nsleep 300\n"


def _session_and_task(vm: FakeLima, project: Path) -> int:
    """A detached session `claude` and a running task (codex, which sleeps) in the project's VM; the task's id."""
    from tests.helpers import wait_for

    install(vm)
    install(vm, SLEEPING_TASK, "codex")
    assert agentbox_run(project, "claude", "-d").stdout == "claude\n"
    started = run_cli("run", "--agent", "codex", "--name", "nap", "sleep", cwd=project)
    assert started.exit_code == 0, started.stderr
    task_id = int(started.stdout)

    def state() -> str:
        tasks = json.loads(run_cli("tasks", "--json", "--all", cwd=project).stdout)
        return str(next(task["state"] for task in tasks if task["id"] == task_id))

    wait_for(state, 60, f"task {task_id} to be Running", until=lambda value: value == "Running")
    return task_id


def _task_state(project: Path, task_id: int) -> str:
    tasks = json.loads(run_cli("tasks", "--json", "--all", cwd=project).stdout)
    return str(next(task["state"] for task in tasks if task["id"] == task_id))


def test_in_a_script_stop_restart_and_rm_change_nothing_without_yes(vm: FakeLima, project: Path) -> None:
    """Issue 37, item 12: one rule for stop, restart and rm: without a terminal to ask on and without --yes, what
    would end running sessions or tasks changes nothing, says why and names the flag (exit 1)."""
    task_id = _session_and_task(vm, project)
    listing = f"{NAME} runs what would end with it:\n  session claude (claude)\n  task {task_id} (nap): Running"
    for args, refusal, flag in (
        (["stop"], f"refusing to stop {NAME}", "agentbox stop --yes"),
        (["stop", "--force"], f"refusing to stop {NAME}", "agentbox stop --force --yes"),
        (["restart"], f"refusing to restart {NAME}", "agentbox restart --yes"),
        (["rm"], f"refusing to delete {NAME}", "agentbox rm --yes"),
        (["stop", "--all"], "refusing to stop every agentbox VM", "agentbox stop --all --yes"),
    ):
        refused = agentbox_run(project, *args)
        assert refused.returncode == 1, refused.stderr
        assert (f"agentbox: error: {refusal} without confirmation (no terminal to ask on); nothing was changed:\n"
                f"{listing}\n") in refused.stderr
        assert f"hint: Run `{flag}` to go on from a script (what is listed ends)" in refused.stderr
        assert vm.status(NAME) == "Running"
        assert [(row["name"], row["state"]) for row in listed(project)] == [("claude", "running")]
        assert _task_state(project, task_id) == "Running"
    stopped = agentbox_run(project, "stop", "--yes")  # the control: --yes goes on, and says what it ended
    assert stopped.returncode == 0, stopped.stderr
    assert f"agentbox: warning: task {task_id} (nap) ended as Failed: its VM {NAME} was stopped" in stopped.stderr
    assert f"agentbox: warning: session claude (claude) ended: its VM {NAME} was stopped" in stopped.stderr
    assert vm.status(NAME) == "Stopped"
    assert _task_state(project, task_id) == "Failed"


def test_in_a_script_stop_and_restart_go_on_when_nothing_runs(vm: FakeLima, project: Path) -> None:
    restarted = agentbox_run(project, "restart")
    assert restarted.returncode == 0, restarted.stderr
    assert f"{NAME} is running" in restarted.stderr and "refusing" not in restarted.stderr
    stopped = agentbox_run(project, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert vm.status(NAME) == "Stopped"


def test_on_a_terminal_stop_restart_and_rm_list_what_ends_and_no_leaves_it_running(
    vm: FakeLima, project: Path
) -> None:
    task_id = _session_and_task(vm, project)
    listing = [f"{NAME} runs what ends with it:", "  session claude (claude)", f"  task {task_id} (nap): Running"]
    for args, question in ((["stop"], f"Stop {NAME}? [y/N]"), (["stop", "--force"], f"Stop {NAME} (killing it)?"),
                           (["restart"], f"Restart {NAME}? [y/N]"), (["stop", "--all"], f"Stop {NAME}? [y/N]"),
                           (["rm"], f"Delete VM {NAME} and its disk?")):
        code, shown = on_terminal(project, args, [(question.encode(), b"n\r")])
        lines = [line.rstrip() for line in shown.replace("\r", "").splitlines()]
        assert all(line in lines for line in listing), shown
        assert code == (0 if "--all" in args else 1), shown
        assert "Aborted!" not in shown
        if "--all" in args:
            assert f"{NAME} left running" in lines
        else:
            assert f"{NAME} {'kept' if args == ['rm'] else 'left running'}; nothing was changed" in lines, shown
        assert vm.status(NAME) == "Running"
        assert [(row["name"], row["state"]) for row in listed(project)] == [("claude", "running")]
        assert _task_state(project, task_id) == "Running"
    code, shown = on_terminal(project, ["stop"], [(f"Stop {NAME}? [y/N]".encode(), b"y\r")])  # the control
    assert code == 0, shown
    assert vm.status(NAME) == "Stopped" and _task_state(project, task_id) == "Failed"
    assert "session claude (claude) ended" in shown


def test_yes_stops_on_a_terminal_without_asking(vm: FakeLima, project: Path) -> None:
    install(vm)
    assert agentbox_run(project, "claude", "-d").stdout == "claude\n"
    code, shown = on_terminal(project, ["stop", "--yes"], [])
    assert code == 0, shown
    assert "[y/N]" not in shown and "session claude (claude) ended" in shown
    assert vm.status(NAME) == "Stopped"


def test_a_session_stopped_with_its_vm_says_so_and_goes_at_the_next_sessions_start(vm: FakeLima,
                                                                                   project: Path) -> None:
    install(vm)
    assert agentbox_run(project, "claude", "-d").stdout == "claude\n"
    assert agentbox_run(project, "stop", "--yes").returncode == 0
    assert agentbox_run(project, "start").returncode == 0
    listed = json.loads(agentbox_run(project, "sessions", "--json").stdout)
    assert [(row["name"], row["state"], row["exitCode"]) for row in listed] == [("claude", "stopped", None)]
    shown = agentbox_run(project, "sessions")
    assert shown.returncode == 0, shown.stderr
    assert "stopped with its VM" in shown.stdout.splitlines()[1]
    install(vm, binary="codex")
    assert agentbox_run(project, "codex", "-d").stdout == "codex\n"  # its start drops the stopped one's record
    listed = json.loads(agentbox_run(project, "sessions", "--json").stdout)
    assert [(row["name"], row["state"]) for row in listed] == [("codex", "running")]
