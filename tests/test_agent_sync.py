"""The agents' own setup reaches the VM filtered, through the real CLI and the double's real shell (launch.sh runs
in bubblewrap with a guest home): what arrives, what is left out and why (`agentbox sync --show`), edits made in the
VM, the warm launch's cost, bad input on the host, the config keys, and `agentbox sync pull`."""

from __future__ import annotations

import getpass
import io
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, run_cli, write

HOOK_SCRIPT = "bin/notify-me.sh"


def agentbox(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def vm(vm: FakeLima) -> FakeLima:
    """The project's VM, its agents programs that only exit 0 (what matters here is what the launch step did)."""
    bin_dir = vm.home / NAME / "guestfs" / "usr-local" / "bin"
    for binary in ("claude", "codex", "gemini", "kiro-cli"):
        (bin_dir / binary).write_text("#!/bin/sh\nexit 0\n")
    return vm


def launch(project: Path, agent: str = "claude") -> subprocess.CompletedProcess:
    """`agentbox AGENT -p hi`: one launch of that agent, which syncs that agent's own setup."""
    result = agentbox(project, agent, "-p", "hi")
    assert result.returncode == 0, result.stderr
    return result


def claude_home(home: Path) -> None:
    """A host ~/.claude as people have it: skills (one with a script), a subagent, settings with a hook, a status
    line and a host path, and ~/.claude.json with MCP servers of every kind, secrets included."""
    write(home / ".claude" / "CLAUDE.md", "Use tabs.\n")
    write(home / ".claude" / "skills" / "review" / "SKILL.md", "---\nname: review\n---\nReview with care.\n")
    write(home / ".claude" / "skills" / "deploy" / "SKILL.md", f"Run {home}/.claude/skills/deploy/run.sh\n")
    write(home / ".claude" / "skills" / "deploy" / "run.sh", "#!/bin/sh\necho deploying\n", mode=0o755)
    write(home / ".claude" / "agents" / "reviewer.md", "---\nname: reviewer\n---\nYou review.\n")
    write(home / ".claude" / "settings.json", json.dumps({
        "hooks": {"Stop": [{"hooks": [{"type": "command", "command": f"{home}/{HOOK_SCRIPT}"}]}]},
        "statusLine": {"type": "command", "command": f"{home}/.claude/statusline.sh"},
        "permissions": {"allow": ["Bash(npm test)"], "defaultMode": "default",
                        "additionalDirectories": [f"{home}/notes"]},
        "env": {"DISABLE_TELEMETRY": "1"},
        "model": "opus",
    }, indent=2))
    write(home / ".claude.json", json.dumps({
        "hasCompletedOnboarding": True,
        "oauthAccount": {"emailAddress": "ada@example.com"},
        "mcpServers": {
            "local-tool": {"type": "stdio", "command": f"{home}/bin/local-mcp", "args": []},
            "fetcher": {"type": "stdio", "command": "npx", "args": ["-y", "@acme/fetch-mcp"],
                        "env": {"ACME_API_KEY": "sk-acme-secret"}},
            "pythonic": {"type": "stdio", "command": "uvx", "args": ["some-mcp"]},
            "docs": {"type": "http", "url": "https://mcp.example.com/mcp",
                     "headers": {"Authorization": "Bearer http-secret"}},
        },
    }), mode=0o600)


def guest(vm: FakeLima) -> Path:
    return vm.guest_home(NAME)


def inside(guest_home: Path) -> str:
    """The guest home as the VM sees it (/home/USER.guest), from where the double keeps it."""
    return f"/home/{guest_home.name}"


def staged_sync(isolated_env: dict[str, Path]) -> Path:
    return isolated_env["state"] / "vms" / NAME / "staging" / "sync"


def user_text(path: Path) -> str:
    """A memory file in the VM without the block agentbox keeps in it (tests/test_context.py tests the block)."""
    return re.sub(r"<!-- BEGIN AGENTBOX.*?<!-- END AGENTBOX -->\n", "", path.read_text(), flags=re.S)


def all_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


# -- what arrives ----------------------------------------------------------------------------------


def test_the_vm_gets_exactly_the_filtered_claude_setup(project: Path, vm: FakeLima, home: Path,
                                                        isolated_env: dict[str, Path]) -> None:
    claude_home(home)
    launch(project)
    g = guest(vm)
    gh = inside(g)
    assert user_text(g / ".claude" / "CLAUDE.md") == "Use tabs.\n"
    assert (g / ".claude" / "skills" / "review" / "SKILL.md").read_text() == \
        "---\nname: review\n---\nReview with care.\n"
    # A host home path in a skill points to the same file in the VM's home.
    assert (g / ".claude" / "skills" / "deploy" / "SKILL.md").read_text() == \
        f"Run {gh}/.claude/skills/deploy/run.sh\n"
    script = g / ".claude" / "skills" / "deploy" / "run.sh"
    assert script.read_text() == "#!/bin/sh\necho deploying\n" and os.access(script, os.X_OK)
    assert (g / ".claude" / "agents" / "reviewer.md").read_text() == "---\nname: reviewer\n---\nYou review.\n"

    settings = json.loads((g / ".claude" / "settings.json").read_text())
    assert settings == {
        "permissions": {"allow": ["Bash(npm test)"], "defaultMode": "bypassPermissions",
                        "additionalDirectories": [f"{gh}/notes"]},
        "env": {"DISABLE_TELEMETRY": "1"},
        "model": "opus",
        "skipDangerousModePermissionPrompt": True,
    }
    state = json.loads((g / ".claude.json").read_text())
    assert state["oauthAccount"] == {"emailAddress": "ada@example.com"}
    assert state["mcpServers"] == {
        "fetcher": {"type": "stdio", "command": "npx", "args": ["-y", "@acme/fetch-mcp"], "env": {"ACME_API_KEY": ""}},
        "docs": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": ""}},
    }
    # No secret and no hook reaches the VM, not even the read-only staging folder.
    for folder in (g, isolated_env["state"] / "vms" / NAME / "staging"):
        text = all_text(folder)
        assert "sk-acme-secret" not in text and "http-secret" not in text and HOOK_SCRIPT not in text

    shown = agentbox(project, "sync", "--show", "claude")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"claude: ~/.claude -> {gh}/.claude in the VM {NAME}"
    for line in (
        "  copy  ~/.claude/CLAUDE.md (10 bytes)",
        "  drop  ~/.claude/settings.json hooks: hooks run programs (usually from your host's paths) on the agent's "
        "every step; agentbox never syncs them",
        "  drop  ~/.claude/settings.json statusLine: it runs a program to draw the status line",
        '  edit  ~/.claude/settings.json permissions.defaultMode: "default" -> "bypassPermissions": approvals are '
        "off in the VM (the VM is the sandbox)",
        f"  drop  ~/.claude.json mcpServers.local-tool: its command {home}/bin/local-mcp is a path on your host, "
        "which the VM does not have",
        "  edit  ~/.claude.json mcpServers.fetcher.env: values left out, names kept (ACME_API_KEY); "
        "agents.claude.sync.mcpSecrets: true brings them",
        "  keep  ~/.claude.json mcpServers.docs: a remote (http/sse) server",
        "  edit  ~/.claude.json mcpServers.docs.headers: values left out, names kept (Authorization); "
        "agents.claude.sync.mcpSecrets: true brings them",
    ):
        assert line in lines, "\n".join(lines)
    assert any(line.startswith("  copy  ~/.claude/skills/ (3 files, ") and line.endswith(": deploy, review)")
               for line in lines), lines
    assert any(line.startswith("  drop  ~/.claude.json mcpServers.pythonic: its command uvx is not installed "
                               "in agentbox's VM") for line in lines), lines


def test_mcp_secrets_true_brings_the_values(project: Path, vm: FakeLima, home: Path) -> None:
    claude_home(home)
    write(home / ".config" / "agentbox" / "config.yml", "agents:\n  claude:\n    sync:\n      mcpSecrets: true\n")
    launch(project)
    servers = json.loads((guest(vm) / ".claude.json").read_text())["mcpServers"]
    assert servers["fetcher"]["env"] == {"ACME_API_KEY": "sk-acme-secret"}
    assert servers["docs"]["headers"] == {"Authorization": "Bearer http-secret"}


def test_host_paths_in_a_mounted_folder_stay_as_they_are(home: Path, limactl: FakeLima) -> None:
    """A path under the home folder becomes the VM home's, except in a folder the VM mounts (here the workspace)."""
    from tests.conftest import needs_bwrap

    needs_bwrap()
    project = home / "code" / "proj"
    write(project / "agentbox.yml", "")
    write(home / ".claude" / "settings.json", json.dumps(
        {"permissions": {"additionalDirectories": [f"{project}/docs", f"{home}/notes", f"{home}/codex"]}}))
    assert run_cli("start", cwd=project).exit_code == 0
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0, result.stderr
    gh = inside(limactl.guest_home("agentbox-proj"))
    settings = json.loads((limactl.guest_home("agentbox-proj") / ".claude" / "settings.json").read_text())
    assert settings["permissions"]["additionalDirectories"] == [f"{project}/docs", f"{gh}/notes", f"{gh}/codex"]


def test_codex_config_is_filtered_and_keeps_approvals_off(project: Path, vm: FakeLima, home: Path) -> None:
    write(home / ".codex" / "config.toml", f"""# my codex
model = "gpt-5"
notify = ["python3", "{home}/bin/notify.py"]
approval_policy = "on-request"

[mcp_servers.fetch]
command = "npx"
args = ["-y", "fetch-mcp"]
env = {{ TOKEN = "codex-secret" }}

[mcp_servers.mine]
command = "{home}/bin/my-mcp"

[mcp_servers.remote]
url = "https://mcp.example.com/mcp"
bearer_token = "bearer-secret"

[projects."{project}"]
trust_level = "trusted"
""")
    write(home / ".codex" / "prompts" / "fix.md", "Fix it.\n")
    launch(project, "codex")
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    g = guest(vm)
    config = tomllib.loads((g / ".codex" / "config.toml").read_text())
    assert config == {
        "model": "gpt-5",
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "mcp_servers": {"fetch": {"command": "npx", "args": ["-y", "fetch-mcp"], "env": {"TOKEN": ""}},
                        "remote": {"url": "https://mcp.example.com/mcp"}},
        "projects": {str(project): {"trust_level": "trusted"}},
    }
    assert (g / ".codex" / "prompts" / "fix.md").read_text() == "Fix it.\n"
    shown = agentbox(project, "sync", "--show", "codex").stdout
    assert "  drop  ~/.codex/config.toml notify: it runs a program after each turn\n" in shown
    assert "  drop  ~/.codex/config.toml mcp_servers.remote.bearer_token: a credential; " \
           "agents.codex.sync.mcpSecrets: true brings it\n" in shown


def test_gemini_and_kiro_settings_are_filtered(project: Path, vm: FakeLima, home: Path) -> None:
    write(home / ".gemini" / "settings.json", """{
  // Gemini CLI allows comments
  "hooks": {"BeforeTool": [{"command": "/opt/hooks/check"}]},
  "tools": {"discoveryCommand": "/opt/bin/discover", "sandbox": false},
  "mcpServers": {"gh": {"httpUrl": "https://api.example.com/mcp", "headers": {"X-Key": "gem-secret"}},
                 "local": {"command": "/usr/local/bin/my-server"}},
  "security": {"auth": {"selectedType": "gemini-api-key"}}
}
""")
    write(home / ".gemini" / "commands" / "plan.toml", 'prompt = "Plan it"\n')
    write(home / ".kiro" / "agents" / "dev.json", json.dumps(
        {"name": "dev", "hooks": {"agentSpawn": [{"command": "/opt/x"}]}, "mcpServers": {}, "tools": ["*"]}))
    write(home / ".kiro" / "steering" / "style.md", "Short names.\n")
    assert agentbox(project, "shell", "--", "true").returncode == 0
    g = guest(vm)
    assert json.loads((g / ".gemini" / "settings.json").read_text()) == {
        "tools": {"sandbox": False},
        "mcpServers": {"gh": {"httpUrl": "https://api.example.com/mcp", "headers": {"X-Key": ""}}},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
    }
    assert (g / ".gemini" / "commands" / "plan.toml").read_text() == 'prompt = "Plan it"\n'
    assert json.loads((g / ".kiro" / "agents" / "dev.json").read_text()) == {"name": "dev", "mcpServers": {},
                                                                             "tools": ["*"]}
    assert (g / ".kiro" / "steering" / "style.md").read_text() == "Short names.\n"


def test_sync_show_json_carries_every_line_the_text_shows(project: Path, limactl: FakeLima, home: Path) -> None:
    """`sync --show --json` is the text's facts as data: one record per agent, one entry per line, in its order."""
    claude_home(home)
    write(home / ".claude" / "skills" / "red\x1b[31m" / "SKILL.md", "x\n")  # shown escaped, as in the text
    write(home / ".codex" / "prompts" / "fix.md", "Fix it.\n")
    write(home / ".codex" / "prompts" / "test.md", "Test it.\n")
    text = run_cli("sync", "--show", cwd=project)
    shown = run_cli("sync", "--show", "--json", cwd=project)
    assert text.exit_code == 0 and shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["agentConfig"] is True and data["loginFiles"] == []
    agents = {record["agent"]: record for record in data["agents"]}
    assert {"claude", "codex", "gemini"} <= set(agents)
    gh = f"/home/{getpass.getuser()}.guest"
    claude, codex = agents["claude"], agents["codex"]
    assert {key: claude[key] for key in ("vm", "folder", "guestFolder", "onHost")} == {
        "vm": NAME, "folder": "~/.claude", "guestFolder": f"{gh}/.claude", "onHost": True}
    entries = claude["entries"]
    assert entries[0] == {"action": "copy", "path": "~/.claude/CLAUDE.md", "where": None, "why": None,
                          "files": 1, "bytes": 10, "names": None}
    skills = next(entry for entry in entries if entry["path"] == "~/.claude/skills/")
    assert (skills["action"], skills["files"], skills["names"]) == ("copy", 3, ["deploy", "review"])
    assert {"action": "drop", "path": "~/.claude/skills/red\\x1b[31m", "where": None,
            "why": "its name has control characters or is not UTF-8", "files": None, "bytes": None,
            "names": None} in entries
    assert {"action": "drop", "path": "~/.claude/settings.json", "where": "statusLine",
            "why": "it runs a program to draw the status line", "files": None, "bytes": None, "names": None} in entries
    assert {"action": "edit", "path": "~/.claude.json", "where": "mcpServers.fetcher.env",
            "why": "values left out, names kept (ACME_API_KEY); agents.claude.sync.mcpSecrets: true brings them",
            "files": None, "bytes": None, "names": None} in entries
    assert codex["entries"] == [{"action": "copy", "path": "~/.codex/prompts/", "where": None, "why": None,
                                 "files": 2, "bytes": 17, "names": ["fix.md", "test.md"]}]
    assert agents["gemini"]["onHost"] is False and agents["gemini"]["entries"] == []
    # Every line of the text is one fact of the JSON, in the same order.
    lines = iter(text.stdout.splitlines())
    for record in data["agents"]:
        assert next(lines) == f"{record['agent']}: {record['folder']} -> {record['guestFolder']} in the VM {NAME}"
        if not record["onHost"]:
            assert next(lines) == f"  (no {record['folder']} on this host: nothing to bring)"
        for entry in record["entries"]:
            line = next(lines)
            assert line.startswith(f"  {entry['action']}  {entry['path']}"), line
            if entry["action"] == "copy":
                assert f"{entry['bytes']:,} bytes" in line and (entry["names"] is None or f"{entry['files']} file" in line)
            else:
                assert line.endswith(f"{' ' + entry['where'] if entry['where'] else ''}: {entry['why']}"), line
    assert next(lines, None) is None


def test_sync_show_json_with_agent_config_off_and_beside_a_sub_command(project: Path, limactl: FakeLima,
                                                                      home: Path) -> None:
    claude_home(home)
    write(project / "agentbox.yml", "sync:\n  agentConfig: false\n")
    shown = run_cli("sync", "--json", cwd=project)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {"agentConfig": False, "loginFiles": ["~/.claude.json"], "agents": []}
    refused = run_cli("sync", "--json", "pull", "claude", cwd=project)
    assert refused.exit_code == 2 and "--json and a sub-command do not go together" in refused.stderr


# -- edits in the VM ---------------------------------------------------------------------------------


def test_an_edit_in_the_vm_survives_and_the_launch_names_the_waiting_host_version(
        project: Path, vm: FakeLima, home: Path, isolated_env: dict[str, Path]) -> None:
    write(home / ".claude" / "CLAUDE.md", "host v1\n")
    write(home / ".claude" / "agents" / "a.md", "agent v1\n")
    launch(project)
    memory = guest(vm) / ".claude" / "CLAUDE.md"
    assert user_text(memory) == "host v1\n"
    memory.write_text("edited in the VM\n")

    result = launch(project)  # the host's copy has not changed: the VM's edit stays, nothing to say
    assert user_text(memory) == "edited in the VM\n"
    assert "kept" not in result.stderr

    write(home / ".claude" / "CLAUDE.md", "host v2\n")
    write(home / ".claude" / "agents" / "a.md", "agent v2\n")
    result = launch(project)
    assert user_text(memory) == "edited in the VM\n"
    assert (guest(vm) / ".claude" / "agents" / "a.md").read_text() == "agent v2\n"  # unedited: updated
    waiting = staged_sync(isolated_env) / "memory-files" / "home"
    assert (f"agentbox: kept ~/.claude/CLAUDE.md as changed in this VM; the host's newer version waits in {waiting} "
            "(delete the VM's copy to take it at the next launch)") in result.stderr.splitlines()
    assert (waiting / ".claude" / "CLAUDE.md").read_text() == "host v2\n"

    again = launch(project)  # said once per host version
    assert "kept" not in again.stderr and user_text(memory) == "edited in the VM\n"

    memory.unlink()
    launch(project)
    assert user_text(memory) == "host v2\n"


def test_a_file_gone_from_the_host_leaves_the_vm_unless_edited_there(project: Path, vm: FakeLima,
                                                                     home: Path) -> None:
    write(home / ".claude" / "skills" / "old" / "SKILL.md", "old\n")
    write(home / ".claude" / "skills" / "mine" / "SKILL.md", "mine\n")
    launch(project)
    skills = guest(vm) / ".claude" / "skills"
    (skills / "mine" / "SKILL.md").write_text("changed in the VM\n")
    (home / ".claude" / "skills" / "old" / "SKILL.md").unlink()
    (home / ".claude" / "skills" / "mine" / "SKILL.md").unlink()
    launch(project)
    assert not (skills / "old").exists()
    assert (skills / "mine" / "SKILL.md").read_text() == "changed in the VM\n"


def test_a_new_vm_takes_the_host_settings_over_the_ones_it_was_created_with(project: Path, vm: FakeLima,
                                                                          home: Path) -> None:
    """Provisioning writes settings into a new VM; they are agentbox's, so the first sync replaces them. An
    existing VM copy that is neither agentbox's nor the host's is the user's: kept."""
    g = guest(vm)
    assert json.loads((g / ".claude" / "settings.json").read_text())["permissions"] == {
        "defaultMode": "bypassPermissions"}
    write(home / ".claude" / "settings.json", '{"model": "opus"}')
    write(home / ".codex" / "config.toml", 'model = "gpt-5"\n')
    write(g / ".gemini" / "settings.json", '{"mine": true}\n')
    write(home / ".gemini" / "settings.json", '{"theirs": true}\n')
    result = agentbox(project, "shell", "--", "true")
    assert result.returncode == 0
    assert json.loads((g / ".claude" / "settings.json").read_text())["model"] == "opus"
    assert (g / ".codex" / "config.toml").read_text().startswith('model = "gpt-5"\n')
    assert json.loads((g / ".gemini" / "settings.json").read_text()) == {"mine": True}
    assert "kept ~/.gemini/settings.json as changed in this VM" in result.stderr


def test_what_is_in_the_way_in_the_vm_does_not_stop_the_session(project: Path, vm: FakeLima, home: Path) -> None:
    """A folder in the VM where a synced file goes is kept (and named); a file where a synced folder goes makes
    the copy fail: the launch says so, starts the agent anyway, and tries again next time."""
    write(home / ".claude" / "CLAUDE.md", "memory\n")
    write(home / ".claude" / "agents" / "a.md", "agent\n")
    write(home / ".claude" / "skills" / "x" / "SKILL.md", "skill\n")
    g = guest(vm) / ".claude"
    (g / "agents" / "a.md").mkdir(parents=True)
    write(g / "skills", "a file where a folder goes\n")
    result = launch(project)
    assert "agentbox: could not bring all of claude's own setup into the VM (see above); the next launch tries " \
           "again" in result.stderr.splitlines()
    assert "kept ~/.claude/agents/a.md as changed in this VM" in result.stderr
    assert user_text(g / "CLAUDE.md") == "memory\n"
    (g / "skills").unlink()
    again = launch(project)
    assert "could not bring" not in again.stderr
    assert (g / "skills" / "x" / "SKILL.md").read_text() == "skill\n"
    assert (g / "agents" / "a.md").is_dir()


# -- speed ---------------------------------------------------------------------------------------------


def test_an_unchanged_warm_launch_makes_one_call_and_rewrites_nothing(project: Path, vm: FakeLima, home: Path,
                                                                        isolated_env: dict[str, Path]) -> None:
    for index in range(200):
        write(home / ".claude" / "skills" / f"s{index // 10}" / f"f{index}.md", f"skill file {index}\n")
    write(home / ".claude.json", json.dumps({"mcpServers": {"x": {"command": "npx", "env": {"K": "secret"}}}}))
    launch(project)
    assert len(list((guest(vm) / ".claude" / "skills").rglob("*.md"))) == 200
    assert json.loads((guest(vm) / ".claude.json").read_text())["mcpServers"]["x"]["env"] == {"K": ""}
    time.sleep(1.2)  # past the racy-clean second: the next launch hashes once more, then trusts the stat
    launch(project)
    folder = staged_sync(isolated_env)
    creds = folder.parent / "creds"  # ~/.claude.json, staged through its filter, is not made again either
    records = guest(vm) / ".agentbox" / "sync" / "claude"
    before = {p: p.stat().st_mtime_ns for root in (folder, creds, records) for p in [root, *root.rglob("*")]}
    guest_files = {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in (guest(vm) / ".claude").rglob("*.md")}
    vm.clear()
    result = launch(project)
    assert vm.subcommands() == ["shell"]
    assert "agentbox: warning" not in result.stderr
    after = {p: p.stat().st_mtime_ns for root in (folder, creds, records) for p in [root, *root.rglob("*")]}
    assert after == before
    assert {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in guest_files} == guest_files


# -- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("agent", "path", "text", "reason"), [
    ("claude", ".claude/settings.json", '{"model": "opus",}',
     "it is not valid JSON (Expecting property name enclosed in double quotes at line 1 column 18)"),
    ("claude", ".claude/settings.json", "[1, 2]", "it is not a JSON object ({...})"),
    ("codex", ".codex/config.toml", 'model = "gpt-5"\nmodel = "again"\n',
     "it is not valid TOML (Cannot overwrite a value (at line 2, column 16))"),
])
def test_a_malformed_settings_file_is_skipped_with_the_reason_and_the_launch_goes_on(
        project: Path, vm: FakeLima, home: Path, agent: str, path: str, text: str, reason: str) -> None:
    folder = path.split("/")[0]
    write(home / path, text)
    write(home / folder / "skills" / "s" / "SKILL.md", "still synced\n")
    created_with = (guest(vm) / path).read_text()
    result = launch(project, agent)
    assert f"agentbox: warning: ~/{path}: {reason}; it was not brought into the VM" in result.stderr.splitlines()
    assert (guest(vm) / path).read_text() == created_with
    assert (guest(vm) / folder / "skills" / "s" / "SKILL.md").read_text() == "still synced\n"
    shown = agentbox(project, "sync", "--show", agent).stdout
    assert f"  drop  ~/{path}: {reason} (the launch goes on without it)\n" in shown


def test_symlinks_out_of_the_agent_folder_are_not_followed(project: Path, vm: FakeLima, home: Path,
                                                           tmp_path: Path) -> None:
    secret = write(home / ".ssh" / "id_ed25519", "PRIVATE KEY\n")
    outside = write(tmp_path / "shared-skills" / "shared" / "SKILL.md", "shared skill\n").parent
    skills = home / ".claude" / "skills"
    write(skills / "own" / "SKILL.md", "own skill\n")
    write(home / ".claude" / "agents" / "helper.md", "helper\n")
    (skills / "key.md").symlink_to(secret)
    (skills / "shared").symlink_to(outside)
    (skills / "helpers").symlink_to(home / ".claude" / "agents")  # inside ~/.claude: followed
    os.mkfifo(skills / "pipe")
    launch(project)
    g = guest(vm) / ".claude" / "skills"
    assert sorted(p.relative_to(g).as_posix() for p in g.rglob("*") if p.is_file()) == [
        "helpers/helper.md", "own/SKILL.md"]
    assert "PRIVATE KEY" not in all_text(guest(vm))
    shown = agentbox(project, "sync", "--show", "claude").stdout.splitlines()
    assert f"  drop  ~/.claude/skills/key.md: a symlink to {secret}, outside ~/.claude: not followed" in shown
    assert f"  drop  ~/.claude/skills/shared: a symlink to {outside}, outside ~/.claude: not followed" in shown
    assert "  drop  ~/.claude/skills/pipe: not a regular file (a FIFO, socket or device)" in shown


def test_a_50_mb_plugins_folder_is_synced_once_then_skipped_while_unchanged(
        project: Path, vm: FakeLima, home: Path, isolated_env: dict[str, Path]) -> None:
    from tests.test_session_setup import launch_in_process, watch_opens

    blob = write(home / ".claude" / "plugins" / "cache" / "big" / "1.0" / "blob.bin", "")
    blob.write_bytes(os.urandom(50 * 1024 * 1024))
    write(home / ".claude" / "plugins" / "installed_plugins.json",
          json.dumps({"big": {"installPath": f"{home}/.claude/plugins/cache/big/1.0"}}))
    assert launch_in_process(project) == 0
    copy = guest(vm) / ".claude" / "plugins" / "cache" / "big" / "1.0" / "blob.bin"
    assert copy.read_bytes() == blob.read_bytes()
    installed = json.loads((guest(vm) / ".claude" / "plugins" / "installed_plugins.json").read_text())
    assert installed == {"big": {"installPath": f"{inside(guest(vm))}/.claude/plugins/cache/big/1.0"}}
    time.sleep(1.2)
    assert launch_in_process(project) == 0  # hashed once more: the first hashing was racy
    staged = staged_sync(isolated_env) / "claude" / "home" / ".claude" / "plugins" / "cache" / "big" / "1.0" / "blob.bin"
    marks = (staged.stat().st_mtime_ns, copy.stat().st_mtime_ns, copy.stat().st_ino)
    opened: list[str] = []
    watch_opens(str(blob), opened)
    assert launch_in_process(project) == 0
    assert opened == [], "the unchanged 50 MB file was read again"
    assert (staged.stat().st_mtime_ns, copy.stat().st_mtime_ns, copy.stat().st_ino) == marks


# -- config ----------------------------------------------------------------------------------------------


def test_sync_agent_config_false_brings_nothing_and_no_mcp_servers(project: Path, vm: FakeLima,
                                                                    home: Path) -> None:
    claude_home(home)
    write(project / "agentbox.yml", "sync:\n  agentConfig: false\n")  # narrowing: no trust needed
    launch(project)
    assert not (guest(vm) / ".claude" / "skills").exists()
    state = json.loads((guest(vm) / ".claude.json").read_text())
    assert "mcpServers" not in state and state["oauthAccount"] == {"emailAddress": "ada@example.com"}
    assert agentbox(project, "sync", "--show").stdout.startswith("sync.agentConfig is false")


def test_include_and_exclude(project: Path, vm: FakeLima, home: Path) -> None:
    claude_home(home)
    write(home / ".claude" / "keybindings.json", '{"ctrl+k": "clear"}')
    write(home / ".claude" / "history.jsonl", '{"prompt": "secret plans"}\n')
    write(home / ".config" / "agentbox" / "config.yml",
          "agents:\n  claude:\n    sync:\n      include: [keybindings.json, history.jsonl]\n"
          "      exclude: [skills/deploy]\n")
    write(project / "agentbox.yml", "agents:\n  claude:\n    sync:\n      exclude: ['agents/*.md']\n")
    launch(project)
    g = guest(vm) / ".claude"
    assert (g / "keybindings.json").read_text() == '{"ctrl+k": "clear"}'
    assert not (g / "history.jsonl").exists()
    assert not (g / "skills" / "deploy").exists() and (g / "skills" / "review" / "SKILL.md").exists()
    assert not (g / "agents" / "reviewer.md").exists()  # the local file excluded more; global excludes still hold
    shown = agentbox(project, "sync", "--show", "claude").stdout.splitlines()
    assert "  drop  ~/.claude/skills/deploy: left out by sync.exclude" in shown
    assert ("  drop  ~/.claude/history.jsonl: credentials, history, sessions, caches, logs and databases stay on "
            "the host (sync.include cannot bring them)") in shown


@pytest.mark.parametrize(("text", "needs_trust"), [
    ("agents:\n  claude:\n    sync:\n      include: [keybindings.json]\n",
     "agents.claude.sync.include: keybindings.json (brings more host files into the VM)"),
    ("agents:\n  claude:\n    sync:\n      mcpSecrets: true\n",
     "agents.claude.sync.mcpSecrets: true (brings the secrets of its MCP servers (env and header values) into "
     "the VM)"),
    ("sync:\n  agentConfig: true\n",
     "sync.agentConfig: true (brings the agents' own setup from your home into the VM, which the global config "
     "turns off)"),
    ("agents:\n  claude:\n    sync:\n      exclude: [skills]\n      mcpSecrets: false\n", None),
    ("sync:\n  agentConfig: false\n", None),
])
def test_a_project_file_may_only_narrow_what_is_synced(project: Path, limactl: FakeLima, home: Path, text: str,
                                                       needs_trust: str | None) -> None:
    write(home / ".config" / "agentbox" / "config.yml", "sync:\n  agentConfig: false\n")
    write(project / "agentbox.yml", text)
    result = run_cli("start", cwd=project)
    if needs_trust is None:
        assert "needs" not in result.stderr and "trust" not in result.stderr, result.stderr
        return
    assert result.exit_code == 2
    assert f"  - {needs_trust}" in result.stderr.splitlines()
    assert limactl.subcommands() == []


def test_a_global_file_that_allows_it_makes_the_same_local_keys_need_no_trust(project: Path, limactl: FakeLima,
                                                                              home: Path) -> None:
    write(home / ".config" / "agentbox" / "config.yml",
          "agents:\n  claude:\n    sync:\n      include: [keybindings.json]\n      mcpSecrets: true\n")
    write(project / "agentbox.yml", "agents:\n  claude:\n    sync:\n      include: [keybindings.json]\n"
                                    "      mcpSecrets: true\nsync:\n  agentConfig: true\n")
    from agentbox.config import load as config
    from agentbox.config import trust

    assert trust.risky_keys(config.load(project)) == []


def test_sync_paths_must_stay_in_the_agent_folder(project: Path) -> None:
    write(project / "agentbox.yml", "agents:\n  claude:\n    sync:\n      exclude: [skills, ../.ssh]\n")
    result = run_cli("config", cwd=project)
    assert result.exit_code == 2
    assert (f"{project / 'agentbox.yml'}:4:25: agents.claude.sync.exclude[1]: '../.ssh' must be a path or glob "
            "inside ~/.claude (relative, without ..)") in result.stderr


# -- sync pull ---------------------------------------------------------------------------------------------


def test_sync_pull_copies_new_files_back_after_listing_them(project: Path, vm: FakeLima, home: Path) -> None:
    write(home / ".claude" / "agents" / "shared.md", "host version\n")
    launch(project)
    g = guest(vm) / ".claude"
    write(g / "skills" / "made-in-vm" / "SKILL.md", "---\nname: made-in-vm\n---\nDo it.\n")
    write(g / "skills" / "made-in-vm" / "tool.sh", "#!/bin/sh\n", mode=0o755)
    write(g / "agents" / "shared.md", "changed in the VM\n")
    write(g / "agents" / "hooky.md", "---\nname: hooky\nhooks:\n  Stop: []\n---\nx\n")
    write(g / "commands" / "go.md", "Go.\n")
    write(g / "settings.json", '{"hooks": {"Stop": []}}')
    (g / "skills" / "passwd").symlink_to("/etc/passwd")

    vm.clear()
    dry = agentbox(project, "sync", "pull", "claude", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert vm.subcommands() == ["list", "shell"]
    assert sorted(dry.stdout.splitlines()) == [
        "skip  ~/.claude/agents/hooky.md: its front matter defines `hooks`, which would run programs on your host",
        "skip  ~/.claude/agents/shared.md: your host has a different file there, which is kept",
        "skip  ~/.claude/skills/passwd: a link: only regular files are copied",
        "would copy  ~/.claude/commands/go.md (4 bytes)",
        "would copy  ~/.claude/skills/made-in-vm/SKILL.md (32 bytes)",
        "would copy  ~/.claude/skills/made-in-vm/tool.sh (10 bytes)",
    ]
    assert not (home / ".claude" / "skills").exists()

    result = agentbox(project, "sync", "pull", "claude")
    assert result.returncode == 0, result.stderr
    assert (home / ".claude" / "skills" / "made-in-vm" / "SKILL.md").read_text() == \
        "---\nname: made-in-vm\n---\nDo it.\n"
    tool = home / ".claude" / "skills" / "made-in-vm" / "tool.sh"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o644
    assert (home / ".claude" / "commands" / "go.md").read_text() == "Go.\n"
    assert (home / ".claude" / "agents" / "shared.md").read_text() == "host version\n"
    assert not (home / ".claude" / "agents" / "hooky.md").exists()
    assert not (home / ".claude" / "settings.json").exists()
    assert "copied 3 file(s) from the VM agentbox-myproject" in result.stderr

    again = agentbox(project, "sync", "pull", "claude")
    assert "nothing new in" in again.stderr and "copy  " not in again.stdout


def test_sync_pull_refuses_what_a_hostile_vm_sends(project: Path, vm: FakeLima, home: Path, tmp_path: Path) -> None:
    """The VM's tar is replaced by one that tries every trick; only the plain new file lands, inside ~/.claude."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as archive:
        def add(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.linkname = kind, len(data) if kind == tarfile.REGTYPE else 0, link
            archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add(".claude/skills/ok/SKILL.md", b"fine\n")
        add("../escape.txt")
        add("/etc/evil")
        add(".claude/skills/../../.bashrc")
        add(".claude/settings.json", b'{"hooks": {}}')
        add(".claude/skills/link", kind=tarfile.SYMTYPE, link="/etc/passwd")
        add(".claude/skills/hard", kind=tarfile.LNKTYPE, link=".claude/skills/ok/SKILL.md")
        add(".claude/skills/big.bin", b"\0" * (16 * 1024 * 1024 + 1))
        add(".claude/skills/esc\x1b[2Jape.md")
    payload = project / "hostile.tar"  # the workspace: the VM sees it at the same path
    payload.write_bytes(stream.getvalue())
    fake_tar = vm.home / NAME / "guestfs" / "usr-local" / "bin" / "tar"
    fake_tar.write_text(f"#!/bin/sh\ncat {payload}\n")
    fake_tar.chmod(0o755)
    (guest(vm) / ".claude" / "skills").mkdir(parents=True)
    (home / ".bashrc").write_text("mine\n")

    result = agentbox(project, "sync", "pull", "claude")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "copy  ~/.claude/skills/ok/SKILL.md (5 bytes)",
        "skip  ~/../escape.txt: a path outside the agent's folders",
        "skip  ~//etc/evil: a path outside the agent's folders",
        "skip  ~/.claude/skills/../../.bashrc: a path outside the agent's folders",
        "skip  ~/.claude/settings.json: not in the folders `sync pull` brings back",
        "skip  ~/.claude/skills/link: a link: only regular files are copied",
        "skip  ~/.claude/skills/hard: a link: only regular files are copied",
        "skip  ~/.claude/skills/big.bin: larger than 16 MiB",
        "skip  ~/.claude/skills/esc\\x1b[2Jape.md: its name has control characters",
    ]
    assert (home / ".bashrc").read_text() == "mine\n"
    assert not (tmp_path.parent / "escape.txt").exists() and not (home.parent / "escape.txt").exists()
    assert sorted(p.relative_to(home).as_posix() for p in (home / ".claude").rglob("*") if p.is_file()) == [
        ".claude/skills/ok/SKILL.md"]


def test_sync_pull_never_writes_through_a_link_out_of_the_agent_folder(project: Path, vm: FakeLima, home: Path,
                                                                       tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write(home / ".claude" / "skills" / ".keep", "")
    (home / ".claude" / "skills" / "x").symlink_to(elsewhere)
    launch(project)
    write(guest(vm) / ".claude" / "skills" / "x" / "SKILL.md", "planted\n")
    result = agentbox(project, "sync", "pull", "claude")
    assert result.returncode == 0, result.stderr
    assert list(elsewhere.iterdir()) == []
    assert f"skip  ~/.claude/skills/x/SKILL.md: {home}/.claude/skills/x leads to {elsewhere}, outside the agent's " \
           "folder" in result.stdout.splitlines()


def test_sync_pull_keeps_every_spelling_of_hooks_and_mcp_servers_in_the_vm(project: Path, vm: FakeLima,
                                                                          home: Path) -> None:
    """Front matter and JSON are parsed, not searched: no quoting, indenting, flow style, case or nesting gets a
    hook or an MCP server to the host; a front matter that does not parse stays too. The control is pulled."""
    launch(project)
    g = guest(vm)
    files = {
        ".claude/agents/quoted.md": '---\n"hooks":\n  Stop: []\n---\nx\n',
        ".claude/agents/indented.md": "---\n  name: x\n  hooks:\n    Stop: []\n---\nx\n",
        ".claude/agents/flow.md": "---\n{name: x, hooks: {Stop: [{command: evil}]}}\n---\nx\n",
        ".claude/agents/cased.md": "---\nHooks:\n  Stop: []\n---\nx\n",
        ".claude/agents/snake.md": "---\nmcp_servers:\n  x: {command: evil}\n---\nx\n",
        ".claude/agents/broken.md": "---\nname: [unclosed\n---\nx\n",
        ".claude/agents/unclosed.md": "---\nname: x\nhooks: {}\n",
        ".claude/skills/s/nested.json": '{"settings": {"deep": [{"hooks": {"Stop": []}}]}}',
        ".claude/skills/s/dashed.json": '{"MCP-Servers": {"x": {"command": "evil"}}}',
        ".claude/skills/s/bad.json": '{"name": ',
        ".claude/agents/control.md": "---\nname: control\ndescription: 'mentions hooks: in text'\n---\nhooks: in the body\n",
    }
    for relative, text in files.items():
        write(g / relative, text)
    result = agentbox(project, "sync", "pull", "claude")
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.splitlines())
    runs = "which would run programs on your host"
    assert lines == sorted([
        f"copy  ~/.claude/agents/control.md ({len(files['.claude/agents/control.md'])} bytes)",
        f"skip  ~/.claude/agents/quoted.md: its front matter defines `hooks`, {runs}",
        f"skip  ~/.claude/agents/indented.md: its front matter defines `hooks`, {runs}",
        f"skip  ~/.claude/agents/flow.md: its front matter defines `hooks`, {runs}",
        f"skip  ~/.claude/agents/cased.md: its front matter defines `Hooks`, {runs}",
        f"skip  ~/.claude/agents/snake.md: its front matter defines `mcp_servers`, {runs}",
        "skip  ~/.claude/agents/unclosed.md: its front matter has no closing `---` line, so what a CLI makes of it "
        "is unclear",
        f"skip  ~/.claude/skills/s/nested.json: it defines `hooks`, {runs}",
        f"skip  ~/.claude/skills/s/dashed.json: it defines `MCP-Servers`, {runs}",
        *[line for line in lines if line.startswith(("skip  ~/.claude/agents/broken.md: its front matter is not "
                                                     "valid YAML (", "skip  ~/.claude/skills/s/bad.json: not "
                                                     "valid JSON ("))],
    ])
    assert len(lines) == len(files)
    pulled = [p.name for folder in ("agents", "skills") for p in (home / ".claude" / folder).rglob("*") if p.is_file()]
    assert pulled == ["control.md"]


# -- ~/.claude.json: this workspace only, trusted, onboarding done (issue 27) ----------------------------


def test_the_vms_claude_json_holds_only_this_workspace_trusted_and_onboarded(project: Path, vm: FakeLima,
                                                                            home: Path) -> None:
    other = {"allowedTools": ["Bash(rm -rf /srv/secret:*)"], "history": [{"display": "the other project's prompt"}]}
    write(home / ".claude.json", json.dumps({
        "oauthAccount": {"emailAddress": "ada@example.com"},
        "projects": {str(project): {"allowedTools": ["Read"], "hasTrustDialogAccepted": False},
                     f"{project}/.agentbox/worktrees/fix": {"allowedTools": ["Edit"]},
                     f"{project}-other": other, "/home/ada/secret-client": other},
    }))
    write(home / ".claude" / ".credentials.json", json.dumps({"claudeAiOauth": {
        "accessToken": "sk-ant-oat01-a", "refreshToken": "sk-ant-ort01-r", "expiresAt": 4_000_000_000_000}}), mode=0o600)
    launch(project)
    state = json.loads((guest(vm) / ".claude.json").read_text())
    trusted = {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
    assert state["projects"] == {str(project): {"allowedTools": ["Read"], **trusted},
                                 f"{project}/.agentbox/worktrees/fix": {"allowedTools": ["Edit"]}}
    assert state["hasCompletedOnboarding"] is True and state["hasSeenAutoDefaultNudge"] is True
    assert "secret" not in json.dumps(state) and "other project" not in json.dumps(state)

    write(home / ".claude.json", json.dumps({"oauthAccount": {"emailAddress": "ada@example.com"}, "numStartups": 3}))
    launch(project)  # the host's new file replaces the VM's: marked again
    state = json.loads((guest(vm) / ".claude.json").read_text())
    assert state["projects"] == {str(project): trusted} and state["hasCompletedOnboarding"] is True
    assert state["numStartups"] == 3


def test_a_vm_without_a_claude_login_keeps_claude_codes_onboarding_but_trusts_the_workspace(
        project: Path, vm: FakeLima) -> None:
    launch(project)
    state = json.loads((guest(vm) / ".claude.json").read_text())
    assert state == {"hasSeenAutoDefaultNudge": True, "projects": {str(project): {
        "hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}


# -- remote MCP servers in allowlist mode (issue 27) -----------------------------------------------------


def test_allowlist_mode_names_the_remote_mcp_servers_it_blocks_and_how_to_allow_them(project: Path, vm: FakeLima,
                                                                                      home: Path) -> None:
    write(home / ".claude.json", json.dumps({"mcpServers": {
        "docs": {"type": "http", "url": "https://mcp.docs.example/mcp"},
        "wiki": {"type": "sse", "url": "http://wiki.example:8080/sse"},
        "open": {"type": "http", "url": "https://api.allowed.example/mcp"},
        "local": {"command": "sh", "args": ["-c", "true"]}},
        "projects": {str(project): {"mcpServers": {"team": {"type": "http", "url": "https://team.example/mcp"}}},
                     "/elsewhere": {"mcpServers": {"gone": {"type": "http", "url": "https://other.example/"}}}}}))
    write(project / "agentbox.yml", "network:\n  mode: allowlist\n  allow: ['*.allowed.example']\n")
    result = launch(project)
    warned = [line for line in result.stderr.splitlines() if "MCP" in line]
    assert warned == [
        "agentbox: warning: network.mode is allowlist and it blocks these remote MCP servers: "
        "~/.claude.json mcpServers.docs (mcp.docs.example), ~/.claude.json mcpServers.wiki (wiki.example), "
        f"~/.claude.json projects[{project}].mcpServers.team (team.example); "
        "allow them with `agentbox net allow mcp.docs.example` and `agentbox net allow team.example` and "
        "`agentbox net allow wiki.example:8080`"]

    write(project / "agentbox.yml", "network:\n  mode: allowlist\n  allow: ['*.allowed.example', mcp.docs.example, "
          "team.example, 'wiki.example:8080']\n")
    assert "MCP" not in launch(project).stderr  # the control: once allowed, nothing to say

    write(home / ".gemini" / "settings.json", json.dumps({"mcpServers": {
        "search": {"httpUrl": "https://search.example/mcp"}, "docs": {"url": "https://mcp.docs.example/sse"}}}))
    warned = [line for line in launch(project, "gemini").stderr.splitlines() if "MCP" in line]
    assert warned == ["agentbox: warning: network.mode is allowlist and it blocks these remote MCP servers: "
                      "~/.gemini/settings.json mcpServers.search (search.example); "
                      "allow them with `agentbox net allow search.example`"]
