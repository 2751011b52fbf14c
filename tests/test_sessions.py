"""Detachable sessions through the CLI against the limactl double: `agentbox AGENT --detach`, session.keepAlive,
`agentbox attach`, `agentbox sessions`; the VM side is provision/session.sh under the guest's real tmux."""

from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox import sessions
from tests.helpers import NAME, FakeLima, write, write_trusted

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
    from agentbox import sessions

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
    from agentbox import sessions

    assert sessions.resume_command(None, "claude") == "agentbox claude --continue"
    assert sessions.resume_command(None, "codex") == "agentbox codex resume --last"
    assert sessions.resume_command(None, "gemini") == "agentbox gemini --resume latest"
    assert sessions.resume_command(None, "mine") is None
