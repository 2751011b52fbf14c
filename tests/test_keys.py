"""Each config key is described once (agentbox/config/keys.py); what derives from it stays in step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox.config import keys, trust
from agentbox.config import load as config
from agentbox.vm import drift
from tests.helpers import FakeLima, needs_bwrap, run_cli, write, write_trusted

REPO = Path(__file__).resolve().parent.parent


def test_the_documented_key_table_is_the_generated_one() -> None:
    page = (REPO / "docs" / "configuration.md").read_text()
    start = page.index("<!-- BEGIN generated")
    table = page[page.index("\n", start) + 1 : page.index("<!-- END generated -->")]
    assert table == keys.readme_table(), "run `python3 docs/gen_configuration.py` to rewrite docs/configuration.md"


def test_the_example_documents_every_key() -> None:
    example = (REPO / "agentbox.yml.example").read_text()
    missing = [
        keys.dotted(path)
        for path, key in keys.walk()
        if key.documented and not re.search(rf"(^|[\s#-]){re.escape(path[-1])}:", example, re.M)
    ]
    assert missing == []


def test_built_in_defaults_come_from_the_key_table(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTBOX_VM_BASE")  # the suite's override of vm.base (tests/conftest.py)
    assert keys.defaults() == config.DEFAULTS
    shown = config.load(project).to_json()
    for path, key in keys.walk():
        if key.default is keys.UNSET or "<name>" in path or "[]" in path or path[0] == "credentials":
            continue
        value = shown
        for part in path:
            value = value[part]
        assert value == key.default, keys.dotted(path)


def test_every_rule_key_has_its_rule_and_every_trust_key_says_why() -> None:
    for path, key in keys.trust_rules():
        assert key.why, keys.dotted(path)
        if key.trust == keys.RULE:
            assert keys.dotted(path) in trust._RULES, keys.dotted(path)


# A change for every creation-only setting, by its fingerprint name. A key marked `creation` without a
# sample here fails the test below: its drift note would be untested.
CHANGES = {
    "cpus": "vm:\n  cpus: 2\n",
    "memory": "vm:\n  memory: 4GiB\n",
    "disk": "vm:\n  disk: 40GiB\n",
    "vmType": "vm:\n  vmType: qemu\n",
    "arch": "vm:\n  arch: aarch64\n",
    "mountType": "vm:\n  mountType: 9p\n",
    "template": "vm:\n  template: t.j2\n",
    "image": "vm:\n  image: disk.qcow2\n",
    "lima": "vm:\n  lima:\n    timezone: UTC\n",
    "protectGitHooks": "vm:\n  protectGitHooks: true\n",
    "mounts": "mounts:\n  - location: ./docs\n",
    "caCert": "caCert: ca.pem\n",
    "mode": "session:\n  mode: isolated\n",
}


def test_every_creation_setting_has_a_sample_change(project: Path) -> None:
    assert set(drift.creation_fingerprint(config.load(project))) == set(CHANGES)


IN_PLACE = {"cpus", "memory", "disk"}  # Lima changes them on the stopped VM (tests/test_resources.py)


def test_the_settings_lima_changes_in_place_are_marked_so() -> None:
    assert drift.restart_settings() == IN_PLACE
    assert all(not key.creation for path, key in keys.walk() if path[-1] in IN_PLACE and path[0] == "vm")


@pytest.mark.parametrize("name", sorted(set(CHANGES) - IN_PLACE))
def test_a_changed_creation_setting_asks_for_recreate(project: Path, limactl: FakeLima, name: str) -> None:
    needs_bwrap()
    (project / "docs").mkdir()
    (project / ".git" / "hooks").mkdir(parents=True)
    write(project / "t.j2", (REPO / "templates" / "lima.yaml.j2").read_text())
    write(project / "disk.qcow2", "QFI")
    write(project / "ca.pem", "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUTEST\n-----END CERTIFICATE-----\n")
    write(project / "agentbox.yml", "")
    assert run_cli("start", cwd=project).exit_code == 0
    write_trusted(project, CHANGES[name])
    result = subprocess.run([sys.executable, "-m", "agentbox", "shell", "--", "true"], cwd=project,
                            capture_output=True, text=True, timeout=120)
    if name == "mode":  # isolation asked of a live VM is never dropped: the launch refuses, naming the fix
        assert result.returncode == 1
        assert "was created live" in result.stderr and "`agentbox start --recreate`" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert f"agentbox: {name} changed since agentbox-myproject was created; `agentbox start --recreate` applies it\n" in (
        result.stderr
    )
