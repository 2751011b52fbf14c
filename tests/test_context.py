"""The sandbox described for the agent: /run/agentbox/context.json, the block in its memory files, and
`agentbox describe`, through the CLI against the limactl double's real guest."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agentbox import paths
from agentbox.session import context
from agentbox.vm import provisioning
from tests.helpers import NAME, STUB, FakeLima, needs_bwrap, run_cli, without_once_notes, write, write_trusted

REPO = Path(__file__).resolve().parent.parent
MEMORY_SH = REPO / "provision" / "agent-memory.sh"
SCHEMA = json.loads(context.SCHEMA_FILE.read_text())

CREDENTIAL_SECRET = "cred-secret-4f1d9a"
GH_SECRET = "gho_ghsecret8c2e71"
NETRC_SECRET = "netrc-secret-77b0"
ENV_SECRET = "env-secret-value-d3a5"
SECRETS = (CREDENTIAL_SECRET, GH_SECRET, NETRC_SECRET, ENV_SECRET)


def guest_context(limactl: FakeLima) -> Path:
    return limactl.home / NAME / "guestfs" / "run" / "agentbox" / "context.json"


def started(project: Path, limactl: FakeLima, config: str) -> FakeLima:
    """The project's VM, created with `config` (trusted), with stub agents that report what they got."""
    needs_bwrap()
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n{config}")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    bin_dir = limactl.home / NAME / "guestfs" / "usr-local" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for binary in ("claude", "codex", "gemini", "kiro-cli"):
        (bin_dir / binary).write_text(STUB)
        (bin_dir / binary).chmod(0o755)
    limactl.clear()
    return limactl


def launch(project: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    out = project / ".stub-out.json"
    if out.exists():
        out.unlink()
    result = subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=project, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)
    return result, json.loads(out.read_text()) if out.exists() else {}


def logins(home: Path) -> None:
    write(home / ".claude" / ".credentials.json", json.dumps({"token": CREDENTIAL_SECRET}), mode=0o600)
    write(home / ".config" / "gh" / "hosts.yml", f"github.com:\n    oauth_token: {GH_SECRET}\n", mode=0o600)
    write(home / ".netrc", f"machine example.com login me password {NETRC_SECRET}\n", mode=0o600)
    write(home / ".gitconfig", "[user]\n\tname = Some One\n\temail = one@example.com\n")


def without_probe(document: dict[str, Any]) -> dict[str, Any]:
    """The document as the host built it: what launch.sh found for the tools taken out again."""
    copy = json.loads(json.dumps(document))
    copy["tools"]["checkedInVm"] = False
    for tool in copy["tools"]["list"]:
        tool["path"] = None
    return copy


# -- /run/agentbox/context.json ------------------------------------------------------------------


def test_context_file_validates_matches_the_config_and_holds_no_secret(project: Path, limactl: FakeLima,
                                                                         home: Path) -> None:
    logins(home)
    data_ro = home.parent / "data-ro"
    data_rw = home.parent / "data-rw"
    data_ro.mkdir()
    data_rw.mkdir()
    vm = started(project, limactl, f"  API_TOKEN: {ENV_SECRET}\ncredentials:\n  netrc: true\nmounts:\n"
                                   f"  - location: {data_ro}\n  - location: {data_rw}\n    mountPoint: /mnt/rw\n"
                                   "    writable: true\nagents:\n  mytool:\n    binary: mytool-cli\n")
    result, seen = launch(project, "claude", "-p", "hi")
    assert result.returncode == 0, result.stderr
    assert vm.subcommands() == ["list", "shell"]  # the description costs no limactl call

    installed = guest_context(vm)
    assert stat.S_IMODE(installed.stat().st_mode) == 0o644
    assert seen["env"]["AGENTBOX_CONTEXT_FILE"] == "/run/agentbox/context.json"
    document = json.loads(installed.read_text())
    jsonschema.validate(document, SCHEMA)

    mounts = {(m["guestPath"], m["writable"], m["role"]) for m in document["mounts"]}
    assert mounts == {
        (str(project), True, "workspace"),
        (str(data_ro), False, "mounts"),
        ("/mnt/rw", True, "mounts"),
        (str(context_staging()), False, "staging"),
        (str(paths.vm_outbox(NAME)), True, "outbox"),
    }
    assert {m["hostPath"] for m in document["mounts"] if m["guestPath"] == "/mnt/rw"} == {str(data_rw)}
    assert document["workspace"] == {"path": str(project), "writable": True, "mode": "live",
                                     "meaning": context._MODE_MEANING["live"], "checkpoint": None}
    assert document["vm"]["name"] == NAME and document["vm"]["cpus"] == 4 and document["vm"]["memory"] == 8 << 30
    assert document["remoteWrite"]["allowed"] is False
    assert any("git push" in item for item in document["remoteWrite"]["blocked"])
    assert document["credentials"]["stagedFor"] == "claude"
    # The credential broker stages gh's login as a placeholder version; the claude file here holds no login it
    # knows (so nothing of it goes in); ~/.netrc is staged as it is.
    assert document["credentials"]["files"] == [
        {"path": "~/.config/gh/hosts.yml", "for": "gh"},
        {"path": "~/.netrc", "for": "netrc"},
    ]
    assert document["credentials"]["gitIdentity"] is True
    assert "API_TOKEN" in document["env"]["keys"] and "AGENTBOX_CONTEXT_FILE" in document["env"]["keys"]
    tools = {tool["name"]: tool["path"] for tool in document["tools"]["list"]}
    assert document["tools"]["checkedInVm"] is True
    assert tools["claude"] == "/usr/local/bin/claude"
    assert tools["git"] == in_guest(vm, guest_user_home(vm) / ".local" / "bin" / "git")  # the guard
    assert tools["node"] == "/usr/local/bin/node"
    assert tools["mytool-cli"] is None  # an agent of the config, not installed yet
    assert {"name": "mytool-cli", "from": "agent mytool", "path": None} in document["tools"]["list"]
    assert document["askForMore"]["configFiles"]["local"] == str(project / "agentbox.yml")

    # No value of a login file or of env anywhere agentbox wrote the description or its block.
    written = [installed, context_staging() / "context" / "context.json", context_staging() / "context" / "memory.md",
               guest_user_home(vm) / ".claude" / "CLAUDE.md", guest_user_home(vm) / ".agentbox" / "context.json"]
    for path in written:
        text = path.read_text()
        for secret in SECRETS:
            assert secret not in text, (path, secret)
    described = run_cli("describe", "--json", "--agent", "claude", cwd=project).stdout
    assert not [secret for secret in SECRETS if secret in described]


def context_staging() -> Path:

    return paths.staging_dir(NAME)


def guest_user_home(vm: FakeLima) -> Path:
    return vm.guest_home(NAME)


def in_guest(vm: FakeLima, path: Path) -> str:
    """The path inside the VM of a file in the guest's /home (the double keeps it on the host)."""
    return "/home/" + path.relative_to(vm.home / NAME / "guestfs" / "home").as_posix()


def test_context_file_follows_the_config_at_every_launch(project: Path, limactl: FakeLima) -> None:
    vm = started(project, limactl, "")
    assert launch(project, "shell", "--", "true")[0].returncode == 0
    first = json.loads(guest_context(vm).read_text())
    assert first["remoteWrite"]["allowed"] is False and first["credentials"]["stagedFor"] is None

    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n  ADDED: x\n"
                           "sync:\n  remoteWrite: true\n")
    result, seen = launch(project, "codex")
    assert result.returncode == 0, result.stderr
    document = json.loads(guest_context(vm).read_text())
    jsonschema.validate(document, SCHEMA)
    assert document["remoteWrite"] == {**document["remoteWrite"], "allowed": True, "blocked": [], "instead": None}
    assert "ADDED" in document["env"]["keys"]
    assert document["credentials"]["stagedFor"] == "codex"
    tools = {tool["name"]: tool["path"] for tool in document["tools"]["list"]}
    assert tools["git"] is not None and "/.local/bin/" not in tools["git"]  # the guards are gone
    block = (guest_user_home(vm) / ".claude" / "CLAUDE.md").read_text()
    assert "Remote writes are allowed" in block and "Remote writes are blocked" not in block
    assert seen["env"]["AGENTBOX_CONTEXT_FILE"] == "/run/agentbox/context.json"


def test_the_agent_cannot_rewrite_the_context_file(project: Path, limactl: FakeLima) -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs the tests as root")
        pytest.skip("the double separates guest root from the guest user only when run as root")
    vm = started(project, limactl, "")
    attempt = launch(project, "shell", "--", "sh", "-c", "echo '{}' > /run/agentbox/context.json")[0]
    assert attempt.returncode != 0
    assert json.loads(guest_context(vm).read_text())["schema"] == 1


def test_without_sudo_the_description_is_in_the_guest_home_and_the_launch_says_so(project: Path,
                                                                                    limactl: FakeLima) -> None:
    # The double's sudo reaches guest root through the socket this variable names: pointing it nowhere
    # makes every sudo in the session fail.
    vm = started(project, limactl, "  FAKE_LIMACTL_SUDO: /nonexistent\n")
    result, seen = launch(project, "claude")
    assert result.returncode == 0, result.stderr
    assert "could not write /run/agentbox/context.json (sudo failed)" in result.stderr
    fallback = guest_user_home(vm) / ".agentbox" / "context.json"
    assert seen["env"]["AGENTBOX_CONTEXT_FILE"] == in_guest(vm, fallback)
    jsonschema.validate(json.loads(fallback.read_text()), SCHEMA)
    assert not guest_context(vm).exists()


# -- the block in the agents' memory files ---------------------------------------------------------


def test_memory_block_is_kept_once_around_the_users_text(project: Path, limactl: FakeLima) -> None:
    vm = started(project, limactl, "")
    guest = guest_user_home(vm)
    claude_md = write(guest / ".claude" / "CLAUDE.md", "# My rules\n\nAlways use tabs.\n", mode=0o640)
    broken = "# Gemini notes\n<!-- BEGIN AGENTBOX -->\nhalf a block the user cut\n"
    gemini_md = write(guest / ".gemini" / "GEMINI.md", broken)

    result = launch(project, "claude")[0]
    assert result.returncode == 0, result.stderr
    text = claude_md.read_text()
    assert text.startswith("# My rules\n\nAlways use tabs.\n" + context.BEGIN_MARKER + "\n")
    assert text.endswith(context.END_MARKER + "\n")
    assert text.count("BEGIN AGENTBOX") == 1
    assert "/run/agentbox/context.json" in text and str(project) in text and "enforced on the host" in text
    assert stat.S_IMODE(claude_md.stat().st_mode) == 0o640
    block = (context_staging() / "context" / "memory.md").read_text()
    for memory_file in (".codex/AGENTS.md", ".kiro/steering/agentbox.md"):
        assert (guest / memory_file).read_text() == block, memory_file
    # A file whose markers do not pair up is left as it was, and the launch says so.
    assert gemini_md.read_text() == broken
    assert (f"agentbox: not updating {in_guest(vm, gemini_md)}: its agentbox markers do "
            "not pair up (1 BEGIN AGENTBOX and 0 END AGENTBOX lines)") in result.stderr

    # Launching again changes nothing, byte for byte, and does not rewrite the file; the broken file is
    # named again.
    before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in guest.rglob("*.md")}
    again = launch(project, "codex")[0]
    assert again.returncode == 0
    assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in guest.rglob("*.md")} == before
    assert "GEMINI.md: its agentbox markers do not pair up" in again.stderr

    # The user takes the block out: the next launch puts it back, after their text.
    claude_md.write_text("# My rules\n\nAlways use tabs.\n")
    assert launch(project, "claude")[0].returncode == 0
    assert claude_md.read_text() == "# My rules\n\nAlways use tabs.\n" + block

    # Text the user adds after the block stays after it when the block changes.
    claude_md.write_text(claude_md.read_text() + "\nLater notes.\n")
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\nsync:\n  remoteWrite: true\n")
    assert launch(project, "claude")[0].returncode == 0
    text = claude_md.read_text()
    assert text.count("BEGIN AGENTBOX") == 1 and "Remote writes are allowed" in text
    assert text.startswith("# My rules\n\nAlways use tabs.\n" + context.BEGIN_MARKER)
    assert text.endswith(context.END_MARKER + "\n\nLater notes.\n")


def test_a_launch_with_nothing_changed_touches_nothing(project: Path, limactl: FakeLima) -> None:
    """launch.sh skips the description and the block without starting a process when the staged digests and
    the tools' paths are those of the last launch; a tool that appears is found at the next launch."""
    vm = started(project, limactl, "agents:\n  mytool:\n    binary: mytool-cli\n")
    first = launch(project, "claude")[0]
    # the first launch, with no record yet, is as quiet
    assert (first.returncode, without_once_notes(first.stderr)) == (0, "")
    state = guest_user_home(vm) / ".agentbox"
    watched = [state / "context.json", state / "memory.stamp", guest_context(vm)]
    before = [path.stat().st_mtime_ns for path in watched]
    again = launch(project, "claude")[0]
    assert (again.returncode, again.stderr) == (0, "")
    assert [path.stat().st_mtime_ns for path in watched] == before

    tool = vm.home / NAME / "guestfs" / "usr-local" / "bin" / "mytool-cli"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert launch(project, "claude")[0].returncode == 0
    tools = {t["name"]: t["path"] for t in json.loads(guest_context(vm).read_text())["tools"]["list"]}
    assert tools["mytool-cli"] == "/usr/local/bin/mytool-cli"


def memory_sh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(MEMORY_SH), *args], cwd=tmp_path, capture_output=True, text=True, timeout=30)


BLOCK = f"{context.BEGIN_MARKER}\n## Sandbox\nline\n{context.END_MARKER}\n"


@pytest.fixture
def block(tmp_path: Path) -> Path:
    return write(tmp_path / "block.md", BLOCK)


@pytest.mark.parametrize("user_text", ["", "mine\n", "mine, no final newline", "a\n\n\nb\n\n"],
                         ids=["empty", "text", "no-newline", "blank-lines"])
def test_put_appends_once_and_strip_gives_the_users_text_back(tmp_path: Path, block: Path, user_text: str) -> None:
    target = write(tmp_path / "deep" / "CLAUDE.md", user_text) if user_text else tmp_path / "deep" / "CLAUDE.md"
    assert memory_sh(tmp_path, "put", str(block), str(target)).returncode == 0
    first = target.read_bytes()
    kept = user_text if not user_text or user_text.endswith("\n") else user_text + "\n"
    assert first == (kept + BLOCK).encode()
    assert memory_sh(tmp_path, "put", str(block), str(target)).returncode == 0
    assert target.read_bytes() == first
    stripped = memory_sh(tmp_path, "strip", str(target))
    assert stripped.returncode == 0 and stripped.stdout == kept


def test_put_replaces_the_block_in_place(tmp_path: Path, block: Path) -> None:
    target = write(tmp_path / "AGENTS.md", "before\n<!-- BEGIN AGENTBOX -->  \r\nold\nlines\n<!-- END AGENTBOX -->\t\nafter\n",
                   mode=0o600)
    result = memory_sh(tmp_path, "put", str(block), str(target))
    assert result.returncode == 0 and without_once_notes(result.stderr) == ""
    assert target.read_text() == "before\n" + BLOCK + "after\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("text", [
    "a\n<!-- BEGIN AGENTBOX -->\nb\n",
    "a\n<!-- END AGENTBOX -->\nb\n",
    "<!-- END AGENTBOX -->\nx\n<!-- BEGIN AGENTBOX -->\n",
    f"{BLOCK}mine\n{BLOCK}",
], ids=["begin-only", "end-only", "end-first", "two-blocks"])
def test_put_leaves_a_file_with_broken_markers_alone_and_says_so(tmp_path: Path, block: Path, text: str) -> None:
    broken = write(tmp_path / "GEMINI.md", text)
    other = tmp_path / "steering" / "agentbox.md"
    result = memory_sh(tmp_path, "put", str(block), str(broken), str(other))
    assert result.returncode == 1
    assert broken.read_text() == text
    assert re.fullmatch(rf"agentbox: not updating {re.escape(str(broken))}: its agentbox markers do not pair up "
                        r"\(\d BEGIN AGENTBOX and \d END AGENTBOX lines\); remove the stray marker lines \(or the whole "
                        r"block\) and launch again\n", result.stderr), result.stderr
    assert other.read_text() == BLOCK  # the other files are still kept
    assert memory_sh(tmp_path, "strip", str(broken)).returncode == 1
    assert list(tmp_path.rglob("*.agentbox-*")) == []  # no temporary file left behind


def test_put_does_not_write_through_a_symlink(tmp_path: Path, block: Path) -> None:
    real = write(tmp_path / "elsewhere.md", "theirs\n")
    link = tmp_path / "CLAUDE.md"
    link.symlink_to(real)
    result = memory_sh(tmp_path, "put", str(block), str(link))
    assert result.returncode == 1
    assert real.read_text() == "theirs\n" and link.is_symlink()
    assert "it is a symbolic link" in result.stderr


def test_the_block_says_what_the_issue_asks_for() -> None:
    document = {"vm": {"name": "agentbox-x"}, "workspace": {"path": "/w", "mode": "live"},
                "remoteWrite": {"allowed": False}, "contextFile": context.GUEST_FILE}
    block = context.memory_block(document)
    lines = block.splitlines()
    assert lines[0] == context.BEGIN_MARKER and lines[-1] == context.END_MARKER
    assert "`agentbox-x`" in block and "`/w`, live" in block
    assert "`git push`" in block and "commit in the workspace and tell the user what to push from the host" in block
    assert "/run/agentbox/context.json" in block and "$AGENTBOX_CONTEXT_FILE" in block
    assert "enforced on the host" in block
    assert len(lines) <= 12


# -- agentbox describe --------------------------------------------------------------------------------


def test_describe_prints_the_launched_document_without_asking_lima(project: Path, limactl: FakeLima,
                                                                      home: Path) -> None:
    logins(home)
    vm = started(project, limactl, f"  API_TOKEN: {ENV_SECRET}\n")
    assert launch(project, "claude")[0].returncode == 0
    vm.clear()
    described = run_cli("describe", "--json", "--agent", "claude", cwd=project)
    assert described.exit_code == 0, described.stderr
    assert vm.calls() == []
    document = json.loads(described.stdout)
    jsonschema.validate(document, SCHEMA)
    assert document == without_probe(json.loads(guest_context(vm).read_text()))
    shell_view = json.loads(run_cli("describe", "--json", cwd=project).stdout)
    assert shell_view["credentials"]["stagedFor"] is None


def test_describe_before_any_vm_uses_the_config(project: Path, limactl: FakeLima) -> None:
    write_trusted(project, "vm:\n  cpus: 2\n  memory: 4GiB\n  arch: aarch64\nsync:\n  remoteWrite: true\n")
    result = run_cli("describe", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert limactl.calls() == []
    document = json.loads(result.stdout)
    jsonschema.validate(document, SCHEMA)
    assert {key: document["vm"][key] for key in ("cpus", "memory", "vmType", "arch")} == {
        "cpus": 2, "memory": 4 << 30, "vmType": None, "arch": "aarch64"}
    assert [m["role"] for m in document["mounts"]] == ["workspace", "staging", "outbox"]
    assert document["remoteWrite"]["allowed"] is True
    assert document["tools"]["checkedInVm"] is False


def test_network_lines_follow_vm_lima(project: Path) -> None:
    plain = json.loads(run_cli("describe", "--json", cwd=project).stdout)["network"]
    assert "sets no proxy" in plain["internet"] and plain["sshAgent"].startswith("not forwarded")
    assert plain["changedByConfig"] == []
    write_trusted(project, "vm:\n  lima:\n    propagateProxyEnv: true\n    ssh:\n      forwardAgent: true\n"
                           "    portForwards:\n      - guestPort: 8080\n        hostPort: 9090\n")
    changed = json.loads(run_cli("describe", "--json", cwd=project).stdout)["network"]
    assert "the host's proxy variables are copied in (vm.lima.propagateProxyEnv)" in changed["internet"]
    assert changed["sshAgent"].startswith("forwarded (vm.lima.ssh.forwardAgent)")
    assert changed["changedByConfig"] == ["vm.lima.portForwards"]


def test_describe_text_shows_each_section_and_the_block(project: Path) -> None:
    result = run_cli("describe", cwd=project)
    assert result.exit_code == 0, result.stderr
    for label in ("VM", "Workspace", "Mounts", "Network", "Remote writes", "Logins", "Env keys", "Tools",
                  "Memory files", "Ask for more"):
        assert re.search(rf"^{label} +\S", result.stdout, re.M), label
    assert f"rw  {project}  (workspace)" in result.stdout
    assert "blocked: sync.remoteWrite is false (the default)" in result.stdout
    assert "  " + context.BEGIN_MARKER in result.stdout


def test_describe_refuses_an_unknown_agent(project: Path) -> None:
    result = run_cli("describe", "--agent", "nope", cwd=project)
    assert result.exit_code == 2
    assert "--agent: there is no agent 'nope'" in result.stderr


# -- what the description says agrees with what agentbox does --------------------------------------


def test_the_gh_allowlist_is_the_one_the_guard_prints() -> None:
    guard = (REPO / "wrappers" / "gh").read_text()
    line = re.search(r'"agentbox: allowed: (.*)\." >&2', guard)
    assert line and line.group(1) == context.GH_ALLOWED


def test_the_tools_are_those_the_provisioning_installs() -> None:
    checked = re.search(r"^for tool in (.*); do$", (REPO / "provision" / "50-user-setup.sh").read_text(), re.M)
    assert checked and set(checked.group(1).split()) <= set(context.PROVISIONED_TOOLS)
    packages = re.search(r"^for pkg in (.*); do$", (REPO / "provision" / "10-base-packages.sh").read_text(), re.M)
    assert packages
    commands = {"git": ["git"], "curl": ["curl"], "jq": ["jq"], "build-essential": ["make", "gcc", "g++"],
                "unzip": ["unzip"], "ca-certificates": [], "gnupg": ["gpg"], "tmux": ["tmux"],
                "nftables": []}  # nft: root's, for agentbox's own firewall, not a tool for the agent
    assert set(packages.group(1).split()) == set(commands)
    assert {c for cs in commands.values() for c in cs} <= set(context.PROVISIONED_TOOLS)
    assert set(provisioning.SYSTEM_SCRIPTS) == {"10-base-packages.sh", "20-docker.sh", "30-nodejs.sh",
                                                 "40-github-cli.sh"}


def test_every_field_of_the_schema_is_required_and_described() -> None:
    """A field the code stops writing, or one it adds without describing it, fails validation."""
    def walk(node: dict[str, Any], where: str) -> None:
        properties = node.get("properties")
        if properties:
            assert node.get("additionalProperties") is False, where
            assert set(node.get("required", [])) == set(properties), where
            for name, child in properties.items():
                walk(child, f"{where}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}[]")
    walk(SCHEMA, "$")


@pytest.mark.parametrize("broker", [True, False])
def test_the_agent_is_told_whether_gh_pr_create_reaches_github(project: Path, limactl: FakeLima,
                                                                broker: bool) -> None:
    """With the broker, GitHub writes are refused on the host, `gh pr create` among them: the context must not
    promise it works (without the broker it does, for a branch the user pushed)."""
    write_trusted(project, "" if broker else "credentials:\n  broker: false\n")
    result = run_cli("describe", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    remote = json.loads(result.stdout)["remoteWrite"]
    assert ("`gh pr create` works" in remote["instead"]) is not broker
    assert ("refused on the host" in " ".join(remote["allowedCommands"])) is broker
