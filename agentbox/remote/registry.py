"""The machines agentbox may send isolated tasks to (`agentbox hosts add NAME [ssh://][user@]host[:port]`).

Each is `<state>/hosts/NAME/host.json` (paths.hosts_dir): the address, when it was added, and what agentbox last
learnt of it (the far end's facts, when it was last reached, since when it has been unreachable). Nothing secret:
ssh reaches the host with the user's own config, keys and agent. The address is checked here once, so that no
part of it can reach ssh as an option (a host name starting with `-`, say).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote

from agentbox import lazyre, paths
from agentbox.config.naming import host_name_problem
from agentbox.errors import AgentboxError, ConfigError
from agentbox.fsutil import atomic_write, private_dir
from agentbox.remote.ssh import Target

if TYPE_CHECKING:
    from agentbox.remote.ssh import Target

RECORD = "host.json"
MAX_RECORD = 256 * 1024
# A DNS name, an IPv4 address or a bracketed IPv6 address; and an ssh config alias (letters, digits, . _ -).
_HOSTNAME = lazyre.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})|\[[0-9A-Fa-f:.%a-z]{2,60}\]")
_USER = lazyre.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
ADD_HINT = ("Add it with `agentbox hosts add NAME [user@]host` (or ssh://[user@]host[:port]); `agentbox hosts ls` "
            "lists the hosts.")


class UnknownHost(AgentboxError):
    exit_code = 2


class Host(NamedTuple):
    name: str
    url: str
    hostname: str
    user: str | None = None
    port: int | None = None
    added: float = 0.0
    facts: dict[str, Any] | None = None  # the far end's `facts`, when last asked
    seen: float | None = None  # when agentbox last reached it
    unreachable_since: float | None = None  # the first failed attempt since it was last reached

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "hostname": self.hostname, "user": self.user, "port": self.port,
                "added": self.added, "facts": self.facts, "seen": self.seen,
                "unreachableSince": self.unreachable_since}

    def target(self) -> Target:
        """What the transport is told (agentbox.remote.ssh)."""
        return Target(self.name, self.user, self.hostname, self.port)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Host:
        return cls(name=str(data["name"]), url=str(data["url"]), hostname=str(data["hostname"]),
                   user=data.get("user"), port=data.get("port"), added=float(data.get("added") or 0.0),
                   facts=data.get("facts") if isinstance(data.get("facts"), dict) else None,
                   seen=data.get("seen"), unreachable_since=data.get("unreachableSince"))


def normal_url(url: str) -> str:
    """The address as agentbox records it: `user@host` as ssh users type it is `ssh://user@host`."""
    return url if "://" in url else "ssh://" + url


def parse_url(url: str) -> tuple[str | None, str, int | None]:
    """(user, host, port) of `[ssh://][user@]host[:port]`; ConfigError says what is wrong."""
    hint = ("Write it as ssh://[user@]host[:port] or as you would after `ssh`, e.g. me@build.example.com, "
            "ssh://mini:2222.")
    if url.startswith("-"):
        raise ConfigError(f"{url!r} is not an address: ssh would read it as an option", hint=hint)
    if "://" in url and not url.startswith("ssh://"):
        raise ConfigError(f"{url!r} is not an ssh:// address", hint=hint)
    rest = url.removeprefix("ssh://").rstrip("/")
    if not rest or "/" in rest or "?" in rest or "#" in rest:
        raise ConfigError(f"{url!r}: agentbox takes only ssh://[user@]host[:port], with no path", hint=hint)
    user = None
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        user = unquote(user)
        if not _USER.fullmatch(user):
            raise ConfigError(f"{url!r}: {user!r} is not a user name agentbox passes to ssh", hint=hint)
    port = None
    match = re.fullmatch(r"(.*?)(?::(\d{1,5}))?", rest)
    assert match is not None
    host, port_text = match.group(1), match.group(2)
    if port_text is not None:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ConfigError(f"{url!r}: port {port} is out of range (1-65535)", hint=hint)
    if not _HOSTNAME.fullmatch(host):
        raise ConfigError(f"{url!r}: {host!r} is not a host name agentbox passes to ssh", hint=hint)
    return user, host, port


def folder(name: str) -> Path:
    return paths.hosts_dir() / name


def add(name: str, url: str) -> Host:
    """Record a new host (nothing is contacted). ConfigError for a bad name or address, or a name in use."""
    problem = host_name_problem(name)
    if problem:
        raise ConfigError(f"host name {problem}", hint="Pick another name, e.g. `server` or `mini`.")
    user, hostname, port = parse_url(url)
    url = normal_url(url)
    if get(name) is not None:
        raise ConfigError(f"a host named {name} is already added ({get(name).url})",  # type: ignore[union-attr]
                          hint=f"`agentbox hosts rm {name}` first, or pick another name.")
    host = Host(name, url, hostname, user, port, added=time.time())
    private_dir(folder(name))
    save(host)
    return host


def save(host: Host) -> None:
    atomic_write(folder(host.name) / RECORD, json.dumps(host.to_json(), indent=2) + "\n", mode=0o600)


def get(name: str) -> Host | None:
    """The host's record, or None (also for a name no host could have)."""
    if host_name_problem(name):
        return None
    try:
        with open(folder(name) / RECORD, "rb") as handle:
            data = json.loads(handle.read(MAX_RECORD))
        return Host.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def require(name: str) -> Host:
    host = get(name)
    if host is None:
        known = ", ".join(h.name for h in all_hosts()) or "none yet"
        raise UnknownHost(f"no host named {name!r} (hosts: {known})", hint=ADD_HINT)
    return host


def all_hosts() -> list[Host]:
    try:
        names = sorted(os.listdir(paths.hosts_dir()))
    except OSError:
        return []
    return [host for host in (get(name) for name in names) if host is not None]


def remove(name: str) -> bool:
    """Forget the host (its record and agentbox's connection folder). True when there was one."""
    if get(name) is None:
        return False
    shutil.rmtree(folder(name), ignore_errors=True)
    return True


def reached(host: Host, facts: dict[str, Any] | None = None) -> Host:
    """Note that the host answered now (and what it said of itself)."""
    host = get(host.name) or host  # as recorded now: another process may have noted something since
    updated = host._replace(seen=time.time(), unreachable_since=None,
                            facts=facts if facts is not None else host.facts)
    save(updated)
    return updated


def unreachable(host: Host) -> Host:
    """Note a failed attempt; the first one since the host last answered starts `unreachable since`."""
    host = get(host.name) or host
    if host.unreachable_since is not None:
        return host
    updated = host._replace(unreachable_since=time.time())
    save(updated)
    return updated
