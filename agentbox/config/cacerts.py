"""Extra CA certificates: read PEM files, list the macOS System keychain, point `caCert:` at a file.

The VM's own trust store (Ubuntu's ca-certificates: Mozilla's public roots) already holds the public
roots, so a new VM gets only the certificates that are not among the public roots the host's OS
ships; a source that is the host's whole trust store (NODE_EXTRA_CA_CERTS at the OS bundle, which
is common) then adds just what was installed locally, such as a corporate CA.

The click layer is agentbox/cli/commands/ca.py; this module does the work and never prompts.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import fsutil, hosttools, lazyre
from agentbox.config import pins, schema, yamlio
from agentbox.errors import AgentboxError
from agentbox.fsutil import atomic_write, read_workspace_file

if TYPE_CHECKING:
    from agentbox.config.load import Config

SYSTEM_KEYCHAIN = "/Library/Keychains/System.keychain"
LOCAL_PEM_NAME = "agentbox-ca.pem"
GLOBAL_PEM_NAME = "ca-certificates.pem"
APPLE_PREFIXES = ("com.apple.", "Apple ")
PEM_BLOCK = lazyre.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.DOTALL)
_LABEL = lazyre.compile(r'^\s*"labl"<blob>=(.*)$')
_TOP_LEVEL_CA_CERT = lazyre.compile(r"^caCert\s*:")
# The OS's whole trust store, where NODE_EXTRA_CA_CERTS often points (Debian/Ubuntu/Alpine, Fedora/RHEL,
# openSUSE, Arch, macOS and BSDs, Homebrew's).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ca-certificates/extracted/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
    "/opt/homebrew/etc/ca-certificates/cert.pem",
    "/usr/local/etc/ca-certificates/cert.pem",
    "/opt/homebrew/etc/openssl@3/cert.pem",
    "/usr/local/etc/openssl@3/cert.pem",
)
# Mozilla's public roots as the host's OS packages them, without local additions (glob patterns).
PUBLIC_ROOTS = (
    "/usr/share/ca-certificates/mozilla/*.crt",  # Debian, Ubuntu, Alpine
    "/usr/share/pki/ca-trust-source/ca-bundle.trust.p11-kit",  # Fedora, RHEL
    "/usr/share/ca-certificates/trust-source/mozilla.trust.p11-kit",  # Arch
)
PUBLIC_ROOTS_MACOS = (
    "/opt/homebrew/share/ca-certificates/cacert.pem",  # Homebrew's copy of Mozilla's bundle
    "/usr/local/share/ca-certificates/cacert.pem",
    "/etc/ssl/cert.pem",  # Apple's public roots; keychain additions never land here
)
WHOLE_STORE_COUNT = 100  # more certificates than any set of private CAs: a copy of a trust store
_MAX_SYSTEM_FILE = 8 * 1024 * 1024


class Certificate(NamedTuple):
    pem: str  # one "-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----\n" block
    label: str | None  # the keychain's name for it, when known


class Source(NamedTuple):
    """One place the VM's extra CA certificates come from."""

    origin: str  # "global", "local" or "NODE_EXTRA_CA_CERTS"
    config_file: Path | None  # the config file that sets it (None for the environment variable)
    path: Path
    used: bool  # False when the local config's caCert overrides the global one


class Embedding(NamedTuple):
    """What a new VM gets from one CA file."""

    kept: list[str]  # the certificates the VM does not trust already
    total: int
    whole_store: str | None  # why the file looks like a whole trust store ("is the host's system trust store")
    public_known: bool  # whether the host has a copy of the public roots to compare with


class CertFile(NamedTuple):
    """What `agentbox ca ls` shows about one PEM file."""

    path: Path
    exists: bool
    pems: tuple[str, ...]
    error: str | None  # why it could not be read


# -- what is configured ------------------------------------------------------------------------


def sources(config: Config) -> list[Source]:
    """The global and local `caCert` (the local one wins) and the host's NODE_EXTRA_CA_CERTS."""
    winner = config.origins.get("caCert", "")
    result: list[Source] = []
    for layer, config_file in (("global", config.global_file), ("local", config.local_file)):
        if config_file is None:
            continue
        if winner.startswith(layer) and config.ca_cert is not None:
            result.append(Source(layer, config_file, config.ca_cert, True))
        elif layer == "global":
            value = _configured_value(config_file, layer)
            if value:
                # The same rule as config.resolve: a relative path in the global file is relative to the workspace.
                result.append(Source(layer, config_file, _absolute(value, config.workspace), False))
    extra = os.environ.get("NODE_EXTRA_CA_CERTS")
    if extra:
        result.append(Source("NODE_EXTRA_CA_CERTS", None, Path(extra), True))  # read as provisioning reads it
    return result


def _configured_value(config_file: Path, layer: str) -> str | None:
    value = _layer_data(yamlio.read_config_text(config_file), config_file, layer).get("caCert")
    return value if isinstance(value, str) else None


def _absolute(value: str, base: Path) -> Path:
    path = Path(os.path.expanduser(value))
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


# -- PEM files ---------------------------------------------------------------------------------


def pem_blocks(text: str) -> list[str]:
    """Every PEM certificate in text, each ending with one newline, duplicates dropped."""
    blocks: list[str] = []
    for block in PEM_BLOCK.findall(text):
        block = block.strip() + "\n"
        if block not in blocks:
            blocks.append(block)
    return blocks


def inspect_file(path: Path) -> CertFile:
    if not path.exists():
        return CertFile(path, False, (), None)
    try:
        text = pins.read(path, "caCert").decode("utf-8", errors="replace")
    except AgentboxError as exc:
        return CertFile(path, True, (), exc.message)
    return CertFile(path, True, tuple(pem_blocks(text)), None)


def embedding(path: Path, pems: list[str] | tuple[str, ...], public: frozenset[str] | None = None) -> Embedding:
    """Which of a CA file's certificates a new VM gets: all but the public roots it trusts already."""
    public = public_roots() if public is None else public
    kept = [pem for pem in pems if _key(pem) not in public]
    return Embedding(kept, len(pems), whole_store_reason(path, len(pems)), bool(public))


def whole_store_reason(path: Path, count: int) -> str | None:
    real = os.path.realpath(path)
    for bundle in SYSTEM_BUNDLES:
        if os.path.exists(bundle) and os.path.realpath(bundle) == real:
            return "is the host's system trust store" + (f" ({bundle})" if str(path) != bundle else "")
    if count > WHOLE_STORE_COUNT:
        return f"looks like a whole system trust store (more than {WHOLE_STORE_COUNT} certificates)"
    return None


def embedding_summary(embedded: Embedding) -> str:
    """"6 certificates; the VM trusts the 5 public ones already, so a new VM gets only the 1 other"."""
    total = f"{embedded.total} certificate{'s' if embedded.total != 1 else ''}"
    if not embedded.public_known:
        return (f"{total}; this host has no copy of the public roots to compare with, "
                f"so a new VM gets all {embedded.total}")
    dropped = embedded.total - len(embedded.kept)
    if not embedded.kept:
        return f"{total}, all public roots the VM trusts already, so a new VM gets none of them"
    if not dropped:
        return f"{total}, none of them public roots: a new VM gets all {embedded.total}"
    count = len(embedded.kept)
    return (f"{total}; the VM trusts the {dropped} public one{'s' if dropped != 1 else ''} already, "
            f"so a new VM gets only the {count} {'other' if count == 1 else 'others'}")


def public_roots() -> frozenset[str]:
    """The public roots the host's OS ships (normalized PEM), empty when this host has no copy."""
    patterns = PUBLIC_ROOTS + (PUBLIC_ROOTS_MACOS if sys.platform == "darwin" else ())
    found: set[str] = set()
    for pattern in patterns:
        for name in sorted(glob.glob(pattern)):
            try:
                with open(name, "rb") as handle:
                    text = handle.read(_MAX_SYSTEM_FILE).decode("utf-8", errors="replace")
            except OSError:
                continue
            found.update(_key(block) for block in PEM_BLOCK.findall(text))
        if found and pattern in PUBLIC_ROOTS_MACOS:
            break  # the first macOS copy that exists is enough; /etc/ssl/cert.pem is the fallback
    return frozenset(found)


def _key(pem: str) -> str:
    """A certificate independent of line wrapping."""
    return "".join(pem.split())


def describe(pem: str) -> str | None:
    """The certificate's subject and expiry via openssl ("CN = Corp Root, O = Corp; expires ..."), or None."""
    found = details(pem)
    if found is None:
        return None
    subject, expiry = found
    if not expiry:
        return subject
    return f"{subject}; {'EXPIRED on' if expired(expiry) else 'expires'} {' '.join(expiry.split())}"


def details(pem: str) -> tuple[str, str | None] | None:
    """(subject, notAfter as openssl writes it) via openssl, or None when openssl cannot say."""
    openssl = hosttools.which("openssl")
    if openssl is None:
        return None
    try:
        result = subprocess.run(
            [openssl, "x509", "-noout", "-subject", "-enddate"],
            input=pem.encode(), capture_output=True, timeout=10, env=hosttools.environ(),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    fields = {}
    for line in result.stdout.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    subject = fields.get("subject")
    if not subject:
        return None
    return subject, fields.get("notAfter")


def iso_time(not_after: str) -> str | None:
    """openssl's "Jan  1 00:00:00 2030 GMT" as "2030-01-01T00:00:00Z" (None when it reads otherwise)."""
    try:
        moment = datetime.datetime.strptime(" ".join(not_after.split()), "%b %d %H:%M:%S %Y %Z")
    except ValueError:
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def expired(not_after: str) -> bool:
    try:
        moment = datetime.datetime.strptime(not_after, "%b %d %H:%M:%S %Y %Z")
    except ValueError:
        return False
    return moment.replace(tzinfo=datetime.timezone.utc) < datetime.datetime.now(datetime.timezone.utc)


# -- the macOS System keychain -----------------------------------------------------------------


def keychain_certificates(keychain: str = SYSTEM_KEYCHAIN) -> list[Certificate]:
    """The keychain's certificates with their labels, in keychain order, duplicates dropped."""
    pems = PEM_BLOCK.findall(_security("find-certificate", "-a", "-p", keychain))
    labels = parse_labels(_security("find-certificate", "-a", keychain))
    if len(labels) != len(pems):
        labels = [None] * len(pems)  # cannot pair them safely: show no names rather than wrong ones
    result: list[Certificate] = []
    seen: set[str] = set()
    for pem, label in zip(pems, labels, strict=True):
        pem = pem.strip() + "\n"
        if pem not in seen:
            seen.add(pem)
            result.append(Certificate(pem, label))
    return result


def parse_labels(listing: str) -> list[str | None]:
    """One label per certificate record of `security find-certificate -a` (None when it has none)."""
    labels: list[str | None] = []
    for line in listing.splitlines():
        if line.startswith("keychain:"):
            labels.append(None)
            continue
        match = _LABEL.match(line)
        if match and labels and labels[-1] is None:
            labels[-1] = _label_value(match.group(1).strip())
    return labels


def _label_value(raw: str) -> str | None:
    """`"Name"`, `0x4B6FC3A9...  "Ko\\303\\251"` (non-ASCII names) or `<NULL>`."""
    if raw.startswith("0x"):
        hex_part = raw[2:].split()[0] if raw[2:].split() else ""
        try:
            return bytes.fromhex(hex_part).rstrip(b"\0").decode("utf-8", errors="replace").replace("\n", " ")
        except ValueError:
            return None
    if raw.startswith('"') and raw.endswith('"') and len(raw) >= 2:
        return raw[1:-1].replace("\n", " ")
    return None


def is_apple(certificate: Certificate) -> bool:
    return certificate.label is not None and certificate.label.startswith(APPLE_PREFIXES)


def _security(*args: str) -> str:
    security = hosttools.which("security")
    if security is None:
        raise AgentboxError(
            "the macOS `security` tool was not found on PATH, so agentbox cannot read the System keychain",
            hint="Export the certificate from Keychain Access as a .pem file and put its path in `caCert:`.",
        )
    try:
        result = subprocess.run([security, *args], capture_output=True, timeout=60, env=hosttools.environ())
    except (OSError, subprocess.SubprocessError) as exc:
        raise AgentboxError(f"`security {' '.join(args)}` could not be run: {exc}") from exc
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip().splitlines()
        raise AgentboxError(
            f"`security {' '.join(args)}` failed (exit {result.returncode})"
            + (f": {detail[-1]}" if detail else ""),
            hint="Export the certificate from Keychain Access as a .pem file and put its path in `caCert:`.",
        )
    return result.stdout.decode(errors="replace")


def parse_selection(text: str, count: int) -> list[int] | None:
    """"1,3" -> [0, 2] (0-based, in the given order, no repeats); "" -> all; None when it is not valid."""
    text = text.strip()
    if not text:
        return list(range(count))
    chosen: list[int] = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= count:
            return None
        if int(part) - 1 not in chosen:
            chosen.append(int(part) - 1)
    return chosen or None


# -- writing -----------------------------------------------------------------------------------


def write_pem_file(path: Path, certificates: list[Certificate]) -> None:
    refuse_symlink(path)
    parts = []
    for certificate in certificates:
        if certificate.label:
            parts.append(f"# {certificate.label}\n")
        parts.append(certificate.pem)
    _atomic(path, "".join(parts), 0o644)


def ensure_gitignored(workspace: Path, name: str = LOCAL_PEM_NAME) -> bool:
    """Add name to workspace/.gitignore unless it is there; return whether the file changed.

    The workspace is agent-writable: a .gitignore that is a symlink, a FIFO or huge is refused, not followed.
    """
    gitignore = workspace / ".gitignore"
    try:
        data = read_workspace_file(gitignore)
        st = os.lstat(gitignore) if data is not None else None
    except OSError as exc:
        raise AgentboxError(
            f"cannot update {gitignore}: {exc.strerror}",
            hint=f"Add the line `{name}` to it yourself.",
        ) from exc
    text = (data or b"").decode("utf-8", "replace")
    if any(line.strip() in (name, f"/{name}") for line in text.splitlines()):
        return False
    if text and not text.endswith("\n"):
        text += "\n"
    _atomic(gitignore, text + name + "\n", (st.st_mode & 0o777) if st else 0o644)
    return True


def set_ca_cert(config_file: Path, pem_path: Path, layer: str) -> str | None:
    """Point the top-level `caCert:` of config_file at pem_path, keeping everything else.

    Replaces an existing top-level `caCert:` line (and its continuation lines) or appends one; the
    file is created when missing. Returns the previous caCert value as written, if there was one.
    The edited text is validated before it is written: a file this line edit cannot handle is
    left untouched.
    """
    if layer == "local":
        refuse_symlink(config_file)  # in the workspace: never written through a link
        target = config_file
    else:
        target = Path(os.path.realpath(config_file))  # a global config symlinked from dotfiles is edited in place

    text = yamlio.read_config(target).text if target.exists() else ""
    previous = _layer_data(text, config_file, layer).get("caCert")
    new_line = f"caCert: {json.dumps(str(pem_path))}"
    new_text = replace_ca_cert_line(text, new_line)
    manual = f"Add this line to {config_file} yourself: {new_line}"
    try:
        data = _layer_data(new_text, config_file, layer)
    except AgentboxError as exc:
        raise AgentboxError(
            f"{config_file} would not be valid after setting caCert ({exc.message}); it was not changed",
            hint=manual,
        ) from exc
    if data.get("caCert") != str(pem_path):
        raise AgentboxError(
            f"agentbox could not set caCert in {config_file} with a line edit; it was not changed", hint=manual
        )
    mode = (os.stat(target).st_mode & 0o777) if target.exists() else 0o644
    _atomic(target, new_text, mode)
    return previous


def replace_ca_cert_line(text: str, new_line: str) -> str:
    """text with new_line in place of its top-level `caCert:` entry, or appended when it has none."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if not _TOP_LEVEL_CA_CERT.match(line):
            continue
        end = index + 1
        while end < len(lines) and lines[end][:1] in (" ", "\t") and lines[end].strip():
            end += 1  # continuation lines of a multi-line value
        return "".join([*lines[:index], new_line + "\n", *lines[end:]])
    if text and not text.endswith("\n"):
        text += "\n"
    return text + new_line + "\n"


def _layer_data(text: str, config_file: Path, layer: str) -> dict:
    """The validated content of a config file's text (ConfigError when it is not valid)."""
    return schema.validate(yamlio.compose(text, config_file), config_file, layer).data


def refuse_symlink(path: Path) -> None:
    """The workspace is agent-writable: agentbox never writes through a link there."""
    try:
        fsutil.refuse_symlink(path)
    except OSError as exc:
        raise AgentboxError(f"cannot update {path}: {exc.strerror}", hint="Edit the file yourself.") from exc


def _atomic(path: Path, text: str, mode: int) -> None:
    try:
        atomic_write(path, text, mode=mode)
    except OSError as exc:
        raise AgentboxError(f"cannot write {path}: {exc.strerror}") from exc
