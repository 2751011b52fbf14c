"""The credential broker's per-VM CA (agentbox/net/certauthority.py): trusted for its credential hosts and nothing else,
its key private and never on a command line, one per VM, re-made when the hosts change."""

from __future__ import annotations

import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentbox import paths
from agentbox.errors import AgentboxError
from agentbox.net import certauthority

pytestmark = pytest.mark.timeout(60)

HOSTS = ["api.github.com", "github.com"]
REAL_OPENSSL = subprocess.run(["sh", "-c", "command -v openssl"], capture_output=True, text=True).stdout.strip()


def _handshake(authority: Path, context: ssl.SSLContext, server_hostname: str, strict: bool = False) -> Any:
    """A TLS handshake on 127.0.0.1 between a server using `context` and a client trusting only `authority` (and
    verifying as RFC 5280 asks when `strict`, as Python 3.13's default context does); the peer certificate the
    client saw. Raises ssl.SSLError when the client refuses it."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: dict[str, str | None] = {}

    def pick(sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _context: ssl.SSLContext) -> None:
        seen["sni"] = name

    context.sni_callback = pick

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"hello")
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cafile=str(authority))  # only this CA: no system roots
    if strict:
        client.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname=server_hostname) as tls:
            assert tls.recv(5) == b"hello"
            assert seen["sni"] == server_hostname
            return tls.getpeercert() or {}
    finally:
        thread.join(10)
        listener.close()


def _sign(issuer: Path, issuer_key: Path, tmp_path: Path, name: str, extensions: str) -> tuple[Path, Path]:
    """A certificate (CN=x, a new key) with these extensions, signed by issuer's key, made here by hand with openssl."""
    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
    ext = tmp_path / f"{name}.cnf"
    ext.write_text(f"[ext]\n{extensions}")
    subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(key)], check=True)
    request = subprocess.run(["openssl", "req", "-new", "-key", str(key), "-subj", "/CN=x"], check=True,
                             capture_output=True).stdout
    subprocess.run(["openssl", "x509", "-req", "-CA", str(issuer), "-CAkey", str(issuer_key), "-set_serial", "7",
                    "-days", "2", "-extfile", str(ext), "-extensions", "ext", "-out", str(cert)],
                   input=request, check=True, capture_output=True)
    return cert, key


def _leaf_extensions(san: str) -> str:
    return f"subjectAltName = {san}\nbasicConstraints = critical, CA:FALSE\nextendedKeyUsage = serverAuth\n"


def _sign_with_the_ca(authority: certauthority.BrokerCA, tmp_path: Path, san: str) -> tuple[Path, Path]:
    """A leaf for `san` ("DNS:x" or "IP:x") signed by the CA's own key, made here by hand with openssl."""
    return _sign(authority.cert, authority.key, tmp_path, san, _leaf_extensions(san))


def _extensions(cert: Path) -> dict[str, tuple[bool, list[str]]]:
    """The certificate's X.509v3 extensions as `openssl x509 -text` shows them: name -> (critical, value lines)."""
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(cert)], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    start = next(number for number, line in enumerate(text) if line.strip() == "X509v3 extensions:")
    found: dict[str, tuple[bool, list[str]]] = {}
    indent = len(text[start + 1]) - len(text[start + 1].lstrip())
    for line in text[start + 1:]:
        depth = len(line) - len(line.lstrip())
        if depth < indent:
            break
        if depth == indent:
            name, _, flag = line.strip().partition(":")
            current: list[str] = []
            found[name] = (flag.strip() == "critical", current)
        else:
            current.append(line.strip())
    return found


def _context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    return context


def _verify(authority: certauthority.BrokerCA, cert: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", "verify", *options, "-CAfile", str(authority.cert), str(cert)],
                          capture_output=True, text=True)


@pytest.fixture
def argv_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in openssl first on PATH: records each call's argv and environment, then runs the real one
    (or fails as told by FAKE_OPENSSL_FAIL=<subcommand>)."""
    log = tmp_path / "openssl-argv.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "openssl"
    stand_in.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(log)!r}, 'a') as log:\n"
        "    log.write(json.dumps({'argv': sys.argv, 'env': dict(os.environ)}) + '\\n')\n"
        "if os.environ.get('FAKE_OPENSSL_FAIL') == sys.argv[1]:\n"
        "    sys.stderr.write('unable to load CA private key\\n')\n"
        "    sys.exit(1)\n"
        f"os.execv({REAL_OPENSSL!r}, ['openssl', *sys.argv[1:]])\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def _calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_client_trusting_only_the_ca_completes_a_handshake_with_each_leaf() -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    assert authority.hosts == ("api.github.com", "github.com")
    for host in HOSTS:
        peer = _handshake(authority.cert, certauthority.server_context(authority.leaf(host)), host)
        assert peer["subjectAltName"] == (("DNS", host),)
    # The leaf is for its host alone: the client refuses github.com's leaf when it asked for api.github.com.
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(authority.cert, certauthority.server_context(authority.leaf("github.com")), "api.github.com")


def test_a_leaf_outside_the_name_constraints_is_rejected_even_when_the_ca_signed_it(tmp_path: Path) -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    # Control: a leaf made the same way by hand for a permitted host passes both verifiers.
    cert, key = _sign_with_the_ca(authority, tmp_path, "DNS:github.com")
    assert _verify(authority, cert).returncode == 0
    assert _handshake(authority.cert, _context(cert, key), "github.com")["subjectAltName"] == (("DNS", "github.com"),)

    cert, key = _sign_with_the_ca(authority, tmp_path, "DNS:evil.example.com")
    checked = _verify(authority, cert)
    assert checked.returncode != 0 and "permitted subtree violation" in checked.stdout + checked.stderr
    with pytest.raises(ssl.SSLCertVerificationError, match="permitted subtree violation"):
        _handshake(authority.cert, _context(cert, key), "evil.example.com")

    # DNS constraints alone would leave IP-address certificates unconstrained: every address is excluded.
    cert, key = _sign_with_the_ca(authority, tmp_path, "IP:127.0.0.1")
    checked = _verify(authority, cert)
    assert checked.returncode != 0 and "excluded subtree violation" in checked.stdout + checked.stderr
    with pytest.raises(ssl.SSLCertVerificationError, match="excluded subtree violation"):
        _handshake(authority.cert, _context(cert, key), "127.0.0.1")


@pytest.mark.parametrize("address", ["::1", "2001:db8::1"])
def test_a_leaf_for_an_ipv6_literal_is_rejected_even_when_the_ca_signed_it(tmp_path: Path, address: str) -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    # Excluding IPv4 alone would leave every IPv6 address unconstrained (no IP subtree is permitted or excluded).
    cert, key = _sign_with_the_ca(authority, tmp_path, f"IP:{address}")
    checked = _verify(authority, cert)
    assert checked.returncode != 0 and "excluded subtree violation" in checked.stdout + checked.stderr, \
        checked.stdout + checked.stderr
    with pytest.raises(ssl.SSLCertVerificationError, match="excluded subtree violation"):
        _handshake(authority.cert, _context(cert, key), address)


def test_the_ca_says_critically_that_it_is_a_ca_limited_to_its_names_that_signs_no_other_ca() -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    # A strict verifier (RFC 5280's rules; Python 3.13's default context) refuses a CA whose basic constraints are
    # not marked critical: the CA's own leaves pass it.
    leaf = authority.leaf("github.com")
    checked = _verify(authority, leaf.cert, "-x509_strict")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    peer = _handshake(authority.cert, certauthority.server_context(leaf), "github.com", strict=True)
    assert peer["subjectAltName"] == (("DNS", "github.com"),)
    extensions = _extensions(authority.cert)
    # Each limit is critical, so a verifier that does not know it must refuse the CA rather than ignore the limit.
    assert extensions["X509v3 Basic Constraints"] == (True, ["CA:TRUE, pathlen:0"])
    assert extensions["X509v3 Key Usage"] == (True, ["Certificate Sign, CRL Sign"])
    assert extensions["X509v3 Name Constraints"] == (True, [
        "Permitted:", "DNS:api.github.com", "DNS:github.com",
        "Excluded:", "IP:0.0.0.0/0.0.0.0", "IP:0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0"])


def test_a_ca_the_ca_signed_cannot_vouch_for_anything(tmp_path: Path) -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    middle, middle_key = _sign(authority.cert, authority.key, tmp_path, "middle",
                               "basicConstraints = critical, CA:TRUE\nkeyUsage = critical, keyCertSign\n")
    cert, key = _sign(middle, middle_key, tmp_path, "leaf", _leaf_extensions("DNS:github.com"))
    # Control: the leaf is good in itself (for a permitted host; a client trusting the intermediate takes it).
    alone = subprocess.run(["openssl", "verify", "-partial_chain", "-CAfile", str(middle), str(cert)],
                           capture_output=True, text=True)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    # pathlen:0: with the CA as the only root, the chain through an intermediate it signed is refused.
    checked = _verify(authority, cert, "-untrusted", str(middle))
    assert checked.returncode != 0 and "path length constraint exceeded" in checked.stdout + checked.stderr, \
        checked.stdout + checked.stderr
    chain = tmp_path / "chain.pem"
    chain.write_text(cert.read_text() + middle.read_text())
    with pytest.raises(ssl.SSLCertVerificationError, match="path length constraint exceeded"):
        _handshake(authority.cert, _context(chain, key), "github.com")


def test_the_keys_are_private_and_the_certificates_readable() -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    assert authority.folder == paths.vm_state_dir("vm-one") / "broker-ca"

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(authority.folder) == 0o700 and mode(authority.folder / "leaves") == 0o700
    assert mode(authority.key) == 0o600 and mode(authority.folder / "ca.json") == 0o600
    assert all(mode(leaf.key) == 0o600 and mode(leaf.cert) == 0o644 for leaf in authority.leaves.values())
    assert mode(authority.cert) == 0o644
    assert authority.cert_pem().startswith("-----BEGIN CERTIFICATE-----")
    # Nothing else is left in the folder (the openssl config, temporary folders).
    assert sorted(p.name for p in authority.folder.iterdir()) == ["ca.json", "ca.key", "ca.pem", "leaves"]
    assert [p.name for p in paths.vm_state_dir("vm-one").iterdir() if "new" in p.name or "old" in p.name] == []


def test_no_key_is_ever_on_a_command_line_or_in_the_environment(argv_log: Path) -> None:
    authority = certauthority.ensure("vm-one", HOSTS)
    calls = _calls(argv_log)
    # Control: every openssl run went through the stand-in (a key and a certificate for the CA, then a key,
    # a request and a certificate per leaf).
    assert [call["argv"][1] for call in calls] == ["ecparam", "req"] + ["ecparam", "req", "x509"] * 2  # type: ignore[index]
    keys = [authority.key, *(leaf.key for leaf in authority.leaves.values())]
    secrets = [line for key in keys for line in key.read_text().splitlines() if "-----" not in line]
    assert len(secrets) >= 3 * len(keys)
    recorded = "\n".join(json.dumps(call) for call in calls)
    assert [line for line in secrets if line in recorded] == []
    # The CA's key reaches openssl as a file name only.
    assert any("-CAkey" in call["argv"] for call in calls)  # type: ignore[operator]


def test_two_vms_get_different_cas() -> None:
    first, second = certauthority.ensure("vm-one", HOSTS), certauthority.ensure("vm-two", HOSTS)
    assert first.fingerprint != second.fingerprint
    assert first.key.read_bytes() != second.key.read_bytes()
    assert first.leaf("github.com").key.read_bytes() != second.leaf("github.com").key.read_bytes()
    # Each VM's client refuses the other VM's leaf.
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(first.cert, certauthority.server_context(second.leaf("github.com")), "github.com")
    fingerprint = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(first.cert)],
                                 capture_output=True, text=True, check=True).stdout
    assert fingerprint.strip().split("=", 1)[1] == first.fingerprint.removeprefix("SHA256:")
    certauthority.remove("vm-one")  # the VM is deleted: its CA and key are gone, the other VM's stay
    assert not first.folder.exists() and certauthority.load("vm-one") is None and certauthority.load("vm-two") == second


def test_the_same_hosts_keep_the_ca_without_running_openssl_and_new_hosts_remake_it(argv_log: Path) -> None:
    first = certauthority.ensure("vm-one", HOSTS)
    first_key = first.key.read_bytes()
    made = len(_calls(argv_log))
    again = certauthority.ensure("vm-one", ["GitHub.com.", "api.github.com", "github.com"])  # the same set, written otherwise
    assert again == first and len(_calls(argv_log)) == made

    changed = certauthority.ensure("vm-one", ["api.anthropic.com", "github.com"])
    assert len(_calls(argv_log)) > made
    assert changed.fingerprint != first.fingerprint and changed.key.read_bytes() != first_key
    assert sorted(p.name for p in (changed.folder / "leaves").iterdir()) == [
        "api.anthropic.com.key", "api.anthropic.com.pem", "github.com.key", "github.com.pem"]
    assert certauthority.load("vm-one") == changed
    # The new CA may no longer vouch for the host that left the set.
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(changed.cert)], capture_output=True,
                          text=True, check=True).stdout
    assert "DNS:api.anthropic.com" in text and "DNS:api.github.com" not in text


def test_a_ca_near_its_end_or_not_whole_is_made_again() -> None:
    first = certauthority.ensure("vm-one", HOSTS)
    record = json.loads((first.folder / "ca.json").read_text())
    record["expires"] = record["made"] + 86400
    (first.folder / "ca.json").write_text(json.dumps(record))
    renewed = certauthority.ensure("vm-one", HOSTS)
    assert renewed.fingerprint != first.fingerprint
    renewed.leaf("github.com").key.unlink()
    assert certauthority.load("vm-one") is None
    assert certauthority.ensure("vm-one", HOSTS).fingerprint not in (first.fingerprint, renewed.fingerprint)


def test_openssl_failing_names_its_message_and_keeps_the_old_ca(argv_log: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    first = certauthority.ensure("vm-one", HOSTS)
    monkeypatch.setenv("FAKE_OPENSSL_FAIL", "x509")
    with pytest.raises(AgentboxError) as error:
        certauthority.ensure("vm-one", ["api.anthropic.com"])
    assert error.value.message == (
        "openssl failed making the certificate for api.anthropic.com for VM vm-one's broker CA (`openssl x509`,"
        " exit 1):\n  unable to load CA private key")
    assert certauthority.load("vm-one") == first
    assert [p.name for p in paths.vm_state_dir("vm-one").iterdir() if p.name.startswith(".broker-ca.new")] == []


def test_openssl_missing_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(AgentboxError) as error:
        certauthority.ensure("vm-one", HOSTS)
    assert error.value.message == ("agentbox needs openssl to make the credential broker's certificate authority for"
                                   " VM vm-one, and finds none on PATH")
    assert error.value.hint is not None and "apt-get install openssl" in error.value.hint
    assert not certauthority.folder("vm-one").exists()


@pytest.mark.parametrize(("hosts", "problem"), [
    ([], "no credential host was given"),
    (["*.github.com"], "'*.github.com' is not a host name"),
    (["localhost"], "'localhost' is not a host name"),
])
def test_a_host_set_that_would_not_constrain_is_refused(hosts: list[str], problem: str) -> None:
    with pytest.raises(AgentboxError, match=problem):
        certauthority.ensure("vm-one", hosts)
    assert certauthority.ensure("vm-one", ["github.com"]).hosts == ("github.com",)  # control
