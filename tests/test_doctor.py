"""`agentbox doctor` through the real CLI against the limactl double."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import Result

from tests.helpers import FakeLima, needs_bwrap, run_cli, write

NAME = "agentbox-myproject"


def doctor(project: Path, *args: str) -> Result:
    return run_cli("doctor", *args, cwd=project)


def line(result: Result, status: str, fragment: str) -> str:
    """The one output line with this status that contains fragment."""
    found = [text for text in result.stdout.splitlines() if text.startswith(f"  {status:<6}") and fragment in text]
    assert len(found) == 1, f"no single {status} line with {fragment!r} in:\n{result.stdout}"
    return found[0]


def hint_after(result: Result, fragment: str) -> str:
    lines = result.stdout.splitlines()
    index = next(i for i, text in enumerate(lines) if fragment in text)
    assert lines[index + 1].startswith(" " * 8 + "hint: "), result.stdout
    return lines[index + 1]


def launch(project: Path) -> None:
    """One real launch (`agentbox shell -- true`): stages credentials, installs the guards in the VM."""
    result = subprocess.run(
        [sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project, capture_output=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def claude_logged_in_and_launched(project: Path, home: Path) -> None:
    """A healthy setup: Claude Code logged in on the host, the VM started and one launch made."""
    needs_bwrap()
    login = {"claudeAiOauth": {"accessToken": "sk-ant-oat01-t", "refreshToken": "sk-ant-ort01-r",
                               "expiresAt": int((time.time() + 3600) * 1000)}}
    write(home / ".claude" / ".credentials.json", json.dumps(login), mode=0o600)
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    launch(project)


def test_no_limactl_is_a_failure_not_a_crash(project: Path, isolated_env, monkeypatch) -> None:
    write(project / "agentbox.yml", "")
    monkeypatch.setenv("PATH", str(project / "no-such-bin"))
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", "limactl was not found on PATH")
    assert "brew install lima" in hint_after(result, "limactl was not found")
    line(result, "OK", "config is valid")
    checks = json.loads(doctor(project, "--json").stdout)
    assert not [c for c in checks if c["check"].startswith("vm")]  # the VM checks are skipped
    assert "internal error" not in result.stderr
    assert not (isolated_env["state"] / "crash.log").exists()


def test_healthy_running_vm_after_a_launch(project: Path, limactl: FakeLima, home: Path, isolated_env) -> None:
    claude_logged_in_and_launched(project, home)
    limactl.clear()

    result = doctor(project)
    assert result.exit_code == 0, result.stdout
    line(result, "OK", "Lima 2.2.0 (limactl at ")
    line(result, "OK", f"config is valid (local {project / 'agentbox.yml'})")
    line(result, "OK", f"VM {NAME} is running")
    line(result, "OK", f"VM {NAME} belongs to this workspace")
    assert line(result, "OK", "claude:").endswith(
        "claude: logged in on the host (1 of 2 files), brokered: placeholders staged, the real login stays on the host, "
        "in the VM")
    line(result, "OK", "guards are installed in the VM")
    line(result, "OK", "agents checked: claude (logged in on the host); not checked: codex, gemini, kiro")
    assert "codex:" not in result.stdout  # not used: not checked
    # --version, list and exactly one `limactl shell` for every in-VM question.
    assert limactl.subcommands() == ["", "list", "shell"]
    assert limactl.calls()[0] == ["--version"]

    # A login made on the host after the launch is neither staged nor in the VM yet.
    write(home / ".codex" / "auth.json", "{}", mode=0o600)
    result = doctor(project)
    assert result.exit_code == 0
    assert line(result, "WARN", "codex:").endswith("codex: logged in on the host, not staged now, not in the VM yet")
    assert "agentbox codex" in hint_after(result, "codex: logged in")


def test_json_lists_every_check(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    result = doctor(project, "--json")
    assert result.exit_code == 0
    checks = json.loads(result.stdout)
    assert [c["check"] for c in checks[:3]] == ["lima", "config", "workspace"]
    assert all(set(c) == {"check", "status", "message", "hint"} for c in checks)
    assert all(c["status"] in ("OK", "WARN", "FAIL") for c in checks)
    vm = next(c for c in checks if c["check"] == "vm")
    assert vm["status"] == "WARN" and "created on first launch" in vm["message"] and vm["hint"]


def test_not_created_vm_is_a_warning(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "WARN", f"VM {NAME} does not exist yet: it is created on first launch")
    line(result, "WARN", "guards (sync.remoteWrite: false) are not installed yet")
    assert limactl.subcommands() == ["", "list"]


def test_running_vm_before_any_launch_has_no_guards_yet(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "WARN", "guards (sync.remoteWrite: false) are not installed in the VM yet")
    assert "next launch" in hint_after(result, "are not installed in the VM yet")


def test_foreign_git_in_the_vm_fails_and_unreachable_vm_warns(project: Path, limactl: FakeLima, monkeypatch) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    launch(project)
    write(limactl.guest_home(NAME) / ".local" / "bin" / "git", "#!/bin/sh\nexec /usr/bin/git \"$@\"\n", mode=0o755)
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", "~/.local/bin/git in the VM is not agentbox's")
    assert "rm ~/.local/bin/git" in hint_after(result, "is not agentbox's")

    monkeypatch.setenv("FAKE_LIMACTL_SHELL_SSH_FAIL", "1")
    result = doctor(project)
    line(result, "WARN", f"cannot look inside {NAME} (`limactl shell` exit 255)")
    line(result, "OK", "not checked in the VM: `limactl shell` failed")


def test_stopped_vm_is_fine_and_not_looked_into(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    assert run_cli("stop", cwd=project).exit_code == 0
    limactl.clear()
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", f"VM {NAME} is stopped; it starts on next launch")
    line(result, "OK", "not checked in the VM: the VM is Stopped")
    assert "shell" not in limactl.subcommands()


def test_broken_vm_fails(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    limactl.set_status(NAME, "Broken")
    limactl.clear()
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"VM {NAME} is Broken")
    hint = hint_after(result, "is Broken")
    assert "agentbox start" in hint and "agentbox start --recreate" in hint
    assert "shell" not in limactl.subcommands()


def test_invalid_config_is_reported_not_exit_2(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "vm: [\n")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "OK", "Lima 2.2.0")
    failure = line(result, "FAIL", "the config is not valid")
    assert str(project / "agentbox.yml") in failure
    assert result.stderr == ""


def test_unusable_config_file_is_a_failure(project: Path, limactl: FakeLima) -> None:
    path = write(project / "agentbox.yml", "", mode=0o666)
    result = doctor(project)
    assert result.exit_code == 1  # launches refuse such a file, so doctor fails it
    line(result, "FAIL", f"{path} is not used: it is writable by group and others, so launches refuse to run")
    assert hint_after(result, "is not used") == " " * 8 + f"hint: Fix it with `chmod g-w,o-w {path}`."


def test_home_as_workspace_fails(home: Path, limactl: FakeLima) -> None:
    result = doctor(home)
    assert result.exit_code == 1
    line(result, "FAIL", "contains your home folder")


def test_vm_of_another_workspace_fails_naming_both(project: Path, home: Path, limactl: FakeLima) -> None:
    other = home.parent / "work" / "other"
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    lima_yaml = limactl.home / NAME / "lima.yaml"  # as if the other project had created it
    lima_yaml.write_text(lima_yaml.read_text().replace(f"agentboxWorkspace: {project}", f"agentboxWorkspace: {other}"))
    limactl.clear()
    result = doctor(project)
    assert result.exit_code == 1
    failure = line(result, "FAIL", f"VM {NAME} belongs to {other}, not to this workspace {project}")
    assert failure
    hint = hint_after(result, "belongs to")
    assert re.fullmatch(
        " {8}hint: Give this workspace its own VM: set `name: agentbox-myproject-[0-9a-f]{8}` under `vm:` in "
        + re.escape(f"{project / 'agentbox.yml'}, then run `agentbox -C {project} trust`."), hint), hint
    assert "shell" not in limactl.subcommands()  # never look into another project's VM


def test_instance_not_created_by_agentbox_fails(project: Path, limactl: FakeLima, tmp_path: Path) -> None:
    template = write(tmp_path / "plain.yaml", "images:\n- location: /nonexistent.img\n")
    subprocess.run(["limactl", "--tty=false", "create", "--name", NAME, str(template)], check=True, capture_output=True)
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"the Lima instance {NAME} was not created by agentbox")


def test_remote_write_and_credentials_off(project: Path, limactl: FakeLima, home: Path) -> None:
    write(home / ".claude" / ".credentials.json", "{}", mode=0o600)
    write(home / ".config" / "agentbox" / "config.yml", "sync:\n  remoteWrite: true\ncredentials: false\n")
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", "guards are off by config (sync.remoteWrite: true): agents in the VM can push")
    line(result, "OK", "credentials are off in config")
    assert "claude:" not in result.stdout


def test_agent_with_credentials_off_and_custom_agent(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "agents:\n  codex:\n    credentials: false\n  aider:\n    binary: aider\n"
          "    credentials: [~/.aider/token]\n")
    result = doctor(project)
    line(result, "OK", "codex: no login to bring into the VM (credentials are off for it in config)")
    line(result, "WARN", "aider: not logged in on the host")


def test_untrusted_local_config_fails_until_trusted(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"{project / 'agentbox.yml'} is not trusted, so launches refuse it: it sets sync.remoteWrite")
    assert "agentbox trust --show" in hint_after(result, "is not trusted")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", f"{project / 'agentbox.yml'} is trusted as it is")


def test_missing_ca_cert_fails(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "caCert: certs/corp.pem\n")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", f"caCert: {project / 'certs' / 'corp.pem'} does not exist")


def test_old_lima_fails(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "oldbin"
    write(bin_dir / "limactl", '#!/bin/sh\n[ "$1" = --version ] && echo "limactl version 1.2.1"\nexit 0\n', mode=0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 1
    line(result, "FAIL", "Lima 1.2.1")
    assert "older than 2.0.0" in result.stdout


def test_version_tuple() -> None:
    from agentbox.cli.verdicts import version_tuple

    assert version_tuple("2.0.0") == (2, 0, 0)
    assert version_tuple("v2.1") == (2, 1, 0)
    assert version_tuple("2.1.0-beta.1") == (2, 1, 0)
    assert version_tuple("HEAD-abc") is None


# -- the agents in use -------------------------------------------------------------------------


def test_only_the_agents_in_use_are_checked(project: Path, limactl: FakeLima, home: Path) -> None:
    write(project / "agentbox.yml", "")
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", "no agent is set in the config or logged in on the host or in the VM, so no login is checked "
                       "(codex, claude, gemini, kiro, opencode, copilot)")
    assert not [text for text in result.stdout.splitlines() if "not logged in" in text]

    # Kiro logged in where Linux keeps it; Gemini named in the global config without a login.
    write(home / ".local" / "share" / "kiro-cli" / "data.sqlite3", "db", mode=0o600)
    write(home / ".config" / "agentbox" / "config.yml", "agents:\n  gemini:\n    model: gemini-2.5-pro\n")
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "OK", "agents checked: gemini (set in the global config), kiro (logged in on the host); "
                       "not checked: codex, claude, opencode, copilot (neither set in the config nor logged in)")
    line(result, "WARN", "gemini: not logged in on the host")
    assert line(result, "WARN", "kiro:").endswith("kiro: logged in on the host, not staged now, "
                                                  "not checked in the VM: the VM does not exist yet")
    assert "codex:" not in result.stdout and "claude:" not in result.stdout
    checks = json.loads(doctor(project, "--json").stdout)
    assert sorted(c["check"] for c in checks if c["check"].startswith("credentials.")) == [
        "credentials.gemini", "credentials.kiro"]


def test_copilot_logs_in_with_a_token_in_env_or_the_github_cli_login(project: Path, limactl: FakeLima,
                                                                     home: Path) -> None:
    write(project / "agentbox.yml", "")
    write(home / ".config" / "agentbox" / "config.yml", "agents:\n  copilot:\n    model: gpt-5\n")
    line(doctor(project), "WARN", "copilot: not logged in on the host")

    write(home / ".config" / "gh" / "hosts.yml", "github.com:\n  user: me\n", mode=0o600)
    line(doctor(project), "OK", "copilot: uses the GitHub CLI's login (gh), which launches bring into the VM")
    write(home / ".config" / "agentbox" / "config.yml",
          "credentials:\n  gh: false\nagents:\n  copilot:\n    model: gpt-5\n")
    line(doctor(project), "WARN", "copilot: not logged in on the host")  # gh's login is not brought along

    write(home / ".config" / "agentbox" / "config.yml",
          "env:\n  COPILOT_GITHUB_TOKEN: github_pat_x\nagents:\n  copilot:\n    model: gpt-5\n")
    line(doctor(project), "OK", "copilot: logs in with COPILOT_GITHUB_TOKEN from the config's env")


def test_a_login_made_in_the_vm_counts_as_in_use(project: Path, limactl: FakeLima) -> None:
    needs_bwrap()
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    write(limactl.guest_home(NAME) / ".codex" / "auth.json", "{}", mode=0o600)
    result = doctor(project)
    line(result, "OK", "agents checked: codex (logged in in the VM)")
    line(result, "OK", "codex: not logged in on the host; the VM has its own login")


# -- settings changed since the VM was created --------------------------------------------------


def test_settings_changed_since_create_are_reported_until_recreated(project: Path, limactl: FakeLima, home: Path) -> None:
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    line(doctor(project), "OK", f"VM {NAME} was created with the current settings")

    write(home / ".config" / "agentbox" / "config.yml", "vm:\n  cpus: 2\n  memory: 4GiB\n")
    extra = write(home / "data" / "x", "")
    write(project / "agentbox.yml", f"mounts:\n  - location: {extra.parent}\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "WARN", f"changed since VM {NAME} was created, so the VM does not have them yet: mounts")
    assert "`agentbox start --recreate` creates it anew" in hint_after(result, "changed since VM")
    line(result, "WARN", f"cpus 4 -> 2, memory 8GiB -> 4GiB in the config: VM {NAME} gets them when it next starts")
    assert "`agentbox restart` applies them now" in hint_after(result, "gets them when it next starts")

    assert run_cli("start", "--recreate", "--yes", cwd=project).exit_code == 0
    result = doctor(project)
    line(result, "OK", f"VM {NAME} was created with the current settings")
    assert "changed since" not in result.stdout and "next starts" not in result.stdout


# -- CA bundles that are a whole trust store ------------------------------------------------------


def fake_system_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, public: int, local: int) -> Path:
    """A host whose OS ships `public` public roots and whose trust store adds `local` CAs of its own."""
    from agentbox.config import cacerts

    roots = [pem_stand_in(f"public root {index}") for index in range(public)]
    for index, pem in enumerate(roots):
        write(tmp_path / "mozilla" / f"root{index}.crt", pem)
    bundle = write(tmp_path / "etc" / "ca-certificates.crt",
                   "".join(roots) + "".join(pem_stand_in(f"local CA {index}") for index in range(local)))
    monkeypatch.setattr(cacerts, "PUBLIC_ROOTS", (str(tmp_path / "mozilla" / "*.crt"),))
    monkeypatch.setattr(cacerts, "SYSTEM_BUNDLES", ("/nonexistent/cert.pem", str(bundle)))
    return bundle


def pem_stand_in(name: str) -> str:
    body = name.encode().hex()
    return f"-----BEGIN CERTIFICATE-----\n{body[:64]}\n{body[64:]}\n-----END CERTIFICATE-----\n"


def test_node_extra_ca_certs_at_the_system_store_warns(project: Path, limactl: FakeLima, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = fake_system_store(tmp_path, monkeypatch, public=5, local=1)
    link = tmp_path / "my-certs.pem"
    link.symlink_to(bundle)
    write(project / "agentbox.yml", "")
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(bundle))
    result = doctor(project)
    assert result.exit_code == 0
    line(result, "WARN", f"NODE_EXTRA_CA_CERTS: {bundle} is the host's system trust store: 6 certificates; "
                         "the VM trusts the 5 public ones already, so a new VM gets only the 1 other")
    assert "`caCert`" in hint_after(result, "system trust store")

    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(link))  # found through a link too
    line(doctor(project), "WARN", f"NODE_EXTRA_CA_CERTS: {link} is the host's system trust store ({bundle}): ")


def test_a_file_with_over_100_certificates_warns(project: Path, limactl: FakeLima, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbox.config import cacerts

    monkeypatch.setattr(cacerts, "PUBLIC_ROOTS", ())
    monkeypatch.setattr(cacerts, "SYSTEM_BUNDLES", ())
    many = write(tmp_path / "many.pem", "".join(pem_stand_in(f"ca {index}") for index in range(101)))
    write(project / "agentbox.yml", "")
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(many))
    line(doctor(project), "WARN", f"NODE_EXTRA_CA_CERTS: {many} looks like a whole system trust store (more than "
                                  "100 certificates): 101 certificates; this host has no copy of the public roots "
                                  "to compare with, so a new VM gets all 101")
    write(tmp_path / "few.pem", "".join(pem_stand_in(f"ca {index}") for index in range(100)))
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(tmp_path / "few.pem"))
    line(doctor(project), "OK", f"NODE_EXTRA_CA_CERTS: 100 CA certificates from {tmp_path / 'few.pem'}")


def test_this_hosts_own_trust_store_is_recognised(project: Path, limactl: FakeLima, monkeypatch) -> None:
    """On a Debian-family host: the real OS bundle, compared with the real public roots."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.is_file() or not list(Path("/usr/share/ca-certificates/mozilla").glob("*.crt")):
        pytest.skip("not a Debian-family host")
    write(project / "agentbox.yml", "")
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(bundle))
    warning = line(doctor(project), "WARN", f"NODE_EXTRA_CA_CERTS: {bundle} is the host's system trust store: ")
    assert "public ones already, so a new VM gets" in warning or "a new VM gets none of them" in warning
    template = run_cli("template", cwd=project)
    assert template.exit_code == 0
    assert template.stdout.count("BEGIN CERTIFICATE") < 10  # the local additions at most, not ~140 public roots


def test_a_healthy_setup_has_no_warning_about_agents_not_in_use(project: Path, limactl: FakeLima, home: Path) -> None:
    """One agent logged in on the host and launched: doctor says nothing of the others' missing logins (a
    broker's note of a missing login is for the agents in use only)."""
    claude_logged_in_and_launched(project, home)
    result = doctor(project)
    assert result.exit_code == 0, result.stdout
    warnings = [text for text in result.stdout.splitlines() if text.startswith("  WARN")]
    assert warnings == [], result.stdout
    assert "Codex" not in result.stdout and "GitHub CLI" not in result.stdout and "Gemini" not in result.stdout
    net = run_cli("net", "status", cwd=project)
    assert net.exit_code == 0 and "no login on the host" not in net.stdout, net.stdout
