"""The guest's trust in the credential broker's CA (issue 26): staged by agentbox.session.staging (the certificate,
never its key), installed by launch.sh's broker part (provision/launch/broker.sh) with root's
update-ca-certificates only when it changed, the variables Node, Python and OpenSSL read pointed at the system
bundle, removed when the VM's credentials are no longer brokered, and a launch that cannot install it stops with
the reason. Through the CLI against the limactl double (its guest's update-ca-certificates is Debian's, see
tests/fake_limactl/guest_tools/tools.py); tests/test_real_distro.py has the real one and real TLS clients.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentbox import paths, staginglayout
from agentbox.net import certauthority
from agentbox.session import staging
from tests.helpers import NAME, FakeLima, needs, staged_logins, write_trusted

REPO = Path(__file__).resolve().parent.parent
BROKER_SH = REPO / "provision" / "launch" / "broker.sh"
HOSTS = ("api.anthropic.com", "github.com")  # for the staging unit test
VARIABLES = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
VARIABLES = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")

def launch(project: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """agentbox in a child process; what the stub agent saw (its env), or {} when it never ran."""
    out = project / ".stub-out.json"
    out.unlink(missing_ok=True)
    result = subprocess.run([sys.executable, "-m", "agentbox", *args], cwd=project, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=120)
    return result, json.loads(out.read_text()) if out.exists() else {}


def broker_on(home: Path) -> None:
    """The default again (the global config without `credentials.broker: false`)."""
    (home / ".config" / "agentbox" / "config.yml").unlink(missing_ok=True)


def guest_path(vm: FakeLima, path: str) -> Path:
    top, _, rest = path.lstrip("/").partition("/")
    if top == "usr" and rest.startswith("local/"):
        return vm.home / NAME / "guestfs" / "usr-local" / rest[len("local/"):]
    return vm.home / NAME / "guestfs" / top / rest


def stamp(vm: FakeLima) -> Path:
    return vm.guest_home(NAME) / ".agentbox" / "broker-ca.sha256"


@pytest.fixture
def brokered(project: Path, vm: FakeLima) -> FakeLima:
    needs("openssl")
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n")
    return vm


def test_the_ca_lands_in_the_trust_store_and_the_agent_gets_the_variables(project: Path, brokered: FakeLima,
                                                                         home: Path) -> None:
    staged_logins(home)
    plain, seen = launch(project, "claude")  # the control: no broker, no CA, nothing installed, no variable
    assert plain.returncode == 0, plain.stderr
    installed = guest_path(brokered, staginglayout.GUEST_BROKER_CA)
    assert not installed.exists() and not (paths.staging_dir(NAME) / staginglayout.BROKER).exists()
    assert not set(VARIABLES) & set(seen["env"])

    broker_on(home)
    result, seen = launch(project, "claude")
    assert result.returncode == 0, result.stderr
    authority = certauthority.load(NAME)
    assert authority is not None
    pem = authority.cert_pem()
    assert installed.read_text() == pem and installed.stat().st_mode & 0o777 == 0o644
    assert pem in guest_path(brokered, staginglayout.GUEST_CA_BUNDLE).read_text()
    assert os.readlink(guest_path(brokered, "/etc/ssl/certs/agentbox-broker.pem")) == staginglayout.GUEST_BROKER_CA
    assert {name: seen["env"].get(name) for name in VARIABLES} == dict.fromkeys(VARIABLES, staginglayout.GUEST_CA_BUNDLE)
    assert "update-ca-certificates" not in result.stdout + result.stderr and "Updating certificates" not in result.stdout
    # The certificate is staged, the key is not: no file of the staging folder holds any of the CA's private keys.
    staged = paths.staging_dir(NAME) / staginglayout.BROKER_CA
    assert staged.read_text() == pem and staged.stat().st_mode & 0o777 == 0o600
    keys = [authority.key.read_text(), *(leaf.key.read_text() for leaf in authority.leaves.values())]
    for path in paths.staging_dir(NAME).rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "PRIVATE KEY" not in text and not any(key.strip() in text for key in keys), path


def test_an_unchanged_ca_costs_the_next_launch_no_sudo(project: Path, brokered: FakeLima) -> None:
    assert launch(project, "claude")[0].returncode == 0
    # From now on every sudo in the VM fails (the double's sudo reaches guest root through this socket): a launch
    # that installs nothing still works and still exports the variables.
    write_trusted(project, f"env:\n  AGENTBOX_TEST_OUT: {project / '.stub-out.json'}\n  FAKE_LIMACTL_SUDO: /nonexistent\n")
    result, seen = launch(project, "claude")
    assert result.returncode == 0, result.stderr
    assert "broker's CA" not in result.stderr and "trust store" not in result.stderr
    assert seen["env"]["SSL_CERT_FILE"] == staginglayout.GUEST_CA_BUNDLE

    # A new CA (the old one gone: new key, new certificate) must be trusted, and sudo fails: the VM trusts it
    # through the variables, from a bundle in the guest's state folder, and says so.
    old = guest_path(brokered, staginglayout.GUEST_BROKER_CA).read_text()
    certauthority.remove(NAME)
    result, seen = launch(project, "claude")
    assert result.returncode == 0, result.stderr
    renewed = certauthority.load(NAME)
    assert renewed is not None and renewed.cert_pem() != old
    bundle = "/home/lima.guest/.agentbox/broker-ca-bundle.crt"  # the double's guest home, as the VM sees it
    assert {name: seen["env"].get(name) for name in (*VARIABLES, "GIT_SSL_CAINFO")} == dict.fromkeys(
        (*VARIABLES, "GIT_SSL_CAINFO"), bundle)
    assert renewed.cert_pem() in (brokered.guest_home(NAME) / ".agentbox" / "broker-ca-bundle.crt").read_text()
    assert "no passwordless sudo in the VM" in result.stderr
    assert stamp(brokered).read_text().startswith("user ")


def test_a_ca_the_guest_cannot_install_stops_the_launch_with_the_reason(project: Path, brokered: FakeLima) -> None:
    # A guest without the ca-certificates package: no /usr/local/share/ca-certificates (a file stands in its way).
    share = guest_path(brokered, "/usr/local/share/ca-certificates")
    shutil.rmtree(share, ignore_errors=True)
    share.write_text("not a folder\n")
    result, seen = launch(project, "claude")
    assert result.returncode == staginglayout.BROKER_CA_FAILED and seen == {}, result.stderr
    reason = r"could not be installed in the VM's trust store \(\S+\): mkdir: cannot create directory .+: File exists"
    assert re.search(reason, result.stderr), result.stderr
    assert "so the launch stops" in result.stderr and "agentbox start --recreate" in result.stderr
    assert not stamp(brokered).exists()
    share.unlink()
    share.mkdir()
    fixed, seen = launch(project, "claude")  # the control: the same launch once the folder is there
    assert fixed.returncode == 0, fixed.stderr
    assert seen["env"]["NODE_EXTRA_CA_CERTS"] == staginglayout.GUEST_CA_BUNDLE and stamp(brokered).exists()


def test_a_launch_without_the_broker_removes_the_ca_installed(project: Path, brokered: FakeLima, home: Path) -> None:
    assert launch(project, "claude")[0].returncode == 0
    authority = certauthority.load(NAME)
    assert authority is not None
    pem = authority.cert_pem()
    bundle = guest_path(brokered, staginglayout.GUEST_CA_BUNDLE)
    assert pem in bundle.read_text() and stamp(brokered).exists()
    staged_logins(home)
    result, seen = launch(project, "claude")
    assert result.returncode == 0, result.stderr
    assert not guest_path(brokered, staginglayout.GUEST_BROKER_CA).exists() and not stamp(brokered).exists()
    assert pem not in bundle.read_text() and "BEGIN CERTIFICATE" in bundle.read_text()  # the others stay
    assert not os.path.lexists(guest_path(brokered, "/etc/ssl/certs/agentbox-broker.pem"))
    assert not set(VARIABLES) & set(seen["env"])
    assert not (paths.staging_dir(NAME) / staginglayout.BROKER).exists()


def test_staging_writes_the_certificate_only_when_it_changed_and_removes_it(tmp_path: Path) -> None:
    needs("openssl")
    authority = certauthority.ensure("vm-one", HOSTS)
    staging.stage_broker_ca(tmp_path, authority)
    staged, digest = tmp_path / staginglayout.BROKER_CA, tmp_path / staginglayout.BROKER_CA_DIGEST
    import hashlib

    assert digest.read_text() == hashlib.sha256(staged.read_bytes()).hexdigest() + "\n"
    before = staged.stat().st_ino
    staging.stage_broker_ca(tmp_path, authority)
    assert staged.stat().st_ino == before  # unchanged: not rewritten
    staging.stage_broker_ca(tmp_path, None)
    assert not (tmp_path / staginglayout.BROKER).exists()


# -- the part on its own ---------------------------------------------------------------------------------------


def test_the_part_names_the_contract_s_paths_and_exit_code() -> None:
    text = BROKER_SH.read_text()
    assert f"broker_ca_file={staginglayout.GUEST_BROKER_CA} " in text
    assert f"broker_ca_bundle={staginglayout.GUEST_CA_BUNDLE} " in text
    assert f"broker_ca_failed={staginglayout.BROKER_CA_FAILED} " in text


def test_the_warm_path_runs_no_program(tmp_path: Path) -> None:
    """With the stamp matching and the certificate in place, apply_broker_ca finds nothing to run: PATH holds no
    program at all and it still exports the variables. The control: a changed digest needs sudo, which is not
    there, so the CA is trusted through a bundle in the state folder, made with bash alone."""
    stage = tmp_path / "staging"
    (stage / "broker").mkdir(parents=True)
    (stage / "broker" / "ca.crt").write_text("certificate\n")
    (stage / "broker" / "ca.sha256").write_text("abc\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "broker-ca.sha256").write_text("system abc\n")
    installed = tmp_path / "agentbox-broker.crt"
    installed.write_text("certificate\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    program = (f"set -euo pipefail\nstaging={stage}\nstate={state}\nsource {REPO / 'provision/launch/common.sh'}\n"
               f"source {BROKER_SH}\nbroker_ca_file={installed}\nPATH={empty}\napply_broker_ca\n"
               'printf "%s\\n" "$NODE_EXTRA_CA_CERTS" "$SSL_CERT_FILE" "$REQUESTS_CA_BUNDLE"\n')
    bash = shutil.which("bash") or "/bin/bash"
    warm = subprocess.run([bash, "-c", program], capture_output=True, text=True, timeout=30)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == f"{staginglayout.GUEST_CA_BUNDLE}\n" * 3 and warm.stderr == ""
    (stage / "broker" / "ca.sha256").write_text("def\n")
    changed = subprocess.run([bash, "-c", program], capture_output=True, text=True, timeout=30)
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout == f"{state / 'broker-ca-bundle.crt'}\n" * 3
    assert (state / "broker-ca-bundle.crt").read_text().endswith("certificate\n")
    assert (state / "broker-ca.sha256").read_text() == "user def\n"
