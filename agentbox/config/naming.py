"""Lima instance names: the rules Lima enforces and agentbox's default name for a workspace."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path

from agentbox import lazyre

_IDENTIFIER = lazyre.compile(r"^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$")
MAX_NAME = 76
PREFIX = "agentbox-"
# limactl refuses a name when LIMA_HOME/NAME/ssh.sock.1234567890123456 reaches UNIX_PATH_MAX:
# 104 on macOS, 108 on Linux. agentbox uses the smaller one everywhere so names stay portable.
UNIX_PATH_MAX = 104
_SOCKET_SUFFIX = len("/ssh.sock.1234567890123456")


def instance_name_problem(name: str) -> str | None:
    """Why Lima would reject name as an instance name, or None."""
    if not _IDENTIFIER.match(name):
        return (
            f"{name!r} is not a valid Lima instance name "
            "(letters and digits, with single . _ or - between them)"
        )
    if len(name) > MAX_NAME:
        return f"{name!r} is {len(name)} characters; Lima allows at most {MAX_NAME}"
    if name.lower().endswith((".yml", ".yaml")):
        return f"{name!r} must not end with .yml or .yaml"
    return None


def socket_limit(lima_home: Path) -> int:
    """The longest name whose ssh socket path still fits under UNIX_PATH_MAX."""
    return UNIX_PATH_MAX - 1 - len(str(lima_home)) - 1 - _SOCKET_SUFFIX


def default_vm_name(workspace: Path, lima_home: Path) -> str:
    """agentbox-<basename>; a short hash of the path is appended whenever the basename had to change."""
    limit = min(MAX_NAME, socket_limit(lima_home))
    base = workspace.name
    cleaned = _sanitize(base)
    name = PREFIX + cleaned if cleaned else PREFIX.rstrip("-")
    if cleaned == base and not instance_name_problem(name) and len(name) <= limit:
        return name

    digest = hashlib.sha256(str(workspace).encode()).hexdigest()[:8]
    room = limit - len(PREFIX) - len(digest) - 1
    stem = cleaned[: max(room, 0)].rstrip("._-")
    return f"{PREFIX}{stem}-{digest}" if stem else f"{PREFIX}{digest}"


def distinct_vm_name(workspace: Path, lima_home: Path, taken: str) -> str:
    """agentbox-<basename>-<short hash of the path>: a name no other folder gets, suggested when `taken`
    (this workspace's name) already belongs to another workspace's VM."""
    limit = min(MAX_NAME, socket_limit(lima_home))
    digest = hashlib.sha256(str(workspace).encode()).hexdigest()
    for start in range(0, len(digest) - 8, 8):
        short = digest[start:start + 8]
        room = limit - len(PREFIX) - len(short) - 1
        stem = _sanitize(workspace.name)[: max(room, 0)].rstrip("._-")
        name = f"{PREFIX}{stem}-{short}" if stem else f"{PREFIX}{short}"
        if name != taken:
            return name
    return f"{PREFIX}{digest[:8]}"


def _sanitize(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    dashed = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_text)
    collapsed = re.sub(r"[._-]{2,}", lambda m: m.group(0)[0], dashed).strip("._-")
    if collapsed.lower().endswith((".yml", ".yaml")):
        collapsed = collapsed.replace(".", "-")
    return collapsed


HOST_NAME = lazyre.compile(r"[a-z0-9][a-z0-9-]{0,30}")
RESERVED_HOST_NAMES = ("local", "any")


def host_name_problem(name: str, allow_local: bool = False) -> str | None:
    """What is wrong with a name for a host (`agentbox hosts add NAME`, tasks.hosts), or None."""
    if allow_local and name == "local":
        return None
    if name in RESERVED_HOST_NAMES:
        return f"{name!r} is reserved (`--on {name}` means {'this machine' if name == 'local' else 'any host'})"
    if not HOST_NAME.fullmatch(name):
        return (f"{name!r} is not a host name agentbox takes: 1 to 31 lowercase letters, digits and -, "
                "starting with a letter or digit")
    return None
