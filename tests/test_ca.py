"""`agentbox ca ls` and `agentbox ca add` (against a fake macOS `security` first on PATH)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentbox.config import cacerts
from tests.helpers import run_cli, write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)

SYSTEM_KEYCHAIN = "/Library/Keychains/System.keychain"


def make_pem(directory: Path, common_name: str) -> str:
    """A real self-signed certificate when openssl is there, else a PEM-shaped stand-in."""
    openssl = shutil.which("openssl")
    if openssl is None:
        body = common_name.encode().hex()
        return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"
    directory.mkdir(parents=True, exist_ok=True)
    cert = directory / f"{common_name.replace(' ', '_')}.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(directory / "key.pem"), "-out", str(cert), "-days", "30", "-subj", f"/CN={common_name}"],
        check=True, capture_output=True,
    )
    return cert.read_text()


def keychain_record(label: str | None) -> str:
    """One certificate as `security find-certificate -a` prints it."""
    labl = f'"labl"<blob>="{label}"' if label is not None else '"labl"<blob>=<NULL>'
    return (
        f'keychain: "{SYSTEM_KEYCHAIN}"\nversion: 512\nclass: 0x80001000 \nattributes:\n'
        f'    "alis"<blob>="{label}"\n    "cenc"<uint32>=0x00000003 \n    "ctyp"<uint32>=0x00000001 \n'
        f'    "hpky"<blob>=0x0102030405  "\\001\\002"\n    {labl}\n    "subj"<blob>=0x3021  "0!"\n'
    )


@pytest.fixture
def keychain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A fake `security` listing four certificates (two of them Apple's); sys.platform is darwin."""
    names = ["Corp Root CA", "com.apple.systemdefault", "Apple Worldwide Developer Relations", "Proxy CA"]
    pems = {name: make_pem(tmp_path / "certs", name) for name in names}
    data = tmp_path / "keychain"
    write(data / "pems", "".join(pems.values()))
    write(data / "labels", "".join(keychain_record(name) for name in names))
    bin_dir = tmp_path / "fakebin"
    write(
        bin_dir / "security",
        "#!/bin/sh\n"
        f'echo "$*" >> "{data}/calls"\n'
        f'for a in "$@"; do [ "$a" = "-p" ] && exec cat "{data}/pems"; done\n'
        f'exec cat "{data}/labels"\n',
        mode=0o755,
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sys, "platform", "darwin")
    return pems


# -- ca ls -------------------------------------------------------------------------------------


def test_ls_with_nothing_configured_says_how_to_add(project: Path) -> None:
    result = run_cli("ca", "ls", cwd=project)
    assert result.exit_code == 0
    assert "No CA certificates are configured" in result.stdout
    assert "caCert: /path/to.pem" in result.stdout and "agentbox ca add" in result.stdout


def test_ls_shows_local_global_and_env(project: Path, home: Path, tmp_path: Path, monkeypatch) -> None:
    corp, proxy = make_pem(tmp_path / "c", "Corp Root CA"), make_pem(tmp_path / "p", "Proxy CA")
    write(project / "certs" / "corp.pem", corp + proxy)
    write(project / "agentbox.yml", "caCert: certs/corp.pem\n")
    global_file = write(home / ".config" / "agentbox" / "config.yml", "caCert: ~/missing.pem\n")
    env_pem = write(tmp_path / "node.pem", proxy)
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(env_pem))

    result = run_cli("ca", "ls", cwd=project)
    assert result.exit_code == 0
    out = result.stdout
    assert f"caCert in the global config ({global_file}): {home / 'missing.pem'}" in out
    assert "not used here: the local config's caCert overrides it" in out
    assert "the file does not exist" in out
    local = f"caCert in the local config ({project / 'agentbox.yml'}): {project / 'certs' / 'corp.pem'}\n"
    assert local + "  the file is not trusted: launches refuse it until you run `agentbox trust`\n  2 certificates" in out
    assert run_cli("trust", cwd=project).exit_code == 0
    out = run_cli("ca", "ls", cwd=project).stdout
    assert local + "  2 certificates" in out
    assert f"NODE_EXTRA_CA_CERTS on the host (the VM gets these too): {env_pem}\n  1 certificate\n" in out
    assert "agentbox start --recreate" in out


@pytest.mark.needs("openssl")
def test_ls_json_carries_what_the_text_shows(project: Path, home: Path, tmp_path: Path) -> None:
    corp, proxy = make_pem(tmp_path / "c", "Corp Root CA"), make_pem(tmp_path / "p", "Proxy CA")
    write(project / "certs" / "corp.pem", corp + proxy)
    write(project / "agentbox.yml", "caCert: certs/corp.pem\n")
    global_file = write(home / ".config" / "agentbox" / "config.yml", "caCert: ~/missing.pem\n")
    result = run_cli("ca", "ls", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    sources = json.loads(result.stdout)["sources"]
    expires = [cert["expires"] for cert in sources[1]["certificates"]]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", when) for when in expires), expires
    assert sources == [
        {"origin": "global", "configFile": str(global_file), "path": str(home / "missing.pem"), "used": False,
         "trusted": None, "exists": False, "error": None, "count": 0, "certificates": []},
        {"origin": "local", "configFile": str(project / "agentbox.yml"), "path": str(project / "certs" / "corp.pem"),
         "used": True, "trusted": False, "exists": True, "error": None, "count": 2,
         "certificates": [{"subject": "CN = Corp Root CA", "expires": expires[0], "expired": False},
                          {"subject": "CN = Proxy CA", "expires": expires[1], "expired": False}]},
    ]
    text = run_cli("ca", "ls", cwd=project).stdout  # the same facts as the text
    assert "not used here" in text and "the file does not exist" in text and "  2 certificates" in text
    assert "1. CN = Corp Root CA; expires " in text and "is not trusted" in text
    assert run_cli("trust", cwd=project).exit_code == 0
    assert json.loads(run_cli("ca", "ls", "--json", cwd=project).stdout)["sources"][1]["trusted"] is True
    empty = run_cli("ca", "ls", "--json", cwd=home)
    assert json.loads(empty.stdout) == {"sources": [{**sources[0], "used": True}]}


@pytest.mark.needs("openssl")
def test_ls_names_each_certificate_when_openssl_is_there(project: Path, tmp_path: Path) -> None:
    corp, proxy = make_pem(tmp_path / "c", "Corp Root CA"), make_pem(tmp_path / "p", "Proxy CA")
    write(project / "corp.pem", corp + proxy)
    write(project / "agentbox.yml", "caCert: corp.pem\n")
    lines = run_cli("ca", "ls", cwd=project).stdout.splitlines()
    listed = lines[lines.index("  2 certificates") + 1:][:2]
    assert [line.split("; expires ")[0] for line in listed] == ["    1. CN = Corp Root CA", "    2. CN = Proxy CA"]


def test_ls_without_openssl_shows_the_count_only(project: Path, tmp_path: Path, monkeypatch) -> None:
    write(project / "corp.pem", make_pem(tmp_path / "c", "Corp Root CA") + make_pem(tmp_path / "p", "Proxy CA"))
    write(project / "agentbox.yml", "caCert: corp.pem\n")
    monkeypatch.setenv("PATH", str(tmp_path / "no-openssl-here"))
    out = run_cli("ca", "ls", cwd=project).stdout
    assert "  2 certificates\n" in out
    assert not [line for line in out.splitlines() if line.startswith("    1.")]


def test_ls_reports_a_missing_used_file_and_one_without_pem(project: Path, home: Path) -> None:
    write(project / "agentbox.yml", "caCert: nope.pem\n")
    result = run_cli("ca", "ls", cwd=project)
    assert result.exit_code == 0
    assert "the file does not exist: creating the VM fails until you fix it" in result.stdout
    write(project / "nope.pem", "not a certificate\n")
    result = run_cli("ca", "ls", cwd=project)
    assert "holds no PEM certificate" in result.stdout


# -- ca add ------------------------------------------------------------------------------------


def test_add_is_macos_only(project: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    result = run_cli("ca", "add", "--all", cwd=project)
    assert result.exit_code == 1
    assert "agentbox ca add reads the macOS System keychain; on Linux put your PEM file's path in `caCert:`" in result.stderr
    assert not (project / "agentbox.yml").exists()


def test_add_all_to_the_local_config(project: Path, keychain: dict[str, str], tmp_path: Path) -> None:
    write(project / "agentbox.yml", "# my project\nvm:\n  cpus: 2  # small\n")
    result = run_cli("ca", "add", "--all", cwd=project)
    assert result.exit_code == 0, result.stderr
    pem_file = project / "agentbox-ca.pem"
    text = pem_file.read_text()
    assert cacerts.pem_blocks(text) == [keychain["Corp Root CA"], keychain["Proxy CA"]]
    assert "# Corp Root CA\n" in text
    assert os.stat(pem_file).st_mode & 0o777 == 0o644
    assert (project / "agentbox.yml").read_text() == f'# my project\nvm:\n  cpus: 2  # small\ncaCert: "{pem_file}"\n'
    assert (project / ".gitignore").read_text() == "agentbox-ca.pem\n"
    assert f"Wrote 2 certificates to {pem_file}" in result.stdout
    assert "now needs your trust" in result.stdout and "`agentbox trust`" in result.stdout
    assert "agentbox start --recreate" in result.stdout
    calls = (tmp_path / "keychain" / "calls").read_text().splitlines()
    assert calls == [f"find-certificate -a -p {SYSTEM_KEYCHAIN}", f"find-certificate -a {SYSTEM_KEYCHAIN}"]
    shown = run_cli("config", "--json", cwd=project)
    assert f'"caCert": "{pem_file}"' in shown.stdout


def test_add_select_replaces_the_caCert_line(project: Path, keychain: dict[str, str]) -> None:
    write(project / "agentbox.yml", "# settings\ncaCert: >-\n  old.pem\nvm:\n  cpus: 2\n")
    write(project / ".gitignore", "node_modules")
    result = run_cli("ca", "add", "--select", "2", cwd=project)
    assert result.exit_code == 0, result.stderr
    pem_file = project / "agentbox-ca.pem"
    assert cacerts.pem_blocks(pem_file.read_text()) == [keychain["Proxy CA"]]
    assert (project / "agentbox.yml").read_text() == f'# settings\ncaCert: "{pem_file}"\nvm:\n  cpus: 2\n'
    assert "(it was old.pem)" in result.stdout
    assert (project / ".gitignore").read_text() == "node_modules\nagentbox-ca.pem\n"
    # Again: the same result, nothing added twice.
    assert run_cli("ca", "add", "--select", "2", cwd=project).exit_code == 0
    assert (project / ".gitignore").read_text() == "node_modules\nagentbox-ca.pem\n"
    assert (project / "agentbox.yml").read_text().count("caCert") == 1


def test_add_creates_the_local_config_when_there_is_none(project: Path, keychain: dict[str, str]) -> None:
    result = run_cli("ca", "add", "--select", "1", cwd=project)
    assert result.exit_code == 0, result.stderr
    config = project / "agentbox.yml"
    assert config.read_text() == f'caCert: "{project / "agentbox-ca.pem"}"\n'
    assert os.stat(config).st_mode & 0o777 == 0o644


def test_add_without_a_terminal_lists_and_asks_for_a_choice(project: Path, keychain: dict[str, str]) -> None:
    result = run_cli("ca", "add", cwd=project)
    assert result.exit_code == 1
    assert "  1. Corp Root CA\n  2. Proxy CA\n" in result.stderr
    assert "Apple" not in result.stderr.split("hint:")[0].split("left out")[1]
    assert "--all" in result.stderr and "--select" in result.stderr
    assert not (project / "agentbox-ca.pem").exists() and not (project / "agentbox.yml").exists()


def test_add_asks_on_a_terminal(project: Path, keychain: dict[str, str], monkeypatch) -> None:
    from agentbox.cli.commands import ca

    monkeypatch.setattr(ca, "_interactive", lambda: True)
    result = run_cli("ca", "add", cwd=project, input="7\n2\n")
    assert result.exit_code == 0, result.stderr
    assert "Please give numbers from 1 to 2" in result.stderr
    assert cacerts.pem_blocks((project / "agentbox-ca.pem").read_text()) == [keychain["Proxy CA"]]

    result = run_cli("ca", "add", cwd=project, input="\n")  # Enter = all
    assert result.exit_code == 0
    assert len(cacerts.pem_blocks((project / "agentbox-ca.pem").read_text())) == 2


def test_add_cancel_writes_nothing(project: Path, keychain: dict[str, str], monkeypatch) -> None:
    from agentbox.cli.commands import ca

    monkeypatch.setattr(ca, "_interactive", lambda: True)
    result = run_cli("ca", "add", cwd=project, input="q\n")
    assert result.exit_code == 0
    assert "nothing was written" in result.stderr
    assert not (project / "agentbox-ca.pem").exists() and not (project / "agentbox.yml").exists()


def test_add_global_uses_the_xdg_config(project: Path, home: Path, keychain: dict[str, str], monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    write(project / "agentbox.yml", "caCert: mine.pem\n")
    write(project / "mine.pem", keychain["Corp Root CA"])
    result = run_cli("ca", "add", "--global", "--all", cwd=project)
    assert result.exit_code == 0, result.stderr
    pem_file = home / "xdg" / "agentbox" / "ca-certificates.pem"
    assert len(cacerts.pem_blocks(pem_file.read_text())) == 2
    assert (home / "xdg" / "agentbox" / "config.yml").read_text() == f'caCert: "{pem_file}"\n'
    assert (project / "agentbox.yml").read_text() == "caCert: mine.pem\n"
    assert not (project / ".gitignore").exists()
    assert "sets its own caCert" in result.stdout


def test_add_leaves_a_config_it_cannot_edit_alone(project: Path, keychain: dict[str, str]) -> None:
    write(project / "agentbox.yml", "{vm: {cpus: 2}}\n")
    result = run_cli("ca", "add", "--all", cwd=project)
    assert result.exit_code == 1
    assert "it was not changed" in result.stderr
    assert f'caCert: "{project / "agentbox-ca.pem"}"' in result.stderr
    assert (project / "agentbox.yml").read_text() == "{vm: {cpus: 2}}\n"


def test_add_bad_selection_is_a_usage_error(project: Path, keychain: dict[str, str]) -> None:
    result = run_cli("ca", "add", "--select", "3", cwd=project)
    assert result.exit_code == 2
    assert "give numbers from 1 to 2" in result.stderr
    assert run_cli("ca", "add", "--all", "--select", "1", cwd=project).exit_code == 2


def test_add_with_only_apple_certificates(project: Path, tmp_path: Path, keychain: dict[str, str]) -> None:
    write(tmp_path / "keychain" / "labels", keychain_record("com.apple.kerberos.kdc"))
    write(tmp_path / "keychain" / "pems", keychain["Corp Root CA"])
    result = run_cli("ca", "add", "--all", cwd=project)
    assert result.exit_code == 1
    assert "no certificates besides Apple's own" in result.stderr


# -- parsing -----------------------------------------------------------------------------------


def test_parse_labels_handles_hex_and_missing_names() -> None:
    listing = (
        keychain_record("Plain")
        + keychain_record(None)
        + 'keychain: "/k"\nattributes:\n    "labl"<blob>=0x4BC3B66C6E20526F6F7400  "K\\303\\266ln Root\\000"\n'
    )
    assert cacerts.parse_labels(listing) == ["Plain", None, "Köln Root"]


def test_selection_parsing() -> None:
    assert cacerts.parse_selection("", 3) == [0, 1, 2]
    assert cacerts.parse_selection("3, 1,3", 3) == [2, 0]
    assert cacerts.parse_selection("4", 3) is None
    assert cacerts.parse_selection("x", 3) is None


def test_replace_ca_cert_line_keeps_everything_else() -> None:
    text = "# top\ncaCert: old.pem # note\nagents:\n  codex:\n    caCert: not-top-level\n"
    assert cacerts.replace_ca_cert_line(text, 'caCert: "/new.pem"') == (
        '# top\ncaCert: "/new.pem"\nagents:\n  codex:\n    caCert: not-top-level\n'
    )
    assert cacerts.replace_ca_cert_line("vm: {}", 'caCert: "/n"') == 'vm: {}\ncaCert: "/n"\n'
    assert cacerts.replace_ca_cert_line("", 'caCert: "/n"') == 'caCert: "/n"\n'


@pytest.mark.parametrize("name", [".gitignore", "agentbox.yml", "agentbox-ca.pem"])
def test_add_never_writes_through_a_symlink_in_the_workspace(
    project: Path, home: Path, keychain: dict[str, str], name: str
) -> None:
    outside = write(home / "dotfiles" / "target", "vm:\n  cpus: 2\n" if name == "agentbox.yml" else "keep\n")
    before = outside.read_text()
    (project / name).symlink_to(outside)
    result = run_cli("ca", "add", "--all", cwd=project)
    assert result.exit_code == 1
    assert "symlink" in result.stderr and name in result.stderr
    assert outside.read_text() == before
    assert (project / name).is_symlink()
    assert not (project / "agentbox-ca.pem").exists() or name == "agentbox-ca.pem"


# -- what a new VM gets ------------------------------------------------------------------------


def test_a_new_vm_gets_only_the_certificates_it_does_not_trust_already(
        project: Path, limactl, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_doctor import fake_system_store, pem_stand_in

    bundle = fake_system_store(tmp_path, monkeypatch, public=5, local=1)
    corp = write(home / "corp.pem", pem_stand_in("corp CA") + pem_stand_in("public root 2"))
    write(home / ".config" / "agentbox" / "config.yml", "caCert: ~/corp.pem\n")
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(bundle))
    write(project / "agentbox.yml", "")

    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    notes = [text for text in result.stderr.splitlines() if "public" in text]
    assert notes == [
        f"agentbox: caCert: {corp} holds 2 certificates; the VM trusts the 1 public one already, "
        "so a new VM gets only the 1 other",
        f"agentbox: NODE_EXTRA_CA_CERTS: {bundle} is the host's system trust store: 6 certificates; "
        "the VM trusts the 5 public ones already, so a new VM gets only the 1 other",
    ]
    lima_yaml = limactl.lima_yaml("agentbox-myproject")
    assert lima_yaml.count("BEGIN CERTIFICATE") == 2
    assert b"corp CA".hex()[:20] in lima_yaml and b"local CA 0".hex()[:20] in lima_yaml
    assert b"public root".hex()[:20] not in lima_yaml

    again = run_cli("start", cwd=project)  # the VM exists: nothing is embedded, nothing said
    assert again.exit_code == 0 and "public" not in again.stderr


def test_a_system_store_without_local_additions_adds_nothing(
        project: Path, limactl, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_doctor import fake_system_store

    bundle = fake_system_store(tmp_path, monkeypatch, public=4, local=0)
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(bundle))
    write(project / "agentbox.yml", "")
    result = run_cli("start", cwd=project)
    assert result.exit_code == 0, result.stderr
    assert (f"agentbox: NODE_EXTRA_CA_CERTS: {bundle} is the host's system trust store: 4 certificates, "
            "all public roots the VM trusts already, so a new VM gets none of them\n") in result.stderr
    assert "caCerts" not in limactl.lima_yaml("agentbox-myproject")


def test_ls_says_what_a_new_vm_gets_from_a_whole_trust_store(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_doctor import fake_system_store

    bundle = fake_system_store(tmp_path, monkeypatch, public=3, local=2)
    monkeypatch.setenv("NODE_EXTRA_CA_CERTS", str(bundle))
    out = run_cli("ca", "ls", cwd=project).stdout
    assert (f"NODE_EXTRA_CA_CERTS on the host (the VM gets these too): {bundle}\n"
            "  is the host's system trust store: 5 certificates; the VM trusts the 3 public ones already, "
            "so a new VM gets only the 2 others\n") in out
