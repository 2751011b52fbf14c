"""What the per-launch step does inside the VM: guards, credentials, bootstrap (through the double's real shell)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import STUB, FakeLima, needs_bwrap, run_cli, staged_logins, write, write_trusted

NAME = "agentbox-myproject"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"]


@pytest.fixture
def vm(project: Path, limactl: FakeLima) -> FakeLima:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.clear()
    return limactl


def shell(project: Path, *command: str, input: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", *command],
        cwd=project, capture_output=True, input=input, timeout=120,
    )


def repo_with_remote(project: Path) -> Path:
    remote = project / "remote.git"
    subprocess.run([*GIT, "init", "-q", "--bare", str(remote)], check=True)
    subprocess.run([*GIT, "init", "-q", str(project)], check=True)
    subprocess.run([*GIT, "-C", str(project), "remote", "add", "origin", str(remote)], check=True)
    (project / "file.txt").write_text("hello\n")
    subprocess.run([*GIT, "-C", str(project), "add", "file.txt"], check=True)
    subprocess.run([*GIT, "-C", str(project), "commit", "-q", "-m", "first"], check=True)
    return remote


def remote_head(remote: Path) -> str:
    result = subprocess.run(["git", "--git-dir", str(remote), "rev-parse", "--verify", "-q", "refs/heads/main"],
                            capture_output=True, text=True)
    return result.stdout.strip()


# -- readonly-remote ---------------------------------------------------------------------------


BLOCKED = "remote writes are blocked for this project by agentbox's readonly-remote guard"


@pytest.mark.parametrize(
    ("push", "refusal"),
    [
        (["git", "push", "origin", "main"], f"agentbox: refused `git push`: {BLOCKED}."),
        (["git", "-C", ".", "push", "origin", "main"], f"agentbox: refused `git push`: {BLOCKED}."),
        (["git", "-c", "alias.p=push", "p", "origin", "main"], f"agentbox: refused `git -c alias.p=push`: {BLOCKED}."),
        (["git", "-c", "core.hooksPath=/dev/null", "push", "origin", "main"],
         f"agentbox: refused `git -c core.hooksPath=/dev/null`: {BLOCKED}."),
        # The real git, past the wrapper: the pre-push hook stops it.
        (["/usr/bin/git", "push", "origin", "main"], f"agentbox: refused `git push` to origin ({{remote}}): {BLOCKED} (pre-push hook)."),
    ],
    ids=["push", "-C", "alias", "hooksPath", "real-git"],
)
def test_pushes_really_fail_inside_the_vm(project: Path, vm: FakeLima, push: list[str], refusal: str) -> None:
    remote = repo_with_remote(project)
    result = shell(project, *push)
    assert result.returncode != 0
    lines = result.stderr.decode().splitlines()
    assert lines[0] == refusal.format(remote=remote)
    assert "agentbox: setting `sync: {remoteWrite: true}` in agentbox.yml allows them." in lines
    assert remote_head(remote) == ""


def test_reading_and_committing_still_work(project: Path, vm: FakeLima) -> None:
    repo_with_remote(project)
    result = shell(project, "sh", "-c", "git status --short && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x && git log --oneline | wc -l")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(b"2")


def test_the_repository_own_hooks_still_run(project: Path, vm: FakeLima) -> None:
    repo_with_remote(project)
    write(project / ".git" / "hooks" / "pre-commit", "#!/bin/sh\necho own-hook-ran > hook.out\n", mode=0o755)
    result = shell(project, "git", "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m", "x")
    assert result.returncode == 0, result.stderr
    assert (project / "hook.out").read_text() == "own-hook-ran\n"


@pytest.mark.parametrize(
    "command",
    [
        ["git", "-c", "core.fsmonitor=./evil", "status"],
        ["git", "-C", ".", "--config-env=core.sshCommand=EVIL", "ls-remote", "ssh://example.invalid/r.git"],
        ["env", "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.fsmonitor", "GIT_CONFIG_VALUE_0=./evil", "git", "status"],
        ["env", "GIT_SSH_COMMAND=./evil", "git", "ls-remote", "ssh://example.invalid/r.git"],
        ["git", "submodule", "foreach", "./evil"],
    ],
    ids=["-c", "--config-env", "GIT_CONFIG_COUNT", "GIT_SSH_COMMAND", "submodule-foreach"],
)
def test_settings_that_run_a_program_are_refused_inside_the_vm(project: Path, vm: FakeLima, command: list[str]) -> None:
    remote = repo_with_remote(project)
    write(project / "evil", f"#!/bin/sh\ntouch {project}/pwned\ngit push -q --no-verify origin HEAD:main\n", mode=0o755)
    result = shell(project, "env", "EVIL=./evil", *command)
    assert result.returncode == 1
    assert b"readonly-remote guard" in result.stderr and b"remoteWrite" in result.stderr
    assert not (project / "pwned").exists()
    assert remote_head(remote) == ""


def test_session_git_variables_in_env_keep_the_launch_and_git_working(project: Path, vm: FakeLima) -> None:
    """An `env:` that sets the editor and pager for every command (as IDEs and harnesses do) is no
    one-off injection: the launch step's own git calls and the agent's commits keep working."""
    write_trusted(project, "env:\n  GIT_EDITOR: 'true'\n  GIT_PAGER: cat\n  GIT_SEQUENCE_EDITOR: ':'\n")
    repo_with_remote(project)
    for _ in range(2):  # the second launch runs its git calls through the installed wrapper
        result = shell(project, "sh", "-c", "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x && "
                       "git -c user.name=a -c user.email=a@b commit -q --amend --allow-empty && git log --oneline | wc -l")
        assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(b"3")


def test_refused_git_variable_in_env_stops_git_not_the_launch(project: Path, vm: FakeLima, home: Path) -> None:
    """The launch step's own git settings bypass the wrapper; the agent's git commands are refused
    with the reason, instead of the launch dying halfway."""
    write(home / ".gitconfig", "[user]\n\tname = Ada\n\temail = ada@example.com\n")
    write_trusted(project, "env:\n  GIT_SSH_COMMAND: ssh -o BatchMode=yes\n")
    repo_with_remote(project)
    for _ in range(2):  # the second launch finds the wrapper installed
        result = shell(project, "sh", "-c", "echo launched; git status")
        assert result.stdout.startswith(b"launched\n"), result.stderr
        assert result.returncode == 1
        assert b"refused `GIT_SSH_COMMAND` in the environment" in result.stderr
    hooks = shell(project, "env", "-u", "GIT_SSH_COMMAND", "git", "config", "--global", "--get", "core.hooksPath")
    assert hooks.returncode == 0 and hooks.stdout.strip().endswith(b"/.config/agentbox/hooks")


def test_remote_write_true_removes_the_guards(project: Path, vm: FakeLima) -> None:
    remote = repo_with_remote(project)
    assert shell(project, "true").returncode == 0
    guest_bin = vm.guest_home(NAME) / ".local" / "bin"
    assert (guest_bin / "git").exists() and (guest_bin / "gh").exists()
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = shell(project, "git", "push", "-q", "origin", "main")
    assert result.returncode == 0, result.stderr
    assert remote_head(remote) != ""
    assert not (guest_bin / "git").exists() and not (guest_bin / "gh").exists()


def test_gh_wrapper_blocks_writes_and_passes_reads(project: Path, vm: FakeLima) -> None:
    record = project / "gh-calls"
    stub = vm.home / NAME / "guestfs" / "usr-local" / "bin" / "gh"
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {record}\n")
    stub.chmod(0o755)
    assert shell(project, "gh", "pr", "list").returncode == 0
    blocked = shell(project, "gh", "pr", "merge", "1")
    assert blocked.returncode != 0
    api_post = shell(project, "gh", "api", "-X", "POST", "repos/o/r/issues")
    assert api_post.returncode != 0
    assert record.read_text() == "pr list\n"


# -- credentials -------------------------------------------------------------------------------


def test_credentials_are_staged_read_only_and_copied_once(project: Path, vm: FakeLima, home: Path, isolated_env) -> None:
    staged_logins(home)  # the logins copied in as they are (the broker's placeholders: tests/test_broker_cli.py)
    host_file = write(home / ".claude" / ".credentials.json", '{"token": "v1"}', mode=0o600)
    assert shell(project, "true").returncode == 0
    guest_file = vm.guest_home(NAME) / ".claude" / ".credentials.json"
    assert guest_file.read_text() == '{"token": "v1"}'
    assert stat.S_IMODE(guest_file.stat().st_mode) == 0o600
    staged = isolated_env["state"] / "vms" / NAME / "staging" / "creds" / "home" / ".claude" / ".credentials.json"
    assert stat.S_IMODE(staged.stat().st_mode) == 0o600

    # Nothing in the VM can write the staged copy or the host's file.
    attempt = shell(project, "sh", "-c", f"echo evil > {staged}")
    assert attempt.returncode != 0
    assert staged.read_text() == '{"token": "v1"}' and host_file.read_text() == '{"token": "v1"}'

    # The agent refreshes its token in the VM: an unchanged host file does not overwrite it.
    guest_file.write_text('{"token": "refreshed-in-vm"}')
    assert shell(project, "true").returncode == 0
    assert guest_file.read_text() == '{"token": "refreshed-in-vm"}'

    # A new login on the host reaches the VM at the next launch.
    host_file.write_text('{"token": "v2"}')
    assert shell(project, "true").returncode == 0
    assert guest_file.read_text() == '{"token": "v2"}'


@pytest.mark.parametrize("host_dir", [".local/share/kiro-cli", "Library/Application Support/kiro-cli"])
def test_kiro_login_reaches_the_vm_from_either_host_location(project: Path, vm: FakeLima, home: Path,
                                                             isolated_env, host_dir: str) -> None:
    """Linux keeps Kiro's login in ~/.local/share, macOS in ~/Library: both land where Linux keeps it."""
    write(home / host_dir / "data.sqlite3", f"kiro login from {host_dir}", mode=0o600)
    assert shell(project, "true").returncode == 0
    staged = isolated_env["state"] / "vms" / NAME / "staging" / "creds" / "home" / ".local" / "share" / "kiro-cli"
    assert (staged / "data.sqlite3").read_text() == f"kiro login from {host_dir}"
    guest = vm.guest_home(NAME) / ".local" / "share" / "kiro-cli" / "data.sqlite3"
    assert guest.read_text() == f"kiro login from {host_dir}"


def test_opencode_and_copilot_logins_reach_the_vm_with_their_own_launch(project: Path, vm: FakeLima, home: Path) -> None:
    """A launch stages the launched agent's logins (plus GitHub's): OpenCode's auth.json; Copilot CLI's
    config.json and the GitHub CLI login it falls back to."""
    staged_logins(home)  # the GitHub CLI's as it is (with the broker: a placeholder version)
    from tests.test_launch import configure, launch

    configure(project, "")
    for binary in ("opencode", "copilot"):  # stand-ins that record what reached them (this module's vm has none)
        write(vm.home / NAME / "guestfs" / "usr-local" / "bin" / binary, STUB, mode=0o755)
    write(home / ".local" / "share" / "opencode" / "auth.json", '{"anthropic": {"type": "oauth"}}', mode=0o600)
    write(home / ".copilot" / "config.json", '{"last_logged_in_user": {"login": "me"}}', mode=0o600)
    write(home / ".config" / "gh" / "hosts.yml", "github.com:\n  oauth_token: gho_x\n", mode=0o600)
    guest = vm.guest_home(NAME)

    result, data = launch(project, "opencode", "run", "hi")
    assert result.returncode == 0, result.stderr
    assert data["args"] == ["run", "--auto", "hi"]
    assert (guest / ".local" / "share" / "opencode" / "auth.json").read_text() == '{"anthropic": {"type": "oauth"}}'
    assert not (guest / ".copilot" / "config.json").exists()  # not copilot's launch

    result, data = launch(project, "copilot", "-p", "hi")
    assert result.returncode == 0, result.stderr
    assert data["args"] == ["--allow-all", "-p", "hi"]
    assert (guest / ".copilot" / "config.json").read_text() == '{"last_logged_in_user": {"login": "me"}}'
    assert (guest / ".config" / "gh" / "hosts.yml").read_text() == "github.com:\n  oauth_token: gho_x\n"


def test_an_unchanged_credential_file_is_not_read_again(project: Path, vm: FakeLima, home: Path,
                                                        isolated_env) -> None:
    """Only the file's stat is looked at while it is unchanged; a changed one is staged with its new digest."""
    staged_logins(home)
    import hashlib
    import time

    host_file = write(home / ".codex" / "auth.json", '{"token": "v1"}', mode=0o600)
    written = time.time()
    opened: list[str] = []
    watch_opens(str(host_file), opened)
    assert launch_in_process(project) == 0
    assert opened, "the first launch reads the file"
    assert (vm.guest_home(NAME) / ".codex" / "auth.json").read_text() == '{"token": "v1"}'

    time.sleep(max(0.0, written + 1.2 - time.time()))  # past the racy-clean second after its last change
    assert launch_in_process(project) == 0  # hashes it once more: the first hashing was racy
    opened.clear()
    assert launch_in_process(project) == 0
    assert opened == [], "an unchanged credential file was read again"

    host_file.write_text('{"token": "v2"}')
    assert launch_in_process(project) == 0
    assert opened
    guest = vm.guest_home(NAME) / ".codex" / "auth.json"
    assert guest.read_text() == '{"token": "v2"}'
    manifest = (isolated_env["state"] / "vms" / NAME / "staging" / "creds" / "manifest").read_bytes()
    digest = hashlib.sha256(host_file.read_bytes()).hexdigest()
    assert manifest == f"{digest} .codex/auth.json\0".encode()


_watched: dict[str, list[str]] = {}


def watch_opens(path: str, record: list[str]) -> None:
    """Record every open of path by this process (an audit hook stays for the process: it checks a table)."""
    import sys

    if not _watched:
        def hook(event: str, args: tuple) -> None:
            if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
                found = _watched.get(os.fsdecode(args[0]))
                if found is not None:
                    found.append(event)

        sys.addaudithook(hook)
    _watched.clear()
    _watched[path] = record


def launch_in_process(project: Path) -> int:
    """`agentbox shell -- true` in this process, so its opens can be watched."""
    from agentbox.config import pins

    pins.forget()
    return run_cli("shell", "--", "true", cwd=project).exit_code


def test_credentials_false_brings_nothing(project: Path, vm: FakeLima, home: Path) -> None:
    write(home / ".codex" / "auth.json", "{}", mode=0o600)
    write(project / "agentbox.yml", "credentials: false\n")
    assert shell(project, "true").returncode == 0
    assert not (vm.guest_home(NAME) / ".codex" / "auth.json").exists()


def test_only_safe_git_settings_reach_the_vm(project: Path, vm: FakeLima, home: Path) -> None:
    write(
        home / ".gitconfig",
        "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n[credential]\n\thelper = osxkeychain\n"
        '[url "https://x-token:secret@github.com/"]\n\tinsteadOf = https://github.com/\n'
        "[init]\n\tdefaultBranch = trunk\n[gpg]\n\tprogram = /opt/homebrew/bin/gpg\n",
    )
    result = shell(project, "sh", "-c", "git config --global --list --includes")
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert "user.name=Ada Lovelace" in out and "user.email=ada@example.com" in out
    assert "init.defaultbranch=trunk" in out
    assert "osxkeychain" not in out and "secret" not in out and "gpg" not in out


def test_claude_token_in_env_marks_onboarding_done(project: Path, vm: FakeLima) -> None:
    write_trusted(project, "env:\n  CLAUDE_CODE_OAUTH_TOKEN: sk-ant-oat01-test\n")
    assert shell(project, "true").returncode == 0
    assert '"hasCompletedOnboarding": true' in (vm.guest_home(NAME) / ".claude.json").read_text()
    assert not any("sk-ant-oat01-test" in " ".join(argv) for argv in vm.calls())


# -- bootstrap ---------------------------------------------------------------------------------


def test_bootstrap_once_per_vm_and_once_per_boot_in_order(project: Path, vm: FakeLima, home: Path) -> None:
    log = project / "boot.log"
    write(home / "scripts" / "global-start.sh", f"echo global-start >> {log}\n")
    write(home / ".config" / "agentbox" / "config.yml", "bootstrap:\n  onStartScript: ~/scripts/global-start.sh\n")
    write(project / "create.sh", 'echo "create $(pwd) $MY_VAR" >> boot.log\n')
    write(project / "start.sh", "echo local-start >> boot.log\n")
    write_trusted(project, "env:\n  MY_VAR: hi\nbootstrap:\n  onCreateScript: create.sh\n  onStartScript: [start.sh]\n")
    assert shell(project, "true").returncode == 0
    assert log.read_text() == f"create {project} hi\nglobal-start\nlocal-start\n"
    assert shell(project, "true").returncode == 0
    assert log.read_text() == f"create {project} hi\nglobal-start\nlocal-start\n"
    assert run_cli("restart", cwd=project).exit_code == 0
    assert shell(project, "true").returncode == 0
    assert log.read_text() == f"create {project} hi\nglobal-start\nlocal-start\nglobal-start\nlocal-start\n"


def test_failing_bootstrap_stops_the_launch_and_is_retried(project: Path, vm: FakeLima) -> None:
    marker = project / "ran-agent"
    write(project / "setup.sh", "echo setting up\nexit 3\n")
    write_trusted(project, "bootstrap:\n  onCreateScript: setup.sh\n")
    result = shell(project, "touch", str(marker))
    assert result.returncode == 3
    assert b"onCreateScript" in result.stderr and b"setup.sh" in result.stderr and b"exit code 3" in result.stderr
    assert b"setting up" in result.stdout
    assert not marker.exists()
    write(project / "setup.sh", "echo fixed\n")
    edited = shell(project, "touch", str(marker))
    assert edited.returncode == 2  # an edited script asks for trust again, like `direnv allow`
    assert b"the content of" in edited.stderr and b"setup.sh changed" in edited.stderr
    assert not marker.exists()
    assert run_cli("trust", cwd=project).exit_code == 0
    result = shell(project, "touch", str(marker))
    assert result.returncode == 0
    assert marker.exists()


def test_untrusted_local_config_cannot_run_host_scripts(project: Path, vm: FakeLima, home: Path) -> None:
    secret = write(home / ".aws" / "credentials", "aws_secret_access_key = x\n")
    write(project / "agentbox.yml", "bootstrap:\n  onStartScript: ~/.aws/credentials\n")
    result = shell(project, "true")
    assert result.returncode == 2
    assert (f"  - bootstrap.onStartScript: {secret} (runs in the VM with your logins present, "
            "a host file outside the workspace)") in result.stderr.decode().splitlines()
    (project / "innocent.sh").symlink_to(secret)
    write(project / "agentbox.yml", "bootstrap:\n  onStartScript: innocent.sh\n")
    result = shell(project, "true")
    assert result.returncode == 2
    assert (f"  - bootstrap.onStartScript: {project / 'innocent.sh'} (runs in the VM with your logins present, "
            f"a symlink to {secret} outside the workspace)") in result.stderr.decode().splitlines()
    assert vm.subcommands() == []


def test_missing_bootstrap_script_is_a_config_error_before_create(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "bootstrap:\n  onCreateScript: scripts/nope.sh\n")
    result = shell(project, "true")
    assert result.returncode == 2
    assert b"bootstrap.onCreateScript" in result.stderr and b"nope.sh" in result.stderr
    assert "create" not in limactl.subcommands()


def test_warm_launch_with_everything_still_makes_one_call(project: Path, vm: FakeLima, home: Path) -> None:
    write(home / ".claude" / ".credentials.json", "{}", mode=0o600)
    write(home / ".gitconfig", "[user]\n\tname = A\n")
    write(project / "s.sh", "true\n")
    write_trusted(project, "env:\n  TOKEN: secret-value\nbootstrap:\n  onStartScript: s.sh\n")
    assert shell(project, "true").returncode == 0
    vm.clear()
    assert shell(project, "true").returncode == 0
    assert vm.subcommands() == ["shell"]
    assert not any("secret-value" in " ".join(argv) for argv in vm.calls())


def test_keychain_gh_token_reaches_the_vm_as_gh_token(project: Path, vm: FakeLima, home: Path, tmp_path: Path, monkeypatch) -> None:
    write(home / ".config" / "gh" / "hosts.yml", "github.com:\n    user: ada\n    git_protocol: https\n")
    host_bin = tmp_path / "host-bin"
    host_bin.mkdir()
    (host_bin / "gh").write_text("#!/bin/sh\n[ \"$1 $2\" = 'auth token' ] && echo gho_fromkeychain\n")
    (host_bin / "gh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{host_bin}{os.pathsep}{os.environ['PATH']}")
    result = shell(project, "printenv", "GH_TOKEN")  # with the credential broker: a placeholder
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"gho_agentbox-ph-") and b"fromkeychain" not in result.stdout
    staged_logins(home)
    result = shell(project, "printenv", "GH_TOKEN")  # without: the token itself, never on a command line
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"gho_fromkeychain\n"
    assert not any("gho_fromkeychain" in " ".join(argv) for argv in vm.calls())


def test_ca_cert_sets_node_extra_ca_certs_in_the_vm(project: Path, vm: FakeLima, home: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUTEST\n-----END CERTIFICATE-----\n"
    write(home / "corp.pem", pem)
    write(home / ".config" / "agentbox" / "config.yml", "caCert: ~/corp.pem\n")
    template = run_cli("template", cwd=project)
    assert "MIIBszCCAVmgAwIBAgIUTEST" in template.stdout and "caCerts:" in template.stdout
    result = shell(project, "printenv", "NODE_EXTRA_CA_CERTS")
    assert result.stdout == b"/etc/ssl/certs/ca-certificates.crt\n"


def test_a_launch_notes_settings_that_need_a_new_vm(project: Path, vm: FakeLima) -> None:
    write(project / "agentbox.yml", "vm:\n  protectGitHooks: true\n")
    result = shell(project, "true")
    assert result.returncode == 0
    assert (b"protectGitHooks changed since agentbox-myproject was created; `agentbox start --recreate` applies it"
            in result.stderr)
