"""Remote (http/sse) MCP servers the VM gets that its network policy blocks: the launch names them.

The servers come from the user's own files in their host home (~/.claude.json, ~/.gemini/settings.json,
~/.codex/config.toml, ~/.kiro/settings/mcp.json), never from the project. Even so the launch does not widen
the policy by itself: in allowlist mode the user chose what the VM may reach, and a server's host joins it
only by `agentbox net allow HOST` (or `network.allow`). What is read is the staged copy the VM gets (already
filtered, ~/.claude.json already cut to this workspace), and only in allowlist and offline mode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from agentbox import staginglayout
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.fsutil import read_capped
from agentbox.sync import agentsetup
from agentbox.sync.transform import URL_KEYS, toml_parser

MAX_READ = 32 << 20

# The transforms (agents' records: login_transforms, sync_transforms) whose files hold MCP servers, and the key
# holding them; claude_json also holds them per project.
SERVERS_KEY = {"claude_json": "mcpServers", "codex_config": "mcp_servers", "gemini_settings": "mcpServers",
               "mcp_file": "mcpServers"}
PER_PROJECT = "claude_json"


class Remote(NamedTuple):
    where: str  # "~/.claude.json mcpServers.docs"
    host: str  # lower case
    port: int


def remote_servers(staging: Path, agents: Iterable[str]) -> list[Remote]:
    """The remote MCP servers in the staged files of these agents (their records name the files)."""
    found: list[Remote] = []
    for agent in agents:
        for path, shown, transform in _sources(staging, agent):
            document = _read(path)
            if document is None:
                continue
            key = SERVERS_KEY[transform]
            found += _remotes(document.get(key), f"{shown} {key}")
            projects = document.get("projects") if transform == PER_PROJECT else None
            if isinstance(projects, dict):
                for folder, project in projects.items():
                    if isinstance(project, dict):
                        found += _remotes(project.get(key), f"{shown} projects[{folder}].{key}")
    return found


def _sources(staging: Path, agent: str) -> Iterator[tuple[Path, str, str]]:
    """(staged file, its path as the user knows it, its transform) for each file of the agent that may hold
    MCP servers: its login files in creds/home, its own setup in sync/AGENT/home (globs expanded there)."""
    spec = BUILTIN_AGENTS.get(agent)
    if spec is None:
        return
    for relative, transform in spec.login_transforms:
        if transform in SERVERS_KEY:
            yield staging / staginglayout.CREDS_HOME / relative, f"~/{relative}", transform
    if not spec.folder:
        return
    home = staging / agentsetup.SYNC / agent / agentsetup.HOME
    for pattern, transform in spec.sync_transforms:
        if transform in SERVERS_KEY:
            for path in sorted(home.glob(f"{spec.folder}/{pattern}")):
                yield path, f"~/{path.relative_to(home).as_posix()}", transform


def blocked(remotes: Iterable[Remote], allowed: Iterable[str]) -> list[Remote]:
    """The servers whose host no pattern of the policy lets through (patterns as `network.allow` takes them)."""
    patterns = list(allowed)
    return [remote for remote in remotes if not any(_matches(pattern, remote) for pattern in patterns)]


def message(mode: str, servers: list[Remote]) -> str:
    """What the launch says about blocked servers (agent-written text escaped by the caller)."""
    named = ", ".join(f"{server.where} ({server.host})" for server in servers)
    if mode == "offline":
        return (f"network.mode is offline, so these remote MCP servers cannot be reached from the VM: {named}; "
                "`network.mode: allowlist` with `agentbox net allow HOST` would let them through")
    hosts = sorted({server.host if server.port in (80, 443) else f"{server.host}:{server.port}" for server in servers})
    how = " and ".join(f"`agentbox net allow {host}`" for host in hosts)
    return f"network.mode is allowlist and it blocks these remote MCP servers: {named}; allow them with {how}"


def _read(path: Path) -> dict[str, Any] | None:


    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as handle:
            data = read_capped(handle.fileno(), MAX_READ)
    except OSError:
        return None
    if len(data) > MAX_READ:
        return None
    try:
        if path.suffix == ".toml":
            parsed: Any = toml_parser().loads(data.decode("utf-8"))
        else:
            parsed = json.loads(data)
    except ValueError:  # UnicodeDecodeError, JSONDecodeError and TOMLDecodeError are ValueErrors
        return None
    return parsed if isinstance(parsed, dict) else None


def _remotes(servers: Any, where: str) -> Iterator[Remote]:
    if not isinstance(servers, dict):
        return
    for name, server in servers.items():
        if not isinstance(server, dict) or server.get("command") is not None:
            continue
        url = next((server[key] for key in URL_KEYS if isinstance(server.get(key), str)), None)
        if url is None:
            continue
        try:
            parts = urlsplit(url)
            port = parts.port or (80 if parts.scheme == "http" else 443)
        except ValueError:
            continue
        if parts.hostname:
            yield Remote(f"{where}.{name}", parts.hostname.lower().rstrip("."), port)


def _matches(pattern: str, remote: Remote) -> bool:
    host, port = pattern.lower(), None
    if host.startswith("["):  # [v6]:port
        inner, _, rest = host[1:].partition("]")
        host, port = inner, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    elif host.count(":") == 1:
        name, _, digits = host.partition(":")
        if digits.isdigit():
            host, port = name, int(digits)
    if port is not None and port != remote.port:
        return False
    if port is None and remote.port not in (80, 443):
        return False
    if host.startswith("*."):
        return remote.host.endswith(host[1:])
    return remote.host == host
