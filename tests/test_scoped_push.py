"""git.allowPush: session (scoped pushes): the key and its trust, what a launch hands the broker and the VM's guards,
the broker the proxy process builds from it, what the agent is told, and what `status` and `net log` show.

The broker's own judgement of a push (receive-pack's commands read on the host) is tested with the proxy
(tests/test_broker.py); the guards' refusals with the real git against a local bare repository in
tests/test_wrappers.py and, here, inside the double's guest.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from agentbox.config import load as config
from agentbox.config import trust
from agentbox.credentials.broker import brokered, process
from agentbox.net import guard as netguard
from agentbox.net import pushes
from agentbox.session import context, staging
from tests.helpers import NAME, FakeLima, agentbox, run_cli, write, write_trusted

pytestmark = pytest.mark.timeout(180)

BRANCHES = f"agentbox/{NAME}/"
NAMESPACE = f"refs/heads/{BRANCHES}"
ZERO = "0" * 40
SHA_A = "1a2b3c4d" + "a" * 32
SHA_B = "5e6f7a8b" + "b" * 32
REAL_GH = "gho_REALGITHUBTOKEN" + "z" * 20


def global_config(home: Path, text: str) -> Path:
    return write(home / ".config" / "agentbox" / "config.yml", text)


# -- the key -----------------------------------------------------------------------------------------------


def test_true_is_refused_naming_the_file_the_key_and_what_to_use_instead(project: Path, limactl: FakeLima,
                                                                          isolated_env: dict[str, Path]) -> None:
    path = write(project / "agentbox.yml", "git:\n  allowPush: true\n")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert (f"agentbox: error: {path}:2:14: git.allowPush: true is refused: it would allow pushes anywhere, which is "
            "sync.remoteWrite's to allow") in result.stderr
    assert ("Write `allowPush: session` to let the agent push branches under agentbox/<vm>/ only, or "
            "`sync: {remoteWrite: true}` to allow every push.") in result.stderr
    assert limactl.calls() == [] and not isolated_env["state"].exists()  # nothing created


def test_the_global_file_is_checked_the_same_way(project: Path, home: Path) -> None:
    path = global_config(home, "git:\n  allowPush: yes\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert f"{path}:2:14: git.allowPush: yes is refused" in result.stderr


@pytest.mark.parametrize(("value", "found"), [
    ("'session please'", "'session please' (a string)"),
    ("'false'", "'false' (a string)"),
    ("[session]", "expected a single value, found a list"),
    ("1", "1 (a number)"),
])
def test_anything_but_false_or_session_is_refused(project: Path, value: str, found: str) -> None:
    write(project / "agentbox.yml", f"git:\n  allowPush: {value}\n")
    result = run_cli("config", "--json", cwd=project)
    assert result.exit_code == 2 and result.stdout == ""
    assert "git.allowPush: " in result.stderr and found in result.stderr


def test_the_default_is_false_and_config_shows_the_value(project: Path) -> None:
    write(project / "agentbox.yml", "")
    assert json.loads(run_cli("config", "--json", cwd=project).stdout)["git"] == {"allowPush": False}
    write(project / "agentbox.yml", "git:\n  allowPush: session\n")
    assert json.loads(run_cli("config", "--json", cwd=project).stdout)["git"] == {"allowPush": "session"}


def test_a_project_file_needs_trust_for_session_and_not_for_false(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "git:\n  allowPush: session\n")
    refused = run_cli("start", cwd=project)
    assert refused.exit_code == 2
    assert ("  - git.allowPush: session (the agent pushes branches under agentbox/<vm>/ with your GitHub login)"
            in refused.stderr)
    assert " trust`" in refused.stderr
    assert limactl.calls() == []
    show = run_cli("trust", "--show", cwd=project)
    assert "allowPush: session" in show.stdout
    assert run_cli("trust", cwd=project).exit_code == 0
    loaded = config.load(project)
    assert trust.is_trusted(loaded) and loaded.scoped_pushes

    write(project / "agentbox.yml", "git:\n  allowPush: false\n")
    assert trust.risky_keys(config.load(project)) == []


def test_the_global_config_sets_it_without_trust(project: Path, home: Path) -> None:
    global_config(home, "git:\n  allowPush: session\n")
    write(project / "agentbox.yml", "")
    loaded = config.load(project)
    assert loaded.scoped_pushes and trust.risky_keys(loaded) == []
    write(project / "agentbox.yml", "git:\n  allowPush: false\n")  # a project may narrow it
    assert not config.load(project).scoped_pushes


def test_remote_write_is_wider_and_wins(project: Path, home: Path) -> None:
    global_config(home, "git:\n  allowPush: session\nsync:\n  remoteWrite: true\n")
    loaded = config.load(project)
    assert loaded.push_scope == "session" and not loaded.scoped_pushes


# -- the broker's process ---------------------------------------------------------------------------------


def _broker_file(project: Path, home: Path, **modes: object) -> None:
    write(home / ".config" / "gh" / "hosts.yml", f"github.com:\n    user: me\n    oauth_token: {REAL_GH}\n")
    request = brokered.request_of(config.load(project))
    assert request is not None
    path = netguard.folder(NAME) / netguard.BROKER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**request.to_json(), **modes}))


def test_brokerd_builds_a_broker_that_keeps_pushes_to_the_vms_branches(project: Path, home: Path) -> None:
    _broker_file(project, home, allowPush=False, pushMode="session")
    broker = process.load(NAME)
    assert broker is not None
    assert broker.push_namespace == NAMESPACE and not broker.allow_push
    assert isinstance(broker.pushes, pushes.Ledger) and broker.pushes.path == pushes.ledger_path(NAME)
    assert broker.push_hint.startswith(f"git.allowPush: session allows only pushes that create a branch under "
                                       f"{BRANCHES} or update one this VM created")
    assert "sync.remoteWrite: true" in broker.push_hint


@pytest.mark.parametrize(("modes", "allow_push"), [
    ({"allowPush": False, "pushMode": "off"}, False),
    ({"allowPush": False}, False),  # a file from before git.allowPush
    ({"allowPush": True, "pushMode": "session"}, True),  # sync.remoteWrite wins
])
def test_brokerd_scopes_no_push_otherwise(project: Path, home: Path, modes: dict[str, object],
                                          allow_push: bool) -> None:
    _broker_file(project, home, **modes)
    broker = process.load(NAME)
    assert broker is not None
    assert broker.push_namespace is None and broker.pushes is None and broker.allow_push is allow_push
    assert broker.push_hint.startswith("sync.remoteWrite: true") and "git.allowPush: session" in broker.push_hint


# -- a launch ---------------------------------------------------------------------------------------------

# In the guest: a bare repository in the workspace stands for GitHub; pushes from a clone, through the guards.
PUSHES = r"""
set -u
cd "$1"
git init -q --bare -b main remote.git
git clone -q remote.git work 2>/dev/null
cd work
git -c user.name=a -c user.email=a@b commit -q --allow-empty -m one
git push -q origin HEAD:main 2>&1; echo "outside: rc=$?"
git push -q origin "HEAD:$2x" 2>&1; echo "inside: rc=$?"
echo "remote has: $(git --git-dir=../remote.git for-each-ref --format='%(refname)')"
"""


def test_a_launch_hands_the_mode_to_the_broker_and_the_guards_keep_pushes_to_the_vms_branches(
        project: Path, vm: FakeLima, home: Path) -> None:
    write(home / ".config" / "gh" / "hosts.yml", f"github.com:\n    user: me\n    oauth_token: {REAL_GH}\n")
    write_trusted(project, "git:\n  allowPush: session\n")
    try:
        result = agentbox(project, "shell", "--", "bash", "-c", PUSHES, "push", str(project), BRANCHES)
        served = json.loads((netguard.folder(NAME) / netguard.BROKER_FILE).read_text())
    finally:
        agentbox(project, "stop")
    assert result.returncode == 0, result.stderr
    assert served["pushMode"] == "session" and served["allowPush"] is False
    shell = next(argv for argv in vm.calls() if "shell" in argv)
    at = shell.index("--guards")
    assert shell[at:at + 4] == ["--guards", "push-scoped", "--push-namespace", NAMESPACE]
    assert (vm.guest_home(NAME) / ".config" / "agentbox" / "push-namespace").read_text() == NAMESPACE + "\n"
    assert f"agentbox:   refs/heads/main: outside {NAMESPACE}\n" in result.stdout
    assert f"push to a branch there instead: `git push origin HEAD:{BRANCHES}NAME`." in result.stdout
    assert "outside: rc=1\ninside: rc=0\n" in result.stdout
    assert result.stdout.endswith(f"remote has: {NAMESPACE}x\n")  # main was never pushed


@pytest.mark.parametrize(("text", "mode"), [
    ("", "on"),
    ("git:\n  allowPush: session\n", "push-scoped"),
    ("git:\n  allowPush: session\nsync:\n  remoteWrite: true\n", "off"),  # remoteWrite is wider and wins
])
def test_the_guards_mode_follows_the_settings(project: Path, home: Path, text: str, mode: str) -> None:
    global_config(home, text)
    assert staging.guards_mode(config.load(project)) == mode


def test_without_the_setting_the_launch_refuses_every_push(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    result = agentbox(project, "shell", "--", "bash", "-c", PUSHES, "push", str(project), BRANCHES)
    assert result.returncode == 0, result.stderr
    shell = next(argv for argv in vm.calls() if "shell" in argv)
    assert shell[shell.index("--guards") + 1] == "on" and "--push-namespace" not in shell
    assert not (vm.guest_home(NAME) / ".config" / "agentbox" / "push-namespace").exists()
    assert "readonly-remote guard" in result.stdout
    assert "outside: rc=1\n" in result.stdout and "inside: rc=1\n" in result.stdout
    assert result.stdout.endswith("remote has: \n")


# -- what the agent is told -------------------------------------------------------------------------------


def test_the_agent_is_told_where_it_may_push(project: Path, limactl: FakeLima, home: Path) -> None:
    global_config(home, "git:\n  allowPush: session\n")
    result = run_cli("describe", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    jsonschema.validate(document, json.loads(context.SCHEMA_FILE.read_text()))
    remote = document["remoteWrite"]
    assert remote["pushes"] == {"scope": "session", "branches": BRANCHES}
    assert remote["allowed"] is False and remote["setting"].startswith("git.allowPush is session")
    assert any(item.startswith(f"git push of any ref outside {BRANCHES}") for item in remote["blocked"])
    assert any("GitHub API writes" in item for item in remote["blocked"])
    assert remote["allowedCommands"][0].startswith(f"git push to a new branch under {BRANCHES}")
    assert "the credential broker reads every push's ref updates" in remote["enforcedBy"]
    block = context.memory_block(document)
    assert f"- Pushes go only to branches under `{BRANCHES}`: create one (`git push origin HEAD:{BRANCHES}NAME`)" \
        in block and "no GitHub API writes" in block
    text = run_cli("describe", cwd=project).stdout
    assert f"only to {BRANCHES}: git.allowPush is session" in text

    global_config(home, "git:\n  allowPush: session\ncredentials:\n  broker: false\n")
    off = json.loads(run_cli("describe", "--json", cwd=project).stdout)["remoteWrite"]
    assert "Nothing on the host checks pushes: the credential broker is off" in off["enforcedBy"]


def test_ask_for_more_names_the_key(project: Path, limactl: FakeLima) -> None:
    document = json.loads(run_cli("describe", "--json", cwd=project).stdout)
    assert document["remoteWrite"]["pushes"] == {"scope": "none", "branches": None}
    change = next(c for c in document["askForMore"]["changes"] if c["key"] == "git.allowPush")
    assert change["projectFileNeedsTrust"].startswith("when `session`")


# -- what the user sees -----------------------------------------------------------------------------------


def _ledger() -> None:
    ledger = pushes.Ledger(NAME)
    ledger.record([(f"{NAMESPACE}fix", ZERO, SHA_A)], "ok")
    ledger.record([("refs/heads/main", SHA_A, SHA_B)], f"refused: refs/heads/main is outside {NAMESPACE}")
    ledger.record([(f"{NAMESPACE}fix", SHA_A, SHA_B), (f"{NAMESPACE}docs", ZERO, SHA_B)], "ok")


def test_status_shows_the_mode_and_what_was_pushed(project: Path, limactl: FakeLima, home: Path) -> None:
    global_config(home, "git:\n  allowPush: session\n")
    _ledger()
    data = json.loads(run_cli("status", "--json", cwd=project).stdout)["pushes"]
    assert {key: data[key] for key in ("mode", "setting", "branches", "checkedOnHost", "pushed", "refused")} == {
        "mode": "session", "setting": "git.allowPush: session", "branches": BRANCHES, "checkedOnHost": True,
        "pushed": 2, "refused": 1}
    assert [entry["outcome"] for entry in data["recent"]] == ["ok", f"refused: refs/heads/main is outside {NAMESPACE}",
                                                              "ok"]
    assert data["recent"][2]["updates"] == [{"ref": f"{NAMESPACE}fix", "old": SHA_A, "new": SHA_B},
                                            {"ref": f"{NAMESPACE}docs", "old": ZERO, "new": SHA_B}]
    text = run_cli("status", cwd=project).stdout.splitlines()
    first = text.index(next(line for line in text if line.startswith("pushes:")))
    when = time.strftime("%Y-%m-%d %H:", time.localtime())  # the ledger's UTC times, shown in local time
    assert text[first] == (f"pushes:    only to branches under {BRANCHES} (git.allowPush: session; checked on the "
                           "host by the credential broker); 2 pushed, 1 refused")
    shown = [line[11:] for line in text[first + 1:first + 5]]
    assert all(line.startswith(when) for line in shown)
    assert [line[18:] for line in shown] == [
        f"{BRANCHES}fix new 1a2b3c4  ok",
        f"main 1a2b3c4..5e6f7a8  refused: refs/heads/main is outside {NAMESPACE}",
        f"{BRANCHES}fix 1a2b3c4..5e6f7a8  ok",
        f"{BRANCHES}docs new 5e6f7a8  ok",
    ]


def test_status_says_pushes_are_refused_by_default(project: Path, limactl: FakeLima) -> None:
    data = json.loads(run_cli("status", "--json", cwd=project).stdout)["pushes"]
    assert data == {"mode": "none", "setting": "sync.remoteWrite: false, git.allowPush: false", "branches": None,
                    "checkedOnHost": False, "pushed": 0, "refused": 0, "recent": []}
    assert "pushes:    refused (sync.remoteWrite: false, git.allowPush: false)" in run_cli("status", cwd=project).stdout


def test_net_log_shows_a_pushs_refs(project: Path, limactl: FakeLima) -> None:
    log = netguard.log_path(NAME)
    log.parent.mkdir(parents=True, exist_ok=True)
    entry = {"time": "2026-11-29T07:40:00Z", "decision": "substitute", "host": "github.com", "port": 443,
             "method": "POST", "path": "/me/repo.git/git-receive-pack", "agent": "gh", "status": 200,
             "pushed": [{"ref": f"{NAMESPACE}fix", "old": ZERO, "new": SHA_A},
                        {"ref": f"{NAMESPACE}docs", "old": SHA_A, "new": SHA_B}]}
    log.write_text(json.dumps(entry) + "\n")
    for args in ((), ("--broker",)):
        result = run_cli("net", "log", *args, cwd=project)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.rstrip("\n").endswith(
            f"github.com:443/me/repo.git/git-receive-pack  gh -> 200  push: {BRANCHES}fix new 1a2b3c4, "
            f"{BRANCHES}docs 1a2b3c4..5e6f7a8")
