"""Credential write-back and login from inside the VM, through the CLI and the double's real shell.

A stand-in agent in the VM runs the workspace's `.agent.sh` (what each test wants it to do: rotate a
token, log in, misbehave), so every write-back below goes the whole way: launch.sh hands the file
back through the outbox mount as lima.yaml declares it, and the host decides.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import NAME, FakeLima, run_agentbox, run_cli, staged_logins, without_once_notes, write

# Runs the workspace's .agent.sh with the arguments the agent got (a test's script of what it does).
AGENT = "#!/bin/sh\n[ ! -f .agent.sh ] || . ./.agent.sh\n"
CLAUDE = ".claude/.credentials.json"
CODEX = ".codex/auth.json"
GEMINI = ".gemini/oauth_creds.json"


def install_agents(lima: FakeLima, name: str = NAME) -> None:
    bin_dir = lima.home / name / "guestfs" / "usr-local" / "bin"
    for binary in ("claude", "codex", "gemini"):
        write(bin_dir / binary, AGENT, mode=0o755)


@pytest.fixture(autouse=True)
def _staged_logins(home: Path) -> None:
    """Write-back is for logins copied into the VM (with the credential broker they never are)."""
    staged_logins(home)


@pytest.fixture
def agents(vm: FakeLima) -> FakeLima:
    install_agents(vm)
    return vm


def agent_does(project: Path, script: str) -> None:
    write(project / ".agent.sh", script)


def writes(path: str, content: str) -> str:
    """Shell lines that make the agent write content to ~/path in the VM."""
    return f'mkdir -p "$(dirname "$HOME/{path}")"\ncat > "$HOME/{path}" <<\'AGENTBOX_EOF\'\n{content}\nAGENTBOX_EOF\n'


def claude_login(refresh: str, expires_ms: int) -> str:
    return json.dumps({"claudeAiOauth": {
        "accessToken": f"sk-ant-oat01-access-{refresh}", "refreshToken": f"sk-ant-ort01-{refresh}",
        "expiresAt": expires_ms, "scopes": ["user:inference", "user:profile"], "subscriptionType": "max",
    }})


def claude_account(uuid: str, email: str) -> str:
    return json.dumps({"hasCompletedOnboarding": True, "oauthAccount": {"accountUuid": uuid, "emailAddress": email}})


def jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


def codex_login(account: str, email: str, refreshed: str) -> str:
    return json.dumps({"OPENAI_API_KEY": None, "last_refresh": refreshed, "tokens": {
        "id_token": jwt({"sub": f"user-{account}", "email": email,
                         "https://api.openai.com/auth": {"chatgpt_account_id": account}}),
        "access_token": jwt({"exp": 1_900_000_000}), "refresh_token": f"rt_{account}_{refreshed}",
        "account_id": account,
    }})


def gemini_login(sub: str, refresh: str, expiry_ms: int | None) -> str:
    login: dict[str, Any] = {"access_token": f"ya29.{refresh}", "refresh_token": f"1//{refresh}",
                             "token_type": "Bearer", "id_token": jwt({"sub": sub, "email": f"{sub}@example.com"})}
    if expiry_ms is not None:
        login["expiry_date"] = expiry_ms
    return json.dumps(login)


def backup(path: Path) -> Path:
    return path.with_name(path.name + ".agentbox-backup")


def guest_file(lima: FakeLima, path: str, name: str = NAME) -> Path:
    return lima.guest_home(name) / path


# -- a login refreshed in the VM -----------------------------------------------------------------


def test_a_token_rotated_in_the_vm_reaches_the_host_file(project: Path, agents: FakeLima, home: Path) -> None:
    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o640)
    new = claude_login("r2", 1_750_028_800_000)
    agent_does(project, writes(CLAUDE, new))
    result = run_agentbox("claude", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == new + "\n"
    assert stat.S_IMODE(host.stat().st_mode) == 0o640  # the host file's mode is kept
    assert backup(host).read_text() == old
    assert stat.S_IMODE(backup(host).stat().st_mode) == 0o600
    assert ("agentbox: ~/.claude/.credentials.json: the Claude Code login refreshed in the VM is now the host's too "
            "(the previous file is ~/.claude/.credentials.json.agentbox-backup)\n") in result.stderr
    assert agents.subcommands() == ["list", "shell"]  # the warm launch's two calls, write-back included

    # The next launch brings the same login into the VM and has nothing to hand back.
    agent_does(project, "")
    again = run_agentbox("claude", cwd=project)
    assert again.returncode == 0, again.stderr
    assert "agentbox: " not in again.stderr
    assert guest_file(agents, CLAUDE).read_text() == new + "\n"
    assert host.read_text() == new + "\n"


def test_a_login_the_vm_did_not_refresh_is_not_written_back(project: Path, agents: FakeLima, home: Path) -> None:
    """Newest wins by the token's own expiry: a login that expires earlier stays in the VM."""
    current = claude_login("r5", 1_750_028_800_000)
    host = write(home / CLAUDE, current, mode=0o600)
    agent_does(project, writes(CLAUDE, claude_login("r4", 1_750_000_000_000)))
    result = run_agentbox("claude", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == current
    assert not backup(host).exists()
    assert "agentbox: " not in without_once_notes(result.stderr)


def test_without_an_expiry_the_newer_file_wins(project: Path, agents: FakeLima, home: Path) -> None:
    """A Gemini login without expiry_date is compared by modification time."""
    old = gemini_login("alice", "r1", None)
    host = write(home / GEMINI, old, mode=0o600)
    os.utime(host, (time.time() - 3600, time.time() - 3600))
    agent_does(project, writes(GEMINI, gemini_login("alice", "r0", None)) + f'touch -d "2001-01-01" "$HOME/{GEMINI}"\n')
    assert run_agentbox("gemini", cwd=project).returncode == 0
    assert host.read_text() == old  # the VM's copy is older than the host's

    new = gemini_login("alice", "r2", None)
    agent_does(project, writes(GEMINI, new))
    result = run_agentbox("gemini", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == new + "\n"


def test_a_host_login_made_during_the_session_is_not_overwritten(project: Path, agents: FakeLima,
                                                                 home: Path) -> None:
    host = write(home / CLAUDE, claude_login("r1", 1_750_000_000_000), mode=0o600)
    agent_does(project, writes(CLAUDE, claude_login("r2", 1_750_028_800_000))
               + "touch .started\nwhile [ ! -f .go ]; do sleep 0.1; done\n")
    session = subprocess.Popen([sys.executable, "-m", "agentbox", "claude"], cwd=project, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (project / ".started").exists():
            assert session.poll() is None and time.monotonic() < deadline, session.communicate()
            time.sleep(0.1)
        host_login = claude_login("host-login", 1_750_020_000_000)
        host.write_text(host_login)  # the user logs in on the host meanwhile
        (project / ".go").touch()
        _, stderr = session.communicate(timeout=90)
    finally:
        if session.poll() is None:
            session.kill()
    assert session.returncode == 0, stderr
    assert host.read_text() == host_login
    assert not backup(host).exists()
    assert ("~/.claude/.credentials.json from the VM was not copied back to ~/.claude/.credentials.json: the host's "
            "file changed during the session") in stderr

    # The host's login reaches the VM at the next launch.
    (project / ".agent.sh").unlink()
    assert run_agentbox("claude", cwd=project).returncode == 0
    assert guest_file(agents, CLAUDE).read_text() == host_login


@pytest.mark.parametrize(("guest", "why"), [
    ("{not json", "it is not a Claude Code login (it is not valid JSON)"),
    (json.dumps({"claudeAiOauth": {"accessToken": "sk-ant-oat01-x", "expiresAt": 1_760_000_000_000}}),
     "it is not a Claude Code login (it has no claudeAiOauth.refreshToken)"),
    ("[]", "it is not a Claude Code login (it is not a JSON object)"),
])
def test_a_guest_file_that_does_not_parse_is_never_written_back_and_said_once(
        project: Path, agents: FakeLima, home: Path, guest: str, why: str) -> None:
    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o600)
    agent_does(project, writes(CLAUDE, guest))
    first = run_agentbox("claude", cwd=project)
    assert first.returncode == 0, first.stderr
    assert host.read_text() == old and not backup(host).exists()
    assert without_once_notes(first.stderr) == (f"agentbox: ~/.claude/.credentials.json from the VM was not copied back to "
                            f"~/.claude/.credentials.json: {why}; the host's file is unchanged\n")
    agent_does(project, "")  # the VM keeps its copy: handed back again, refused again, not said again
    second = run_agentbox("claude", cwd=project)
    assert second.returncode == 0 and without_once_notes(second.stderr) == ""
    assert host.read_text() == old


@pytest.mark.parametrize("agent", ["claude", "codex", "gemini"])
def test_a_login_of_another_account_is_never_written_back(project: Path, agents: FakeLima, home: Path,
                                                          agent: str) -> None:
    if agent == "claude":
        write(home / ".claude.json", claude_account("uuid-a", "alice@example.com"), mode=0o600)
        path, old = CLAUDE, claude_login("r1", 1_750_000_000_000)
        script = writes(".claude.json", claude_account("uuid-b", "bob@example.com")) + writes(
            CLAUDE, claude_login("b1", 1_760_000_000_000))
    elif agent == "codex":
        path, old = CODEX, codex_login("acct-a", "alice@example.com", "2025-06-01T10:00:00.123456789Z")
        script = writes(CODEX, codex_login("acct-b", "bob@example.com", "2025-07-01T10:00:00Z"))
    else:
        path, old = GEMINI, gemini_login("alice", "r1", 1_750_000_000_000)
        script = writes(GEMINI, gemini_login("bob", "b1", 1_760_000_000_000))
    host = write(home / path, old, mode=0o600)
    agent_does(project, script)
    result = run_agentbox(agent, cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == old and not backup(host).exists()
    assert (f"from the VM was not copied back to ~/{path}: it is logged in as bob@example.com, the host's file as "
            f"alice@example.com; `agentbox {agent} login` makes a VM login the host's too, "
            "`credentials: {writeBack: false}` keeps them apart\n") in result.stderr


def test_the_same_account_is_recognised_by_its_id(project: Path, agents: FakeLima, home: Path) -> None:
    """Codex: the same account_id with a later last_refresh is written back (the e-mail may differ)."""
    host = write(home / CODEX, codex_login("acct-a", "alice@example.com", "2025-06-01T10:00:00Z"), mode=0o600)
    new = codex_login("acct-a", "alice@new.example.com", "2025-06-02T10:00:00Z")
    agent_does(project, writes(CODEX, new))
    result = run_agentbox("codex", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == new + "\n"


def test_write_back_false_changes_nothing(project: Path, agents: FakeLima, home: Path, isolated_env) -> None:
    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o600)
    write(project / "agentbox.yml", "credentials:\n  writeBack: false\n")  # turning it off needs no trust
    new = claude_login("r2", 1_760_000_000_000)
    agent_does(project, writes(CLAUDE, new))
    result = run_agentbox("claude", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == old and not backup(host).exists()
    assert without_once_notes(result.stderr) == ""
    assert guest_file(agents, CLAUDE).read_text() == new + "\n"  # the VM keeps its own
    creds_outbox = isolated_env["state"] / "vms" / NAME / "outbox" / "creds"
    assert not creds_outbox.exists() or not any(creds_outbox.iterdir())


def test_a_project_file_cannot_turn_write_back_on_against_the_global_config(project: Path, home: Path) -> None:
    global_file = write(home / ".config" / "agentbox" / "config.yml", "credentials:\n  writeBack: false\n  broker: false\n")
    write(project / "agentbox.yml", "credentials:\n  writeBack: true\n  netrc: false\n")
    result = run_cli("config", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["credentials"]["writeBack"] is False
    assert (f"credentials.writeBack: true in {project / 'agentbox.yml'} is not used: the global config "
            f"({global_file}) turns write-back off, and a project file can only turn it off") in result.stderr
    write(global_file, "credentials:\n  writeBack: true\n")
    write(project / "agentbox.yml", "credentials:\n  writeBack: false\n")
    narrowed = run_cli("config", "--json", cwd=project)
    assert json.loads(narrowed.stdout)["credentials"]["writeBack"] is False
    assert without_once_notes(narrowed.stderr) == ""


def test_two_sessions_ending_at_once_write_back_once(project: Path, agents: FakeLima, home: Path,
                                                     isolated_env) -> None:
    """Two VMs rotate the same host login and end together: one write-back, a whole file, one backup."""
    other = project.parent / "other"
    other.mkdir()
    assert run_cli("start", cwd=other).exit_code == 0
    install_agents(agents, "agentbox-other")
    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o600)
    logins = {}
    for folder, refresh in ((project, "from-a"), (other, "from-b")):
        logins[folder] = claude_login(refresh, 1_760_000_000_000) + "\n"
        agent_does(folder, writes(CLAUDE, logins[folder].rstrip("\n"))
                   + "touch .started\nwhile [ ! -f .go ]; do sleep 0.05; done\n")
    import fcntl

    lock = os.open(isolated_env["state"] / "credentials.lock", os.O_RDWR | os.O_CREAT, 0o600)
    sessions = [subprocess.Popen([sys.executable, "-m", "agentbox", "claude"], cwd=folder, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for folder in (project, other)]
    try:
        deadline = time.monotonic() + 120
        while not all((folder / ".started").exists() for folder in (project, other)):
            assert all(s.poll() is None for s in sessions) and time.monotonic() < deadline
            time.sleep(0.1)
        fcntl.flock(lock, fcntl.LOCK_EX)  # both will queue on the write-back lock
        for folder in (project, other):
            (folder / ".go").touch()
        time.sleep(3)
        fcntl.flock(lock, fcntl.LOCK_UN)
        outputs = [s.communicate(timeout=90)[1] for s in sessions]
    finally:
        os.close(lock)
        for s in sessions:
            if s.poll() is None:
                s.kill()
    assert [s.returncode for s in sessions] == [0, 0], outputs
    written = host.read_text()
    assert written in logins.values()
    json.loads(written)  # whole, valid JSON
    assert backup(host).read_text() == old
    assert sum("is now the host's too" in err for err in outputs) == 1, outputs
    assert sum("the host's file changed during the session" in err for err in outputs) == 1, outputs


# -- login from inside the VM --------------------------------------------------------------------


LOGIN_URL = "https://auth.example.com/oauth/authorize?client_id=x&redirect_uri=http%3A%2F%2Flocalhost%3A1455%2Fcb"


def test_login_from_inside_the_vm_logs_the_host_in(project: Path, agents: FakeLima, home: Path) -> None:
    login = codex_login("acct-a", "alice@example.com", "2025-06-01T10:00:00Z")
    agent_does(project, 'printf "%s\\n" "$@" > .login-args\n'
                        f'"$BROWSER" "{LOGIN_URL}"\n' + writes(CODEX, login))
    result = run_agentbox("codex", "login", "--device-auth", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (project / ".login-args").read_text() == "login\n--device-auth\n"  # no default arguments
    assert f"agentbox: open this address in a browser on your computer (the VM has none):\n\n  {LOGIN_URL}\n" \
        in result.stderr
    assert "agentbox: logging in to OpenAI Codex CLI in the VM agentbox-myproject\n" in result.stderr
    host = home / CODEX
    assert host.read_text() == login + "\n"
    assert stat.S_IMODE(host.stat().st_mode) == 0o600
    assert stat.S_IMODE(host.parent.stat().st_mode) == 0o700
    assert "agentbox: ~/.codex/auth.json: the Codex login made in the VM is now the host's too\n" in result.stderr
    assert guest_file(agents, ".agentbox/last-url").read_text() == LOGIN_URL + "\n"
    assert agents.subcommands() == ["list", "shell"]


def test_login_may_replace_the_host_login_with_another_account(project: Path, agents: FakeLima,
                                                               home: Path) -> None:
    old = gemini_login("alice", "r1", 1_750_000_000_000)
    host = write(home / GEMINI, old, mode=0o600)
    new = gemini_login("bob", "b1", 1_760_000_000_000)
    agent_does(project, 'printf "%s\\n" "$#" > .login-args\n' + writes(GEMINI, new))
    result = run_agentbox("gemini", "login", cwd=project)
    assert result.returncode == 0, result.stderr
    assert (project / ".login-args").read_text() == "0\n"  # Gemini CLI logs in from its own prompt
    assert host.read_text() == new + "\n"
    assert backup(host).read_text() == old
    assert ("agentbox: ~/.gemini/oauth_creds.json: the host is now logged in to Gemini CLI as bob@example.com "
            "(was alice@example.com); the previous file is ~/.gemini/oauth_creds.json.agentbox-backup\n") \
        in result.stderr


def test_login_of_an_agent_agentbox_cannot_log_in(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "agents:\n  mytool:\n    binary: mytool\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = run_cli("mytool", "login", cwd=project)
    assert result.exit_code == 1, result.stderr
    assert result.stderr == ("agentbox: error: agentbox does not know how mytool logs in\nhint: Run `agentbox mytool "
                             "shell` and log in with mytool's own command there; the login stays in the VM.\n")
    assert limactl.calls() == []


def test_the_vm_forwards_the_login_callback_ports_and_mounts_the_outbox(project: Path, isolated_env) -> None:
    """Lima forwards a guest's localhost listener to the host's same port unless a portForwards rule says
    otherwise (first match wins): Codex's 1455 and the random ports Claude Code and Gemini CLI pick stay
    forwarded as they are."""
    write(project / "agentbox.yml", "")
    rendered = yaml.safe_load(run_cli("template", cwd=project).stdout)
    for port in (1455, 32768, 45000, 60999):
        rule = next((r for r in rendered.get("portForwards") or [] if _matches(r, port)), None)
        assert rule is None or (not rule.get("ignore") and _host_port(rule, port) == port), (port, rule)
    outbox = str(isolated_env["state"] / "vms" / NAME / "outbox")
    staging_dir = str(isolated_env["state"] / "vms" / NAME / "staging")
    mounts = {m["mountPoint"]: (m["location"], m["writable"]) for m in rendered["mounts"]}
    assert mounts[outbox] == (outbox, True)
    assert mounts[staging_dir] == (staging_dir, False)


def _matches(rule: dict[str, Any], port: int) -> bool:
    if rule.get("guestSocket") or rule.get("proto", "tcp") not in ("tcp", "any"):
        return False
    if rule.get("guestIP", "127.0.0.1") not in ("127.0.0.1", "0.0.0.0"):
        return False
    low, high = rule.get("guestPortRange") or [rule.get("guestPort", 1), rule.get("guestPort", 65535)]
    return low <= port <= high


def _host_port(rule: dict[str, Any], port: int) -> int:
    guest_low = (rule.get("guestPortRange") or [rule.get("guestPort", port)])[0]
    host_low = (rule.get("hostPortRange") or [rule.get("hostPort") or guest_low])[0]
    return port - guest_low + host_low


# -- signals, exit codes, old VMs, a hostile outbox -------------------------------------------------


def test_ctrl_c_reaches_the_agent_and_the_login_is_still_handed_back(project: Path, agents: FakeLima,
                                                                     home: Path) -> None:
    """A terminal's Ctrl-C signals the whole foreground group: the agent gets it (and may go on), launch.sh
    outlives it to hand the login back, and agentbox exits with the agent's status."""
    host = write(home / CLAUDE, claude_login("r1", 1_750_000_000_000), mode=0o600)
    new = claude_login("r2", 1_760_000_000_000)
    agent_does(project, writes(CLAUDE, new) + "trap 'echo caught' INT\nkill -INT 0\necho went on\nexit 3\n")
    handled = subprocess.run([sys.executable, "-m", "agentbox", "claude"], cwd=project, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=90, start_new_session=True)
    assert handled.returncode == 3, handled.stderr
    assert handled.stdout == "caught\nwent on\n"
    assert host.read_text() == new + "\n"

    newer = claude_login("r3", 1_770_000_000_000)
    agent_does(project, writes(CLAUDE, newer) + "kill -INT 0\nsleep 5\n")
    killed = subprocess.run([sys.executable, "-m", "agentbox", "claude"], cwd=project, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=90, start_new_session=True)
    assert killed.returncode == 128 + signal.SIGINT, killed.stderr
    assert host.read_text() == newer + "\n"


def test_on_a_terminal_ctrl_c_and_the_browser_reach_the_session(project: Path, agents: FakeLima,
                                                                home: Path) -> None:
    """On a real terminal: the agent has it as its terminal, a typed Ctrl-C reaches the agent (which goes on),
    a browser the agent starts detached from the terminal still shows its address there, and the login the
    agent refreshed is handed back when it exits with its own status."""
    import fcntl
    import pty
    import select
    import termios

    host = write(home / CLAUDE, claude_login("r1", 1_750_000_000_000), mode=0o600)
    new = claude_login("r2", 1_760_000_000_000)
    agent_does(project, writes(CLAUDE, new) + f"""trap 'echo caught-int' INT
[ -t 0 ] && echo "stdin is a terminal"
setsid "$BROWSER" "{LOGIN_URL}" </dev/null >/dev/null 2>&1
echo READY
while [ ! -f .done ]; do sleep 0.1; done
exit 6
""")

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agentbox", "claude"], cwd=project, stdin=slave, stdout=slave,
                            stderr=slave, preexec_fn=controlling_terminal)
    os.close(slave)
    output = ""
    deadline = time.monotonic() + 120
    interrupted = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    output += os.read(master, 65536).decode(errors="replace")
                except OSError:
                    break
            if "READY" in output and LOGIN_URL in output and not interrupted:
                os.write(master, b"\x03")
                interrupted = True
            if interrupted and "caught-int" in output and not (project / ".done").exists():
                (project / ".done").touch()
            if proc.poll() is not None and not ready:
                break
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the launch did not end; it printed:\n{output}")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert code == 6, output
    assert "stdin is a terminal" in output and "caught-int" in output
    shown = output.replace("\r", "")
    assert f"open this address in a browser on your computer (the VM has none):\n\n  {LOGIN_URL}\n" in shown
    assert host.read_text() == new + "\n"


def test_a_vm_created_without_the_outbox_says_so_and_keeps_the_host_file(project: Path, agents: FakeLima,
                                                                         home: Path, isolated_env) -> None:
    outbox = str(isolated_env["state"] / "vms" / NAME / "outbox")
    _forget_outbox_mount(agents.home / NAME / "lima.yaml", outbox)
    _forget_outbox_mount(isolated_env["state"] / "vms" / NAME / "lima.yaml", outbox)
    state_file = isolated_env["state"] / "vms" / NAME / "state.json"
    state = json.loads(state_file.read_text())
    state["expected"]["mounts"] = [m for m in state["expected"]["mounts"] if m[0] != outbox]
    del state["expected"]["targets"][outbox]
    state_file.write_text(json.dumps(state))

    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o600)
    agent_does(project, writes(CLAUDE, claude_login("r2", 1_760_000_000_000)) + "exit 4\n")
    result = run_agentbox("claude", cwd=project)
    assert result.returncode == 4
    assert without_once_notes(result.stderr) == (f"agentbox: credential write-back is off for {NAME}: it was created before agentbox gave "
                             "VMs an outbox, so a login refreshed in it stays there; `agentbox start --recreate` "
                             "applies it\n")
    assert host.read_text() == old
    assert agents.subcommands() == ["list", "shell"]


def _forget_outbox_mount(lima_yaml: Path, outbox: str) -> None:
    data = yaml.safe_load(lima_yaml.read_text())
    data["mounts"] = [m for m in data["mounts"] if m["location"] != outbox]
    lima_yaml.write_text(yaml.safe_dump(data, sort_keys=False))


def test_an_outbox_the_vm_redirected_is_neither_read_nor_used(project: Path, agents: FakeLima, home: Path,
                                                              isolated_env) -> None:
    """The agent replaces outbox/creds with a link into the workspace, holding a login it made up: the host
    reads nothing through the link, and the next launch puts a real folder back instead of following it
    (and then takes the VM's own refreshed login, handed back the way launch.sh hands it)."""
    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o600)
    outbox = isolated_env["state"] / "vms" / NAME / "outbox"
    forged = claude_login("forged", 1_790_000_000_000)
    refreshed = claude_login("r2", 1_760_000_000_000)
    agent_does(project, writes(CLAUDE, refreshed) + f"""
session="$(basename "$(ls -d {outbox}/creds/s-*)")"
mkdir -p "$PWD/trap/$session"
printf '%s' '{forged}' > "$PWD/trap/$session/0"
rm -rf {outbox}/creds
ln -s "$PWD/trap" {outbox}/creds
""")
    result = run_agentbox("claude", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == old and not backup(host).exists()
    assert (outbox / "creds").is_symlink()

    agent_does(project, "")
    before = sorted(p.name for p in (project / "trap").iterdir())
    assert run_agentbox("claude", cwd=project).returncode == 0
    assert not (outbox / "creds").is_symlink() and (outbox / "creds").is_dir()
    assert sorted(p.name for p in (project / "trap").iterdir()) == before
    assert host.read_text() == refreshed + "\n"


@pytest.mark.parametrize(("script", "said"), [
    (f'head -c 2000000 /dev/zero > "$HOME/{CLAUDE}"\n', "the VM's copy is larger than 1,048,576 bytes, the most agentbox reads"),
    ('dir="$(ls -d "$OUTBOX"/creds/s-*)"\nmkdir "$dir/0"\n' + writes(CLAUDE, claude_login("r2", 1_760_000_000_000)),
     "the VM's copy is a folder, not a regular file"),
])
def test_a_hostile_copy_is_not_read(project: Path, agents: FakeLima, home: Path, isolated_env,
                                    script: str, said: str) -> None:
    old = claude_login("r1", 1_750_000_000_000)
    host = write(home / CLAUDE, old, mode=0o600)
    agent_does(project, f"OUTBOX={isolated_env['state'] / 'vms' / NAME / 'outbox'}\nmkdir -p ~/.claude\n" + script)
    result = run_agentbox("claude", cwd=project)
    assert result.returncode == 0, result.stderr
    assert host.read_text() == old
    assert f"was not copied back to ~/.claude/.credentials.json: {said}\n" in result.stderr
    # The session's folder is gone, whatever the VM put in it.
    assert list((isolated_env["state"] / "vms" / NAME / "outbox" / "creds").iterdir()) == []


def test_the_agent_gets_a_browser_that_prints_the_address(project: Path, agents: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    result = run_agentbox("shell", "--", "sh", "-c", '"$BROWSER" "http://localhost:5000/x?a=1&b=\x1b[31m"', cwd=project)
    assert result.returncode == 0, result.stderr
    assert "\n  http://localhost:5000/x?a=1&b=[31m\n" in result.stderr  # control characters dropped
