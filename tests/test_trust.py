"""A project's agentbox.yml may not widen what the VM gets until the user trusts that exact content."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FakeLima, run_cli, write

RISKY = [
    ("sync:\n  remoteWrite: true\n", "sync.remoteWrite"),
    ("mounts:\n  - location: /srv/data\n", "mounts: /srv/data (outside the workspace)"),
    ("mounts:\n  - location: ./cache\n    writable: true\n", "(writable)"),
    ("vm:\n  name: agentbox-other\n", "vm.name"),
    ("vm:\n  template: t.j2\n", "vm.template"),
    ("vm:\n  lima:\n    timezone: UTC\n", "vm.lima"),
    ("caCert: ca.pem\n", "caCert"),
    ("agents:\n  claude:\n    binary: /tmp/evil\n", "agents.claude.binary"),
    ("agents:\n  aider:\n    binary: aider\n    install: curl x | sh\n", "agents.aider.install"),
    ("agents:\n  codex:\n    vmName: agentbox-victim\n", "agents.codex.vmName"),
    ("agents:\n  codex:\n    credentials: [~/.aws/credentials]\n", "agents.codex.credentials"),
    ("credentials:\n  netrc: true\n", "credentials.netrc"),
    ("workspace: ../elsewhere\n", "workspace:"),
]


@pytest.mark.parametrize(("text", "listed"), RISKY)
def test_risky_local_config_is_refused_until_trusted(project: Path, limactl: FakeLima, text: str, listed: str) -> None:
    (project.parent / "elsewhere").mkdir(exist_ok=True)
    (project / "cache").mkdir()
    write(project / "agentbox.yml", text)
    result = run_cli("start", cwd=project)
    assert result.exit_code == 2
    assert listed in result.stderr
    assert "agentbox -C" in result.stderr and " trust`" in result.stderr
    assert limactl.calls() == []  # nothing listed, created or started


def test_trust_then_edit_revokes(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    show = run_cli("trust", "--show", cwd=project)
    assert show.exit_code == 0
    assert "never been trusted" in show.stdout and "remoteWrite: true" in show.stdout
    assert "sync.remoteWrite" in show.stdout
    assert run_cli("trust", cwd=project).exit_code == 0
    assert run_cli("start", cwd=project).exit_code == 0

    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\nmounts:\n  - location: /srv\n")
    diff = run_cli("trust", "--show", cwd=project)
    assert "+mounts:" in diff.stdout and "(last trusted)" in diff.stdout
    refused = run_cli("stop", cwd=project)
    assert refused.exit_code == 2
    assert "changed since you trusted it" in refused.stderr
    assert limactl.status("agentbox-myproject") == "Running"


def test_harmless_local_config_needs_no_trust(project: Path, limactl: FakeLima) -> None:
    (project / "setup.sh").write_text("true\n")
    write(
        project / "agentbox.yml",
        "vm:\n  cpus: 2\n  memory: 4GiB\nenv:\n  A: b\nbootstrap:\n  onStartScript: setup.sh\n"
        "agents:\n  claude:\n    model: opus\nmounts:\n  - location: ./docs\n",
    )
    (project / "docs").mkdir()
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr


def test_global_config_is_always_trusted(project: Path, home: Path, limactl: FakeLima) -> None:
    write(home / ".config" / "agentbox" / "config.yml", "sync:\n  remoteWrite: true\nmounts:\n  - location: /srv\n")
    assert run_cli("start", cwd=project).exit_code == 0


def test_config_and_template_show_an_untrusted_config_marked(project: Path, limactl: FakeLima) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    for args in (["config"], ["config", "--json"], ["template"]):
        result = run_cli(*args, cwd=project)
        assert result.exit_code == 0
        assert "UNTRUSTED" in result.stderr
    assert limactl.calls() == []


def test_trust_record_lives_outside_the_workspace(project: Path, isolated_env) -> None:
    write(project / "agentbox.yml", "sync:\n  remoteWrite: true\n")
    assert run_cli("trust", cwd=project).exit_code == 0
    records = list((isolated_env["state"] / "trust").iterdir())
    assert len(records) == 1
    assert not any(p.name.endswith(".json") for p in project.rglob("*"))


def test_trusted_local_may_run_a_host_bootstrap_script(project: Path, home: Path, limactl: FakeLima) -> None:
    write(home / "setup.sh", "true\n")
    write(project / "agentbox.yml", "bootstrap:\n  onStartScript: ~/setup.sh\n")
    refused = run_cli("start", cwd=project)
    assert refused.exit_code == 2 and "bootstrap.onStartScript" in refused.stderr
    assert run_cli("trust", cwd=project).exit_code == 0
    assert run_cli("start", cwd=project).exit_code == 0
