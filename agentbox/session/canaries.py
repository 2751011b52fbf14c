"""Canary secrets, new for every session: planted in the VM where agents look for secrets, known to the proxy.

`plant(vm, id)` makes them on the host (`secrets`), before the launch's one `limactl shell`:
  - staging/canaries/ID (0600, in the read-only staging mount): KIND=VALUE lines launch.sh places (launch/canary.sh,
    --canaries ID): ~/.aws/credentials (an access key pair), ~/.env (a database URL's password) and CANARY_ENV in
    the program's environment;
  - network/canaries.json (0600): every session's values with their kind, newest KEPT sessions, which the proxy
    rereads (agentbox.net.doors). Values of sessions that ended stay: an agent may have copied one.
A launch's ID is its warm nonce (agentbox.session.warm) when it has one, so a launch from a verified plan replays
`--canaries {nonce}` with its own. `report(planted)` after the shell warns once of the attempted leaks the proxy
logged during the session.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import string
import time
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import paths, staginglayout
from agentbox.fsutil import atomic_write, locked, private_dir
from agentbox.progress import warn
from agentbox.safetext import visible

FOLDER = staginglayout.CANARIES
FILE = "canaries.json"  # in the network folder: agentbox.net.doors.CANARIES_FILE reads it
KEPT = 256
CANARY_ENV = "STRIPE_API_KEY"  # believable, and used by none of the agents agentbox runs
_ALNUM = string.ascii_letters + string.digits
_UPPER = string.ascii_uppercase + string.digits


class Planted(NamedTuple):
    vm: str
    id: str
    log_offset: int  # where the proxy's log ended when the session began


def _random(alphabet: str, size: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(size))


def make() -> dict[str, list[str]]:
    """One session's values, by kind: each looks like the real thing and is random."""
    return {"aws": ["AKIA" + _random(_UPPER, 16), _random(_ALNUM, 40)],
            "env": ["sk_live_" + _random(_ALNUM, 32)],
            "dotenv": [_random(_ALNUM, 24)]}


def plant(vm_name: str, session_id: str) -> Planted:
    """This session's canaries: staged for launch.sh and added to what the proxy refuses."""
    values = make()
    network = paths.vm_state_dir(vm_name) / "network"
    private_dir(network)
    with locked(network / "canaries.lock"):
        known = _read_json(network / FILE).get("sessions", [])
        sessions = [s for s in known if isinstance(s, dict)][-(KEPT - 1):]
        sessions.append({"id": session_id, "started": int(time.time()), "values": values})
        atomic_write(network / FILE, json.dumps({"sessions": sessions}) + "\n", mode=0o600,
                     durable=False)
    aws_id, aws_secret = values["aws"]
    staged = (f"aws_id={aws_id}\naws_secret={aws_secret}\nenv_name={CANARY_ENV}\nenv={values['env'][0]}\n"
              f"dotenv={values['dotenv'][0]}\n")
    folder = paths.staging_dir(vm_name) / FOLDER
    private_dir(folder)
    atomic_write(folder / session_id, staged, mode=0o600, durable=False)
    return Planted(vm_name, session_id, _size(network / "log.jsonl"))


def session_id(nonce: str) -> str:
    """The launch's id: its warm nonce, or a new one for a launch without."""
    return nonce or secrets.token_hex(16)


def options(planted: Planted) -> list[str]:
    return ["--canaries", planted.id]


def done(planted: Planted) -> None:
    """After the shell: launch.sh has placed them, the staged copy goes."""
    with contextlib.suppress(OSError):
        os.unlink(paths.staging_dir(planted.vm) / FOLDER / planted.id)


def report(planted: Planted) -> None:
    """One warning for the attempted leaks the proxy refused since the session began (host and kind of each)."""
    done(planted)
    log = paths.vm_state_dir(planted.vm) / "network" / "log.jsonl"
    if _size(log) <= planted.log_offset:
        return
    found: dict[str, None] = {}
    with contextlib.suppress(OSError), open(log, "rb") as handle:
        handle.seek(planted.log_offset)
        for raw in handle.read(8 << 20).splitlines():
            entry = _entry(raw)
            if entry.get("decision") == "leak":
                what = entry.get("what")
                kind = f"private file {entry.get('file')}" if what == "private" else f"canary ({what})"
                found[f"{kind} to {entry.get('host')}"] = None
    if found:
        warn(visible(f"the session tried to send secrets out and was refused: {', '.join(found)}")
             + " (`agentbox net log --leaks`)")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as handle:
        return _entry(handle.read())


def _entry(raw: bytes) -> dict[str, Any]:
    try:
        entry = json.loads(raw)
    except ValueError:
        return {}
    return entry if isinstance(entry, dict) else {}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
