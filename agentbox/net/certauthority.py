"""The credential broker's certificate authority: one per VM, limited to that VM's credential hosts.

The broker (issue 26) terminates TLS for the credential hosts with certificates this CA signed, so the guest
trusts it. What keeps that trust small:
- X.509 name constraints (critical): the CA may vouch only for the credential hosts given (and, as RFC 5280
  says of DNS subtrees, names below them); every IPv4 and IPv6 address is excluded, since a constraint on DNS
  names alone would leave IP-address certificates unconstrained. A certificate for any other name that this
  key signed is rejected by every verifier in the guest (OpenSSL, Node, Go, GnuTLS).
- pathlen:0: it can sign no intermediate CA.
- Its key is made for this VM alone and never leaves the VM's state folder (0700 folder, 0600 files, each
  written atomically); no key material is ever on a command line (openssl writes new keys to a pipe and
  reads keys from files), so `ps` shows none.
- One leaf certificate (SAN = the host) is made per credential host up front: the broker never runs openssl
  while serving a request.
The set is re-made when the host set changes or it nears its end; re-making means a new key, a new
fingerprint, and the guest must install the new certificate. Only `openssl` on the host is needed (macOS's
LibreSSL or OpenSSL): every option used here is old enough for both.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import hosttools, lazyre, paths
from agentbox.errors import AgentboxError
from agentbox.fsutil import atomic_write, locked, private_dir

if TYPE_CHECKING:
    import ssl

FOLDER_NAME = "broker-ca"
RECORD_NAME = "ca.json"
RECORD_VERSION = 1
LIFETIME_DAYS = 397  # the longest any TLS client accepts for a leaf; the CA lives as long as its leaves
RENEW_BEFORE = 30 * 86400  # re-made when fewer than 30 days remain, so a running broker never serves an expired leaf
_HOST = lazyre.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$")
_VM_NAME = lazyre.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TIMEOUT = 60


class Leaf(NamedTuple):
    host: str
    cert: Path  # PEM, public
    key: Path  # PEM, 0600


class BrokerCA(NamedTuple):
    vm: str
    folder: Path
    cert: Path  # the CA certificate (PEM, public): what the guest installs into its trust stores
    key: Path  # the CA's private key (0600); only this module reads it, to sign the leaves
    hosts: tuple[str, ...]  # the credential hosts it may vouch for, sorted
    fingerprint: str  # "SHA256:AB:CD:...", the CA certificate's
    made: int  # seconds since the epoch
    expires: int
    leaves: dict[str, Leaf]

    def cert_pem(self) -> str:
        """The CA certificate, to install into the guest's trust store."""
        return self.cert.read_text()

    def leaf(self, host: str) -> Leaf:
        return self.leaves[normal_host(host)]


def folder(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / FOLDER_NAME


def normal_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def ensure(vm_name: str, hosts: Iterable[str]) -> BrokerCA:
    """The VM's CA for exactly these credential hosts: the one on disk when it is whole, for the same hosts and
    not near its end (no openssl run); otherwise a new one (new key, new leaves) replacing it."""
    wanted = _checked_hosts(vm_name, hosts)
    current = load(vm_name)
    if current is not None and current.hosts == wanted and current.expires - time.time() > RENEW_BEFORE:
        return current
    base = paths.vm_state_dir(vm_name)
    base.mkdir(parents=True, exist_ok=True)
    with locked(base / f".{FOLDER_NAME}.lock"):
        current = load(vm_name)  # another process may have made it while this one waited
        if current is not None and current.hosts == wanted and current.expires - time.time() > RENEW_BEFORE:
            return current
        return _make(vm_name, wanted)


def load(vm_name: str) -> BrokerCA | None:
    """The VM's CA as last made, or None when there is none or it is not whole (a crash mid-way, a file
    removed): ensure() then makes a new one. Runs no program."""
    where = folder(vm_name)
    try:
        record = json.loads((where / RECORD_NAME).read_text())
        if record.get("version") != RECORD_VERSION or record.get("vm") != vm_name:
            return None
        hosts = tuple(record["hosts"])
        leaves = {host: Leaf(host, where / "leaves" / f"{host}.pem", where / "leaves" / f"{host}.key")
                  for host in hosts}
        ca = BrokerCA(vm_name, where, where / "ca.pem", where / "ca.key", hosts, str(record["fingerprint"]),
                      int(record["made"]), int(record["expires"]), leaves)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    needed = [ca.cert, ca.key, *(p for leaf in leaves.values() for p in (leaf.cert, leaf.key))]
    if not all(path.is_file() for path in needed) or fingerprint(ca.cert.read_text()) != ca.fingerprint:
        return None
    return ca


def remove(vm_name: str) -> None:
    """Forget the VM's CA (the VM is deleted): its key is gone for good."""
    shutil.rmtree(folder(vm_name), ignore_errors=True)


def fingerprint(pem: str) -> str:
    """The SHA-256 fingerprint of a PEM certificate, as `openssl x509 -fingerprint -sha256` shows it."""
    # the DER bytes between the PEM lines (ssl.PEM_cert_to_DER_cert's work, without loading ssl on a launch)
    body = pem.split("-----BEGIN CERTIFICATE-----", 1)[1].split("-----END CERTIFICATE-----", 1)[0]
    digest = hashlib.sha256(base64.b64decode("".join(body.split()), validate=True)).hexdigest().upper()
    return "SHA256:" + ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def server_context(leaf: Leaf) -> ssl.SSLContext:
    """A TLS server context presenting the leaf for one credential host (build it once, at the broker's start)."""
    # deferred: start-up (ssl, ~10 ms: only serving TLS needs it; the launch only reads the CA's files)
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(leaf.cert), str(leaf.key))
    return context


# -- making --------------------------------------------------------------------------------------------------


def _checked_hosts(vm_name: str, hosts: Iterable[str]) -> tuple[str, ...]:
    if not _VM_NAME.match(vm_name):
        raise AgentboxError(f"cannot make a broker CA for VM {vm_name!r}: the name is not a Lima instance name")
    wanted = sorted({normal_host(host) for host in hosts})
    if not wanted:
        # A CA with no permitted subtree is not constrained at all: never make one.
        raise AgentboxError(f"cannot make a broker CA for VM {vm_name}: no credential host was given")
    bad = [host for host in wanted if not _HOST.match(host)]
    if bad:
        raise AgentboxError(f"cannot make a broker CA for VM {vm_name}: {', '.join(map(repr, bad))} is not a host name"
                            " (letters, digits, hyphens and dots, at least two labels, no wildcard)")
    return tuple(wanted)


def _make(vm_name: str, hosts: tuple[str, ...]) -> BrokerCA:
    """Make the whole set in a fresh private folder beside the old one, then swap folders: a reader sees the old
    set or the new one, and a crash leaves at worst no set (load() says None, the next ensure() makes one)."""
    openssl = _openssl(vm_name)
    base = paths.vm_state_dir(vm_name)
    work = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}.new-", dir=base))  # 0700
    try:
        private_dir(work / "leaves")
        config = work / "openssl.cnf"
        atomic_write(config, _config(vm_name, hosts), mode=0o600)
        made = int(time.time())
        _write_key(openssl, vm_name, work / "ca.key")
        ca_pem = _run(openssl, vm_name, ["req", "-new", "-x509", "-sha256", "-config", str(config), "-extensions",
                                         "v3_ca", "-key", str(work / "ca.key"), "-days", str(LIFETIME_DAYS),
                                         "-set_serial", _serial()], what="the CA certificate")
        atomic_write(work / "ca.pem", ca_pem, mode=0o644)
        for number, host in enumerate(hosts):
            key, cert = work / "leaves" / f"{host}.key", work / "leaves" / f"{host}.pem"
            _write_key(openssl, vm_name, key)
            request = _run(openssl, vm_name, ["req", "-new", "-sha256", "-config", str(config), "-subj", f"/CN={host}",
                                         "-key", str(key)], what=f"the certificate request for {host}")
            leaf_pem = _run(openssl, vm_name, ["x509", "-req", "-sha256", "-CA", str(work / "ca.pem"), "-CAkey",
                                          str(work / "ca.key"), "-set_serial", _serial(), "-days", str(LIFETIME_DAYS),
                                          "-extfile", str(config), "-extensions", f"leaf_{number}"],
                            what=f"the certificate for {host}", stdin=request)
            atomic_write(cert, leaf_pem, mode=0o644)
        config.unlink()
        record = {"version": RECORD_VERSION, "vm": vm_name, "hosts": list(hosts), "fingerprint": fingerprint(
            ca_pem.decode()), "made": made, "expires": made + LIFETIME_DAYS * 86400}
        atomic_write(work / RECORD_NAME, json.dumps(record, indent=2) + "\n", mode=0o600)
        _swap_in(work, folder(vm_name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    made_ca = load(vm_name)
    if made_ca is None:
        raise AgentboxError(f"the broker CA made for VM {vm_name} in {folder(vm_name)} could not be read back")
    return made_ca


def _swap_in(work: Path, target: Path) -> None:
    old = None
    if target.exists():
        old = target.with_name(f".{FOLDER_NAME}.old-{secrets.token_hex(4)}")
        os.rename(target, old)
    os.rename(work, target)
    os.chmod(target, 0o700)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _write_key(openssl: str, vm_name: str, path: Path) -> None:
    # The key comes back through a pipe and is written 0600 at once: it never sits in a file of the umask's mode,
    # and it is never an argument.
    atomic_write(path, _run(openssl, vm_name, ["ecparam", "-name", "prime256v1", "-genkey", "-noout"],
                            what="a private key"), mode=0o600)


def _serial() -> str:
    return str(secrets.randbits(126) | 1 << 125)  # positive, 16 bytes at most, as RFC 5280 asks


def _config(vm_name: str, hosts: tuple[str, ...]) -> str:
    constraints = [f"permitted;DNS.{number} = {host}" for number, host in enumerate(hosts)]
    constraints += ["excluded;IP.0 = 0.0.0.0/0.0.0.0", "excluded;IP.1 = 0:0:0:0:0:0:0:0/0:0:0:0:0:0:0:0"]
    lines = ["[req]", "distinguished_name = dn", "prompt = no", "", "[dn]", f"CN = agentbox broker CA for {vm_name}",
             "O = agentbox", "", "[v3_ca]", "basicConstraints = critical, CA:TRUE, pathlen:0",
             "keyUsage = critical, keyCertSign, cRLSign", "subjectKeyIdentifier = hash",
             "nameConstraints = critical, @constraints", "", "[constraints]", *constraints, ""]
    for number, host in enumerate(hosts):
        lines += [f"[leaf_{number}]", "basicConstraints = critical, CA:FALSE", "keyUsage = critical, digitalSignature",
                  "extendedKeyUsage = serverAuth", f"subjectAltName = DNS:{host}", "subjectKeyIdentifier = hash",
                  "authorityKeyIdentifier = keyid", ""]
    return "\n".join(lines)


def _openssl(vm_name: str) -> str:
    found = hosttools.which("openssl")
    if found is None:
        skipped = hosttools.ignored("openssl")
        where = f" (PATH has one only at {skipped}, in a folder agentbox does not run programs from)" if skipped else ""
        raise AgentboxError(
            f"agentbox needs openssl to make the credential broker's certificate authority for VM {vm_name}, and finds"
            f" none on PATH{where}",
            hint="install it: `sudo apt-get install openssl` (Debian, Ubuntu), `sudo dnf install openssl` (Fedora),"
                 " `brew install openssl` (macOS, which also ships /usr/bin/openssl)")
    return found


def _run(openssl: str, vm_name: str, args: list[str], what: str, stdin: bytes | None = None) -> bytes:
    try:
        result = subprocess.run([openssl, *args], input=stdin, capture_output=True, timeout=_TIMEOUT,
                                env=hosttools.environ())
    except (OSError, subprocess.SubprocessError) as exc:
        raise AgentboxError(f"could not run {openssl} to make {what} for VM {vm_name}'s broker CA: {exc}") from exc
    if result.returncode != 0 or not result.stdout:
        lines = result.stderr.decode(errors="replace").strip().splitlines()[-8:]
        detail = ("\n  " + "\n  ".join(lines)) if lines else " (it printed nothing)"
        raise AgentboxError(
            f"openssl failed making {what} for VM {vm_name}'s broker CA (`openssl {args[0]}`, "
            f"exit {result.returncode}):"
            f"{detail}", hint=f"check that {openssl} works (`{openssl} version`); a LibreSSL or OpenSSL 1.1+ will do")
    return result.stdout
