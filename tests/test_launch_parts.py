"""launch.sh's parts (provision/launch/*.sh): launch.sh sources each once from its own folder, each reads only
the names launch.sh sets, the staging files they read are the ones agentbox/session/staging.py stages, and each part,
sourced on its own here (with common.sh, as launch.sh sources them), does its job.

Whole launches through the CLI and the double cover the parts too: tests/test_staging.py (every option, the
layout), tests/test_isolated.py (the copy), tests/test_agent_sync.py (sync.sh), tests/test_writeback.py
(credentials.sh's hand-back), tests/test_context.py (context.sh), tests/test_sessions.py and tests/test_tasks.py
(session.sh), tests/test_wrappers.py (guards.sh). The tests below drive each part's functions directly, without a VM.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agentbox import staginglayout
from agentbox.sync import agentsetup as agentsync
from tests.helpers import write

REPO = Path(__file__).resolve().parent.parent
LAUNCH_SH = REPO / "provision" / "launch.sh"
PARTS = REPO / "provision" / staginglayout.LAUNCH_PARTS
PART_NAMES = sorted(path.name for path in PARTS.glob("*.sh"))
BASH = shutil.which("bash") or "/bin/bash"


# -- the parts and launch.sh agree ------------------------------------------------------------------


def test_launch_sh_sources_every_part_once_from_its_own_folder() -> None:
    text = LAUNCH_SH.read_text()
    sourced = re.findall(r'^ *source "\$staging/launch/([a-z-]+\.sh)"$', text, re.M)  # indented: only the setup's
    followed = re.findall(r"^ *# shellcheck source=launch/([a-z-]+\.sh)$", text, re.M)
    assert sorted(sourced) == PART_NAMES and len(sourced) == len(set(sourced))
    assert followed == sourced  # shellcheck -x checks launch.sh with each part
    assert sourced[0] == "common.sh"  # the others use its say
    assert re.search(r'^  \*\) staging="\$\(cd "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)" && pwd\)" ;;$', text, re.M)
    assert re.search(r'^  /\*/\*\) staging="\$\{BASH_SOURCE\[0\]%/\*\}" ;;', text, re.M)  # the host's path: no process


def launch_sh_globals() -> set[str]:
    """The names launch.sh assigns before it sources its parts: its option parser's, staging, state."""
    text = LAUNCH_SH.read_text()
    head = text[:text.index('source "$staging/launch/')]
    return set(re.findall(r"^(?:  \S+\) )?([a-z_]+)=", head, re.M))  # `  PATTERN) name=`: staging, in its case


def unassigned_names(part: Path, tmp_path: Path) -> set[str]:
    """What shellcheck finds the part reads but never sets (SC2154), with the part's own disable taken out."""
    text = part.read_text().replace(" disable=SC2154", "", 1)
    copy = write(tmp_path / part.name, text)
    result = subprocess.run(["shellcheck", "-f", "json", "-i", "SC2154", str(copy)], capture_output=True, text=True)
    return {re.match(r"\w+", comment["message"]).group(0) for comment in json.loads(result.stdout)}  # type: ignore[union-attr]


@pytest.mark.needs("shellcheck")
@pytest.mark.parametrize("name", PART_NAMES)
def test_a_part_reads_only_names_launch_sh_sets(name: str, tmp_path: Path) -> None:
    """Each part says which of launch.sh's names it reads ("Reads launch.sh's ..."); shellcheck's unassigned names
    are among them, and each is one launch.sh sets and the part uses. A mistyped name fails here."""
    text = (PARTS / name).read_text()
    said = re.search(r"^# Reads launch\.sh's ((?:.|\n# )*?)\.$", text, re.M)
    declared = set(re.split(r",\s*(?:# )?", said.group(1).replace("\n# ", " "))) if said else set()
    assert ("disable=SC2154" in text.splitlines()[0]) == bool(declared), "the disable goes with the list"
    assert unassigned_names(PARTS / name, tmp_path) <= declared
    assert declared <= launch_sh_globals()
    for variable in declared:
        assert re.search(rf"\$\{{?{variable}\b", text), f"{name} says it reads {variable} and does not"


def staging_reads() -> set[str]:
    """The staging folder's paths launch.sh and its parts read: `$staging/PATH`, a `$name` segment as `*`, one
    that ends the path dropped (`$staging/guards/$name` reads the folder guards)."""
    found = set()
    for script in [LAUNCH_SH, *PARTS.glob("*.sh")]:
        for path in re.findall(r"\$staging/([A-Za-z0-9_.$/-]+)", script.read_text()):
            segments = ["*" if segment.startswith("$") else segment for segment in path.split("/")]
            while segments[-1] == "*" and segments[-2:-1] != ["sync"]:
                segments.pop()
            found.add("/".join(segments))
    return found


def test_the_parts_read_the_staging_files_the_host_stages() -> None:
    """Both ways: every staging path the shell side reads is one agentbox/session/staging.py names, and every name it
    documents as read in the VM is read (a part that stops reading one, or a new read without its constant, fails)."""
    sync = agentsync.SYNC
    host = {
        *(f"{staginglayout.LAUNCH_PARTS}/{part}" for part in PART_NAMES), staginglayout.GUARDS,
        *(f"{staginglayout.GUARDS}/{name}" for name in staginglayout.GUARD_FILES if name not in ("git", "gh")),
        staginglayout.ENV_FILE, staginglayout.NETWORK_RULES, staginglayout.CREDS_HOME, staginglayout.CREDS_MANIFEST, staginglayout.GIT_IDENTITY,
        f"{sync}/*", f"{sync}/*/{agentsync.MANIFEST}", f"{sync}/{agentsync.DEFAULTS}", staginglayout.OPEN_URL,
        f"{sync}/{agentsync.MEMORY}/{agentsync.HOME}",
        staginglayout.CONTEXT_FILE, staginglayout.MEMORY_BLOCK, staginglayout.CONTEXT_TOOLS, staginglayout.CONTEXT_DIGESTS,
        staginglayout.MEMORY_SCRIPT, staginglayout.TASK_RUNNER, staginglayout.SESSION_SCRIPT, staginglayout.TMUX_CONF,
        staginglayout.ATTENTION_SCRIPT, staginglayout.CLAUDE_HOOKS, staginglayout.BROKER_CA, staginglayout.BROKER_CA_DIGEST, staginglayout.GO_MARKERS,
        staginglayout.CANARIES,
    }
    assert staging_reads() == host


# -- each part on its own ---------------------------------------------------------------------------


class Guest:
    """A guest home, a staging folder and a bin of stand-ins (sudo fails: nothing reaches /etc or /run here)."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.staging = tmp_path / "staging"
        self.bin = tmp_path / "bin"
        self.workspace = tmp_path / "workspace"
        for folder in (self.home, self.staging, self.bin, self.workspace):
            folder.mkdir(parents=True)
        write(self.bin / "sudo", "#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n", mode=0o755)
        self.state = self.home / ".agentbox"

    def run(self, part: str, script: str, prelude: str = "", env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess:
        """`script` after launch.sh's globals (`prelude` adds to them) and common.sh and PART sourced, with
        launch.sh's shell options."""
        program = (
            "set -euo pipefail\n"
            f'staging={self.staging}\nstate="$HOME/.agentbox"\nmkdir -p "$state"\nworkspace={self.workspace}\n{prelude}\n'
            f'source {PARTS / "common.sh"}\nsource {PARTS / part}\n{script}\n'
        )
        environment = {"PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(self.home), **(env or {})}
        return subprocess.run([BASH, "-c", program], cwd=self.workspace, capture_output=True, text=True,
                              env=environment, timeout=60)


@pytest.fixture
def guest(tmp_path: Path) -> Guest:
    return Guest(tmp_path / "guest")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_common_leaves_local_bin_out_of_agentboxs_own_git(guest: Guest) -> None:
    result = guest.run("common.sh", 'PATH="/a:$HOME/.local/bin:/b" path_without_local_bin')
    assert (result.returncode, result.stdout) == (0, "/a:/b"), result.stderr
    bad = write(guest.home / "bad.json", "{not json")
    result = guest.run("common.sh", f"json_edit {bad} '.a = 1'")
    assert result.returncode == 0 and f"agentbox: cannot update {bad} (is it valid JSON?)" in result.stderr
    assert bad.read_text() == "{not json"
    good = write(guest.home / "good.json", "{}", mode=0o644)
    assert guest.run("common.sh", f"json_edit {good} '.a = 1'").returncode == 0
    assert (json.loads(good.read_text()), good.stat().st_mode & 0o777) == ({"a": 1}, 0o600)


def test_vm_exports_each_env_record_intact(guest: Guest) -> None:
    """(wait_for_boot's give-up: tests/test_staging.py::test_launch_sh_accepts_every_option_the_host_sends.)"""
    write(guest.staging / staginglayout.ENV_FILE, "ONE=a=b\0TWO=line\nnext\0")
    result = guest.run("vm.sh", 'load_env; printf "%s|%s" "$ONE" "$TWO"')
    assert (result.returncode, result.stdout) == (0, "a=b|line\nnext"), result.stderr
    (guest.staging / staginglayout.ENV_FILE).unlink()
    assert guest.run("vm.sh", 'load_env; printf "%s" "${ONE-unset}"').stdout == "unset"


def test_credentials_apply_what_the_host_changed_and_hand_back_what_the_session_changed(guest: Guest) -> None:
    token = b'{"t": 1}'
    write(guest.staging / staginglayout.CREDS_HOME / ".tool" / "auth.json", token.decode())
    write(guest.staging / staginglayout.CREDS_HOME / "outside", "x")
    manifest = f"{sha256(token)} .tool/auth.json\0{sha256(b'x')} ../outside\0"
    write(guest.staging / staginglayout.CREDS_MANIFEST, manifest)
    installed = guest.home / ".tool" / "auth.json"
    assert guest.run("credentials.sh", "apply_credentials").returncode == 0
    assert (installed.read_bytes(), installed.stat().st_mode & 0o777) == (token, 0o600)
    assert not (guest.home.parent / "outside").exists()
    installed.write_text("refreshed in the VM")  # the host's copy did not change: the VM's stays
    assert guest.run("credentials.sh", "apply_credentials").returncode == 0
    assert installed.read_text() == "refreshed in the VM"

    outbox = guest.home.parent / "outbox"
    outbox.mkdir()
    prelude = f"creds_outbox={outbox}\ncreds_return=(.tool/auth.json .tool/unchanged)"
    assert guest.run("credentials.sh", "return_credentials", prelude).returncode == 0
    assert sorted(p.name for p in outbox.iterdir()) == ["0"] and (outbox / "0").read_text() == "refreshed in the VM"


def test_sync_copies_the_hosts_setup_and_keeps_a_file_changed_in_the_vm(guest: Guest) -> None:
    """(The whole way through the CLI: tests/test_agent_sync.py.)"""
    files = {".codex/AGENTS.md": b"Be brief.\n", ".codex/prompts/p.md": b"prompt\n"}
    folder = guest.staging / agentsync.SYNC / "codex"
    for relative, data in files.items():
        write(folder / agentsync.HOME / relative, data.decode())
    write(folder / agentsync.MANIFEST, "".join(f"{sha256(d)} 600 {r}\0" for r, d in files.items()))
    assert guest.run("sync.sh", "apply_sync", "sync_agents=(codex)").returncode == 0
    assert (guest.home / ".codex" / "AGENTS.md").read_bytes() == b"Be brief.\n"
    assert (guest.state / "sync" / "codex" / "staged").read_bytes() == (folder / agentsync.MANIFEST).read_bytes()

    (guest.home / ".codex" / "AGENTS.md").write_text("Mine.\n")
    files[".codex/AGENTS.md"] = b"Be briefer.\n"
    write(folder / agentsync.HOME / ".codex/AGENTS.md", "Be briefer.\n")
    write(folder / agentsync.MANIFEST, "".join(f"{sha256(d)} 600 {r}\0" for r, d in files.items()))
    result = guest.run("sync.sh", "apply_sync", "sync_agents=(codex)")
    assert result.returncode == 0
    assert (guest.home / ".codex" / "AGENTS.md").read_text() == "Mine.\n"
    assert "kept ~/.codex/AGENTS.md as changed in this VM" in result.stderr


def test_home_marks_claude_onboarded_and_includes_the_git_identity(guest: Guest) -> None:
    write(guest.staging / staginglayout.GIT_IDENTITY, "[user]\n\tname = Someone\n")
    result = guest.run("home.sh", "mark_claude_onboarded; configure_git; trust_workspace_for_gemini",
                       env={"CLAUDE_CODE_OAUTH_TOKEN": "t"})
    assert result.returncode == 0, result.stderr
    assert json.loads((guest.home / ".claude.json").read_text()) == {"hasCompletedOnboarding": True, "hasSeenAutoDefaultNudge": True, "projects": {
        str(guest.workspace): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}}}
    included = subprocess.run(["git", "config", "--global", "--get-all", "include.path"], capture_output=True,
                              text=True, env={"HOME": str(guest.home), "PATH": os.environ["PATH"]})
    assert included.stdout == f"{guest.staging / staginglayout.GIT_IDENTITY}\n"
    trusted = json.loads((guest.home / ".gemini" / "trustedFolders.json").read_text())
    assert trusted == {str(guest.workspace): "TRUST_FOLDER"}


def test_guards_install_leave_a_foreign_program_and_go_again(guest: Guest) -> None:
    for name in staginglayout.GUARD_FILES:
        write(guest.staging / staginglayout.GUARDS / name, f"#!/bin/sh\n# agentbox-managed: readonly-remote\n# {name}\n")
    write(guest.home / ".local" / "bin" / "gh", "#!/bin/sh\n# the user's own\n", mode=0o755)
    result = guest.run("guards.sh", "install_guards")
    assert result.returncode == 0, result.stderr
    assert f"not replacing {guest.home}/.local/bin/gh: it is not agentbox's" in result.stderr
    assert (guest.home / ".local" / "bin" / "git").read_text().endswith("# git\n")
    hooks = guest.home / ".config" / "agentbox" / "hooks"
    assert (hooks / "pre-push").stat().st_mode & 0o777 == 0o755 and (hooks / "pre-commit").exists()
    assert guest.run("guards.sh", "remove_guards").returncode == 0
    assert sorted(p.name for p in (guest.home / ".local" / "bin").iterdir()) == ["gh"]
    assert list(hooks.iterdir()) == []


def test_guards_push_scoped_writes_the_namespace_and_the_others_remove_it(guest: Guest) -> None:
    for name in staginglayout.GUARD_FILES:
        write(guest.staging / staginglayout.GUARDS / name, f"#!/bin/sh\n# agentbox-managed: readonly-remote\n# {name}\n")
    scope = guest.home / staginglayout.PUSH_SCOPE_FILE
    result = guest.run("guards.sh", "install_guards refs/heads/agentbox/vm1/")
    assert result.returncode == 0, result.stderr
    assert scope.read_text() == "refs/heads/agentbox/vm1/\n"
    stamp = scope.stat().st_mtime_ns
    assert guest.run("guards.sh", "install_guards refs/heads/agentbox/vm1/").returncode == 0
    assert scope.stat().st_mtime_ns == stamp  # unchanged: not written again
    assert guest.run("guards.sh", 'install_guards ""').returncode == 0
    assert not scope.exists()
    assert guest.run("guards.sh", "install_guards refs/heads/agentbox/vm1/; remove_guards").returncode == 0
    assert not scope.exists()


def test_bootstrap_runs_on_create_once_and_stops_at_a_failing_script(guest: Guest) -> None:
    create = write(guest.home / "create.sh", "echo created >> log\n")
    prelude = f"on_create=({create})\non_start=()"
    for _ in range(2):
        assert guest.run("bootstrap.sh", "bootstrap", prelude).returncode == 0
    assert (guest.workspace / "log").read_text() == "created\n"
    failing = write(guest.home / "fail.sh", "exit 7\n")
    write(guest.state / "on-start-boot", "an earlier boot")
    result = guest.run("bootstrap.sh", "bootstrap; echo went on", f"on_create=()\non_start=({failing})")
    assert result.returncode == 7 and "went on" not in result.stdout
    assert f"onStartScript {failing} failed with exit code 7; the agent was not started." in result.stderr


def test_isolated_never_replaces_a_folder_it_did_not_make(guest: Guest) -> None:
    """(Making the copy and collecting its changes, through the CLI: tests/test_isolated.py.)"""
    write(guest.workspace / "precious", "the user's")
    result = guest.run("isolated.sh", "copy_place_problem", "isolated_from=/x; base=; outbox=")
    assert result.returncode == 0
    assert result.stdout.endswith("exists in this VM and is not a copy agentbox made; move it away (agentbox shell) "
                                  "or recreate the VM")
    result = guest.run("isolated.sh", "prepare_copy", "isolated_from=/x; base=; outbox=")
    assert result.returncode == 2 and "isolated mode needs --base and --outbox" in result.stderr
    # control: the place is free once the folder is the copy agentbox recorded
    write(guest.state / "isolated" / "copy", str(guest.workspace))
    assert guest.run("isolated.sh", "copy_place_problem", "isolated_from=/x; base=; outbox=").returncode == 1
    assert (guest.workspace / "precious").read_text() == "the user's"


def test_notify_installs_the_bell_and_leaves_a_managed_settings_file_not_its_own(guest: Guest) -> None:
    write(guest.staging / staginglayout.ATTENTION_SCRIPT, "#!/bin/sh\nprintf '\\a'\n")
    write(guest.staging / staginglayout.CLAUDE_HOOKS, '{"hooks": {}}\n')
    foreign = write(guest.home / "managed-settings.json", '{"theirs": true}\n')
    result = guest.run("notify.sh", f"claude_managed={foreign}\ninstall_attention")
    assert result.returncode == 0
    assert (guest.state / "bin" / "attention").stat().st_mode & 0o777 == 0o755
    assert f"not installing agentbox's Claude Code hooks: {foreign} is not agentbox's" in result.stderr
    result = guest.run("notify.sh", f"claude_managed={guest.home / 'absent.json'}\ninstall_attention")
    assert "could not install agentbox's Claude Code hooks" in result.stderr  # sudo fails here
    assert foreign.read_text() == '{"theirs": true}\n'


def test_context_records_the_tools_found_and_keeps_the_memory_block(guest: Guest) -> None:
    """(A launch with nothing changed running nothing: tests/test_context.py.)"""
    document = {"tools": {"list": [{"name": "bash"}, {"name": "no-such-tool"}]}}
    write(guest.staging / staginglayout.CONTEXT_FILE, json.dumps(document))
    write(guest.staging / staginglayout.CONTEXT_TOOLS, "bash\nno-such-tool\n")
    block = "<!-- BEGIN AGENTBOX -->\nthe sandbox\n<!-- END AGENTBOX -->\n"
    write(guest.staging / staginglayout.MEMORY_BLOCK, block)
    write(guest.staging / staginglayout.CONTEXT_DIGESTS, "c1\nm1\n")
    write(guest.staging / staginglayout.MEMORY_SCRIPT, (REPO / "provision" / "agent-memory.sh").read_text())
    write(guest.home / ".codex" / "AGENTS.md", "Mine.\n")
    result = guest.run("context.sh", 'install_context; keep_memory_block; printf "%s" "$AGENTBOX_CONTEXT_FILE"',
                       "memory_files=(.codex/AGENTS.md)")
    assert result.returncode == 0, result.stderr
    probed = guest.state / "context.json"
    assert result.stdout == str(probed)  # sudo failed: the agent reads the guest's own copy
    listed = {tool["name"]: tool["path"] for tool in json.loads(probed.read_text())["tools"]["list"]}
    assert listed == {"bash": subprocess.run(["bash", "-c", "command -v bash"], capture_output=True, text=True)
                      .stdout.strip(), "no-such-tool": None}
    assert (guest.home / ".codex" / "AGENTS.md").read_text() == "Mine.\n" + block
    stamp = (guest.state / "memory.stamp").stat().st_mtime_ns
    again = guest.run("context.sh", "install_context; keep_memory_block", "memory_files=(.codex/AGENTS.md)")
    assert again.returncode == 0
    assert (guest.state / "memory.stamp").stat().st_mtime_ns == stamp  # same block, no file changed: nothing ran


@pytest.mark.parametrize(("program", "code", "said"), [
    ("no-such-program", 127, "no-such-program: command not found\n"),
    ("./absent", 127, "./absent: No such file or directory\n"),
    ("/etc", 126, "/etc: Permission denied\n"),
])
def test_session_says_what_a_shell_would_of_a_missing_program(guest: Guest, program: str, code: int,
                                                              said: str) -> None:
    result = guest.run("session.sh", f"check_program {program}; echo ran")
    assert (result.returncode, result.stderr, result.stdout) == (code, said, "")
    assert guest.run("session.sh", "check_program true; echo ran").stdout == "ran\n"  # control


def test_session_hands_back_after_the_program_with_its_exit_code(guest: Guest) -> None:
    outbox = guest.home.parent / "outbox"
    outbox.mkdir()
    prelude = (f"isolated_from=; creds_outbox={outbox}; creds_return=(.login)\n"
               f"source {PARTS / 'credentials.sh'}\nsource {PARTS / 'isolated.sh'}")
    result = guest.run("session.sh", "run_then_hand_back bash -c 'echo new > ~/.login; exit 3'", prelude)
    assert result.returncode == 3, result.stderr
    assert (outbox / "0").read_text() == "new\n"


def test_staging_removes_a_part_no_longer_shipped_but_not_another_launchs_write_under_way(tmp_path: Path) -> None:
    from agentbox.session.staging import stage_launch_parts

    folder = tmp_path / "staging"
    stale = folder / staginglayout.LAUNCH_PARTS / "retired.sh"
    under_way = folder / staginglayout.LAUNCH_PARTS / ".context.sh.abc123.tmp"  # fsutil's temporary name
    write(stale, "old part\n")
    write(under_way, "a concurrent launch is writing this\n")
    stage_launch_parts(folder)
    assert not stale.exists()
    assert under_way.read_text() == "a concurrent launch is writing this\n"
    assert sorted(p.name for p in (folder / staginglayout.LAUNCH_PARTS).glob("[!.]*")) == sorted(p.name for p in PARTS.glob("*.sh"))
