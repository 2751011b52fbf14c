"""The parts of a session that meet in one launch, through the CLI and the double's real shell: an isolated
session whose agent also refreshes its login (the copy's changes and the login both come back through the
one outbox), the sandbox's description of such a session, and a synced memory file that also carries
agentbox's block."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jsonschema

from agentbox import paths, staginglayout
from agentbox.session import context
from tests.helpers import (
    NAME,
    FakeLima,
    agentbox,
    install_agent,
    make_repository,
    needs_bwrap,
    run_cli,
    staged_logins,
    write,
)

SCHEMA = json.loads(context.SCHEMA_FILE.read_text())
CLAUDE_LOGIN = ".claude/.credentials.json"

# In the VM: change a file of the copy, rotate the login, keep what the sandbox description said.
AGENT = f"""#!/bin/sh
echo "changed by the agent" > tracked.txt
cat > "$HOME/{CLAUDE_LOGIN}" <<'EOF'
{{"claudeAiOauth": {{"accessToken": "sk-ant-oat01-a2", "refreshToken": "sk-ant-ort01-r2", "expiresAt": 1760000000000}}}}
EOF
cp "$AGENTBOX_CONTEXT_FILE" /tmp/context-seen.json
"""


def claude_login(refresh: str, expires_ms: int) -> str:
    return json.dumps({"claudeAiOauth": {"accessToken": f"sk-ant-oat01-{refresh}", "refreshToken":
                                         f"sk-ant-ort01-{refresh}", "expiresAt": expires_ms}})


def test_an_isolated_session_hands_back_its_changes_and_its_login(project: Path, limactl: FakeLima,
                                                                   home: Path) -> None:
    needs_bwrap()
    staged_logins(home)  # the login handed back is a copied one (the broker's never leaves the host)
    host_login = write(home / CLAUDE_LOGIN, claude_login("r1", 1_750_000_000_000) + "\n", mode=0o600)
    make_repository(project)
    assert run_cli("start", cwd=project).exit_code == 0
    install_agent(limactl, AGENT)

    result = agentbox(project, "claude")
    assert result.returncode == 0, result.stderr
    assert (project / "tracked.txt").read_text() == "one\n"  # isolated: the host's file is untouched
    assert "proposal 1" in result.stderr
    review = agentbox(project, "review")
    assert "+changed by the agent" in review.stdout
    assert json.loads(host_login.read_text())["claudeAiOauth"]["refreshToken"] == "sk-ant-ort01-r2"
    assert "login refreshed in the VM is now the host's too" in result.stderr
    outbox = paths.vm_outbox(NAME)
    assert [p.name for p in outbox.iterdir()] == [staginglayout.OUTBOX_CREDS]  # both session folders taken and removed
    assert list((outbox / staginglayout.OUTBOX_CREDS).iterdir()) == []

    seen = json.loads((limactl.home / NAME / "guestfs" / "tmp" / "context-seen.json").read_text())
    jsonschema.validate(seen, SCHEMA)
    checkpoints = json.loads(agentbox(project, "checkpoints", "--json").stdout)
    start = [c for c in checkpoints if c["kind"] == "start"][-1]
    assert seen["workspace"] == {"path": str(project), "writable": True, "mode": "isolated",
                                 "meaning": context._MODE_MEANING["isolated"], "checkpoint": start["id"]}
    roles = {m["role"]: (m["guestPath"], m["writable"]) for m in seen["mounts"]}
    assert roles["workspaceSource"] == ("/mnt/agentbox/workspace", False)
    assert roles["outbox"] == (str(outbox), True)
    assert "workspace" not in roles  # the copy is the VM's own, not a mount
    described = json.loads(run_cli("describe", "--json", cwd=project).stdout)
    assert described["workspace"]["mode"] == "isolated"


def test_a_synced_memory_file_keeps_agentboxs_block_and_still_takes_the_hosts_next_version(
        project: Path, vm: FakeLima, home: Path) -> None:
    install_agent(vm, "#!/bin/sh\nexit 0\n")
    write(home / ".claude" / "CLAUDE.md", "host v1\n")
    assert agentbox(project, "claude", "-p", "hi").returncode == 0
    memory = vm.guest_home(NAME) / ".claude" / "CLAUDE.md"
    first = memory.read_text()
    assert first.startswith("host v1\n" + context.BEGIN_MARKER) and first.endswith(context.END_MARKER + "\n")

    write(home / ".claude" / "CLAUDE.md", "host v2")  # no final newline: the block's awk adds one
    # Two launches within one second: tar's whole-second mtime makes the copy look no newer than the block's
    # stamp. The stamp is set ahead to make that moment certain.
    stamp = vm.guest_home(NAME) / ".agentbox" / "memory.stamp"
    os.utime(stamp, (time.time() + 3600,) * 2)
    result = agentbox(project, "claude", "-p", "hi")
    assert result.returncode == 0, result.stderr
    assert "kept" not in result.stderr  # the block is agentbox's, not an edit made in the VM
    assert memory.read_text() == first.replace("host v1\n", "host v2\n")

    memory.write_text(memory.read_text().replace("host v2\n", "edited in the VM\n"))
    write(home / ".claude" / "CLAUDE.md", "host v3\n")
    result = agentbox(project, "claude", "-p", "hi")
    assert "kept ~/.claude/CLAUDE.md as changed in this VM" in result.stderr  # a real edit still wins
    assert memory.read_text().startswith("edited in the VM\n" + context.BEGIN_MARKER)


MEMORY_FILES = (".claude/CLAUDE.md", ".codex/AGENTS.md", ".gemini/GEMINI.md")


def test_memory_files_made_on_the_host_after_the_vm_ran_reach_it_at_any_agents_next_launch(
        project: Path, vm: FakeLima, home: Path) -> None:
    for binary in ("claude", "gemini"):
        install_agent(vm, "#!/bin/sh\nexit 0\n", binary)
    # The first launch (no memory file on the host) writes agentbox's block into every agent's memory file.
    assert agentbox(project, "claude", "-p", "hi").returncode == 0
    guest = vm.guest_home(NAME)
    for relative in MEMORY_FILES:
        assert (guest / relative).read_text().startswith(context.BEGIN_MARKER)

    for relative in MEMORY_FILES:
        write(home / relative, f"host's {relative}\n")
    result = agentbox(project, "gemini", "-p", "hi")  # not Claude Code, not Codex: all three still travel
    assert result.returncode == 0, result.stderr
    assert "kept" not in result.stderr  # a file holding only agentbox's block is not an edit made in the VM
    for relative in MEMORY_FILES:
        text = (guest / relative).read_text()
        assert text.startswith(f"host's {relative}\n" + context.BEGIN_MARKER), relative
        assert text.count(context.BEGIN_MARKER) == 1

    write(home / ".codex" / "AGENTS.md", "host's second AGENTS.md\n")  # changed again, during another agent's launch
    (guest / ".claude" / "CLAUDE.md").write_text(  # the user's edit in the VM still wins over the host's
        (guest / ".claude" / "CLAUDE.md").read_text().replace("host's", "the VM's"))
    write(home / ".claude" / "CLAUDE.md", "host's newer CLAUDE.md\n")
    result = agentbox(project, "claude", "-p", "hi")
    assert result.returncode == 0, result.stderr
    assert (guest / ".codex" / "AGENTS.md").read_text().startswith("host's second AGENTS.md\n" + context.BEGIN_MARKER)
    assert "kept ~/.claude/CLAUDE.md as changed in this VM" in result.stderr
    assert (guest / ".claude" / "CLAUDE.md").read_text().startswith("the VM's .claude/CLAUDE.md\n")
