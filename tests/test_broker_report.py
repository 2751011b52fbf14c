"""What agentbox reports about the credential broker, through the real CLI and the limactl double: `status --json`,
`net status`, `doctor`, `describe` and the context file the VM gets say whether the broker is on, which agents are
brokered and which staged, the CA's fingerprint and the notes; `net log` shows each request the broker judged."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import paths, staginglayout
from agentbox.net import certauthority
from agentbox.net import guard as netguard
from tests.fake_upstream import FakeUpstream
from tests.helpers import GUEST_PROXY, NAME, FakeLima, agentbox, run_cli, staged_logins, write

pytestmark = pytest.mark.timeout(180)

REAL_ACCESS = "sk-ant-oat01-REAL-ACCESS-" + "x" * 40
REAL_REFRESH = "sk-ant-ort01-REAL-REFRESH-" + "y" * 40
REAL_GH = "gho_REALGITHUBTOKEN" + "z" * 20
FOREIGN = "sk-ant-oat01-ATTACKER-" + "q" * 30
CLAUDE = "api.anthropic.com"
BROKER_ON = "credentials:\n  broker: true\n"
# A user-defined agent, in the global config (a project's file would need trust for it).
AIDER = "agents:\n  aider:\n    binary: aider\n    credentials: ['~/.aider.conf.yml']\n"

# In the guest: one request per Authorization header given, each on its own connection through $HTTPS_PROXY to
# api.anthropic.com; LOGIN stands for the VM's placeholder.
REQUESTS = GUEST_PROXY + r"""
import http.client, json, os, ssl, sys, urllib.parse
login = json.load(open(os.path.expanduser("~/.claude/.credentials.json")))["claudeAiOauth"]["accessToken"]
context = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
for authorization in sys.argv[1:]:
    connection = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=20)
    connection.set_tunnel("api.anthropic.com", 443, headers=proxy_auth)
    connection.request("GET", "/api/oauth/profile?secret=in-the-query",
                       headers={"Authorization": authorization.replace("LOGIN", login)})
    print(connection.getresponse().status)
    connection.close()
"""


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeUpstream]:
    with FakeUpstream(tmp_path / "upstream", [CLAUDE, "api.github.com"]) as fake:
        fake.route("GET", "/api/oauth/profile", {"account": "the host's"}, host=CLAUDE,
                   authorization=f"Bearer {REAL_ACCESS}")
        monkeypatch.setenv("AGENTBOX_TEST_BROKER_UPSTREAM",
                           json.dumps({"address": list(fake.address), "caFile": str(fake.ca_file)}))
        yield fake


@pytest.fixture
def host_logins(home: Path) -> None:
    """Claude Code and the GitHub CLI logged in on the host; Codex and Gemini CLI not; aider's file present."""
    write(home / ".claude" / ".credentials.json", json.dumps({"claudeAiOauth": {
        "accessToken": REAL_ACCESS, "refreshToken": REAL_REFRESH, "expiresAt": int((time.time() + 3600) * 1000),
        "scopes": ["user:inference"], "subscriptionType": "max"}}))
    write(home / ".claude.json", json.dumps({"hasCompletedOnboarding": True}))
    write(home / ".config" / "gh" / "hosts.yml",
          f"github.com:\n    user: me\n    oauth_token: {REAL_GH}\n    git_protocol: https\n")
    write(home / ".aider.conf.yml", "model: x\n")
    write(paths.global_config_file(), AIDER)


def _staged_context() -> dict[str, object]:
    """The context file the last launch staged for the VM (launch.sh installs it as /run/agentbox/context.json)."""
    document = json.loads((paths.staging_dir(NAME) / staginglayout.CONTEXT_FILE).read_text())
    assert isinstance(document, dict)
    return document


def _secrets_in(text: str) -> list[str]:
    return [real for real in (REAL_ACCESS, REAL_REFRESH, REAL_GH, FOREIGN, "in-the-query") if real in text]


def test_status_net_status_describe_doctor_and_the_context_file_say_who_is_brokered(
        project: Path, vm: FakeLima, upstream: FakeUpstream, host_logins: None) -> None:
    write(project / "agentbox.yml", BROKER_ON)
    # Codex is in use (set in the user's config), Gemini CLI is not: only Codex's missing login is said.
    write(paths.global_config_file(), AIDER + "  codex:\n    model: gpt-5\n")
    launched = agentbox(project, "shell", "--", "true")
    assert launched.returncode == 0, launched.stderr
    authority = certauthority.load(NAME)
    assert authority is not None and authority.fingerprint.startswith("SHA256:")
    brokered = ["codex", "claude", "gemini", "gh"]
    staged = ["kiro", "opencode", "copilot", "aider"]

    status = json.loads(run_cli("status", "--json", cwd=project).stdout)["broker"]
    assert status["enabled"] is True
    assert sorted(status["brokered"]) == sorted(brokered) and sorted(status["staged"]) == sorted(staged)
    assert status["caFingerprint"] == authority.fingerprint
    assert status["vmHolds"].startswith("no secret of ")
    # The hosts' logins as the launch found them: Codex and Gemini CLI are not logged in on the host.
    assert status["notesChecked"] is True
    assert any("log in with `agentbox codex login`" in note and "on the host with `codex login`" in note
               for note in status["notes"])
    assert not any("Gemini CLI" in note for note in status["notes"])  # not in use: nothing to say
    assert not any("Claude Code" in note for note in status["notes"])
    # status: the CA's SHA-256, its first 16 hex digits, on a line of its own that fits 80 columns
    digits = authority.fingerprint.removeprefix("SHA256:").replace(":", "")
    ca_lines = [line for line in run_cli("status", cwd=project).stdout.splitlines() if line.startswith("ca:")]
    assert ca_lines == [f"ca:        SHA256:{digits[:16]}... (`agentbox net status` shows it whole)"]
    assert len(ca_lines[0]) <= 80

    net = run_cli("net", "status", "--json", cwd=project)
    assert net.exit_code == 0, net.stderr
    assert json.loads(net.stdout)["broker"] == status
    text = run_cli("net", "status", cwd=project).stdout
    assert "broker:          on (credentials.broker)" in text
    assert f"brokered: {', '.join(status['brokered'])}" in text and "aider" in text
    assert f"CA: {authority.fingerprint}" in text and "on the host with `codex login`" in text
    assert "Gemini" not in text
    assert "for the credential broker only" in text  # open mode: the proxy runs for the broker

    doctor = json.loads(run_cli("doctor", "--json", cwd=project).stdout)
    mine = [check for check in doctor if check["check"] == "broker"]
    assert mine[0]["status"] == "OK" and authority.fingerprint in mine[0]["message"]
    assert "brokered codex, claude, gemini, gh" in mine[0]["message"] and "aider" in mine[0]["message"]
    assert any(check["status"] == "WARN" and "`codex login`" in check["message"] for check in mine[1:])
    logins = {check["check"]: check["message"] for check in doctor}
    assert "brokered: placeholders staged" in logins["credentials.claude"]
    assert "brokered: placeholders staged" in logins["credentials.gh"]
    assert logins["credentials.aider"] == "aider: logged in on the host, staged, in the VM"

    described = json.loads(run_cli("describe", "--json", cwd=project).stdout)["credentials"]["broker"]
    assert {key: value for key, value in described.items() if key != "meaning"} == status
    assert "placeholders" in described["meaning"]
    assert "Broker        on (credentials.broker)" in run_cli("describe", cwd=project).stdout
    # What the agent reads in the VM: the same block, staged by the launch.
    in_vm = _staged_context()["credentials"]
    assert isinstance(in_vm, dict) and in_vm["broker"] == described
    assert not _secrets_in(json.dumps(in_vm))


def test_without_the_broker_everything_is_reported_staged(project: Path, vm: FakeLima, host_logins: None,
                                                          home: Path) -> None:
    write(project / "agentbox.yml", "")
    staged_logins(home)
    assert agentbox(project, "shell", "--", "true").returncode == 0
    status = json.loads(run_cli("status", "--json", cwd=project).stdout)["broker"]
    assert status["enabled"] is False and status["brokered"] == [] and status["caFingerprint"] is None
    assert sorted(status["staged"]) == sorted(["codex", "claude", "gemini", "kiro", "opencode", "copilot", "aider",
                                               "gh"])
    assert "copies of the host's login files" in status["vmHolds"]
    assert json.loads(run_cli("net", "status", "--json", cwd=project).stdout)["broker"] == status
    assert "broker:          off (credentials.broker)" in run_cli("net", "status", cwd=project).stdout
    doctor = json.loads(run_cli("doctor", "--json", cwd=project).stdout)
    assert [check["message"].split(":")[0] for check in doctor if check["check"] == "broker"] == [
        "credential broker off"]
    assert {check["check"]: check["message"] for check in doctor}["credentials.claude"] == (
        "claude: logged in on the host, staged, in the VM")
    assert _staged_context()["credentials"]["broker"]["enabled"] is False  # type: ignore[index]
    assert certauthority.load(NAME) is None


def test_describe_reads_no_host_login_and_reports_notes_only_after_a_launch(
        project: Path, limactl: FakeLima, home: Path) -> None:
    """describe and status stay cheap: a malformed host login (which a launch refuses) is not even read."""
    write(project / "agentbox.yml", BROKER_ON)
    write(home / ".claude" / ".credentials.json", "{not json")
    result = run_cli("describe", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    broker = json.loads(result.stdout)["credentials"]["broker"]
    assert broker["enabled"] is True and "claude" in broker["brokered"]
    assert broker["notesChecked"] is False and broker["notes"] == [] and broker["caFingerprint"] is None
    assert "the host's logins are checked at the next launch" in run_cli("net", "status", cwd=project).stdout


def test_net_log_shows_each_request_the_broker_judged_and_never_a_secret(
        project: Path, vm: FakeLima, upstream: FakeUpstream, host_logins: None) -> None:
    write(project / "agentbox.yml", BROKER_ON)
    result = agentbox(project, "shell", "--", "python3", "-c", REQUESTS, "Bearer LOGIN", f"Bearer {FOREIGN}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["200", "403"]
    log = run_cli("net", "log", cwd=project)
    assert log.exit_code == 0, log.stderr
    lines = log.stdout.splitlines()
    substituted = [line for line in lines if "  substitute  GET" in line]
    assert len(substituted) == 1
    assert f"{CLAUDE}:443/api/oauth/profile  claude -> 200  (claude's credential)" in substituted[0]
    refused = [line for line in lines if "  deny   GET" in line]
    assert len(refused) == 1 and f"{CLAUDE}:443/api/oauth/profile  -  (" in refused[0]
    assert "not this VM's" in refused[0]
    # The CONNECT lines are the proxy's own decisions; --broker leaves them out.
    assert any(" CONNECT " in line for line in lines)
    only = run_cli("net", "log", "--broker", cwd=project).stdout.splitlines()
    assert only == [line for line in lines if "/api/oauth/profile" in line] and len(only) == 2
    assert run_cli("net", "log", "--broker", "-n", "1", cwd=project).stdout.splitlines() == only[-1:]
    as_json = [json.loads(line) for line in run_cli("net", "log", "--broker", "--json", cwd=project).stdout.splitlines()]
    assert [(entry["decision"], entry["agent"], entry["path"]) for entry in as_json] == [
        ("substitute", "claude", "/api/oauth/profile"), ("deny", None, "/api/oauth/profile")]
    everything = log.stdout + run_cli("net", "log", "--json", cwd=project).stdout
    assert not _secrets_in(everything)
    assert "agentbox-ph-" not in everything  # not even the VM's placeholder
    assert netguard.log_path(NAME).is_file()
