"""A VM whose start Lima reports degraded, and one whose provisioning did not finish (issue 27, item 13): the
degraded start is remembered in the VM's state and said at every launch (no limactl call added) until a start
finishes cleanly; `agentbox doctor` reports both. Through the CLI against the limactl double."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import NAME, FakeLima, run_agentbox, run_cli

SAID = f"Lima reported the last start of {NAME} degraded"


def checks(project: Path) -> dict[str, dict]:
    result = run_cli("doctor", "--json", cwd=project)
    return {check["check"]: check for check in json.loads(result.stdout)}


def test_a_degraded_start_is_said_at_every_launch_until_a_start_finishes_cleanly(
    project: Path, vm: FakeLima, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli("stop", cwd=project).exit_code == 0
    monkeypatch.setenv("FAKE_LIMACTL_START_DEGRADED", "1")  # degraded whatever the cause: here no probe failed
    started = run_cli("start", cwd=project)
    assert started.exit_code == 1
    assert "Lima reports it degraded" in started.stderr and "`agentbox restart`" in started.stderr
    assert vm.status(NAME) == "Running"  # Lima leaves a degraded VM running
    monkeypatch.delenv("FAKE_LIMACTL_START_DEGRADED")

    for calls in (["list", "shell"], ["shell"]):  # every launch says it, from agentbox's own state: no extra call
        vm.clear()
        launch = run_agentbox("shell", "--", "true", cwd=project)
        assert launch.returncode == 0, launch.stderr
        assert SAID in launch.stderr and "`agentbox restart` starts it again" in launch.stderr
        assert vm.subcommands() == calls
    assert SAID in run_cli("start", cwd=project).stderr  # "already running" says it too
    assert checks(project)["vm.degraded"]["status"] == "WARN"

    restarted = run_cli("restart", cwd=project)
    assert restarted.exit_code == 0, restarted.stderr
    vm.clear()
    launch = run_agentbox("shell", "--", "true", cwd=project)
    assert launch.returncode == 0 and "degraded" not in launch.stderr, launch.stderr
    assert vm.subcommands() == ["list", "shell"]
    assert "vm.degraded" not in checks(project)


def test_doctor_reports_a_vm_whose_provisioning_did_not_finish(project: Path, vm: FakeLima) -> None:
    assert checks(project)["vm.provisioning"]["status"] == "OK"
    # What a boot whose provisioning stopped halfway leaves: the mark of this boot was never written.
    (vm.guest_home(NAME) / ".agentbox" / "provisioned").write_text("an-earlier-boot\n")
    found = checks(project)["vm.provisioning"]
    assert found["status"] == "FAIL"
    assert found["message"] == (f"{NAME}'s provisioning did not finish at its last start, so tools it installs "
                                "(node, npm, gh, docker) may be missing")
    assert "cloud-init-output.log" in found["hint"] and "`agentbox restart`" in found["hint"]
