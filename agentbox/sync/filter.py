"""Whether a file `sync pull` brings back from the VM would make an agent CLI on the host run programs.

An agent CLI reads hooks and MCP servers (programs it starts) from a Markdown file's front matter (a skill, a
subagent, a command), from a JSON agent (Kiro), and from YAML or TOML settings. The VM wrote the file, so it is
read with real parsers, not searched as text: the front matter with yaml.safe_load (at most FRONT_MATTER_LIMIT
bytes), JSON with json, YAML with yaml.safe_load_all, TOML with tomllib (tomli on 3.10). A key naming hooks or
MCP servers, in any spelling (`hooks`, `Hooks`, `HOOKS`, `mcpServers`, `mcp_servers`, `mcp-servers`, `MCP`) and
at any depth (a CLI may read it from a nested block: plugins, profiles), keeps the file in the VM; so does a
front matter or a document that does not parse, or nests deeper than MAX_DEPTH, since then no one can say what
a CLI will make of it.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import yaml

from agentbox.safetext import visible
from agentbox.sync.transform import toml_parser

FRONT_MATTER_LIMIT = 64 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000
MARKDOWN = (".md", ".markdown", ".mdc", ".mdx")
_RUNS_PROGRAMS = {"hooks", "hook", "mcpservers", "mcpserver", "mcp"}  # lower case, letters and digits only


class _Unreadable(Exception):
    pass


def runs_programs(relative: str, data: bytes) -> str | None:
    """Why the file must not reach the host (it defines hooks or MCP servers, or cannot be parsed), else None."""
    extension = posixpath.splitext(relative)[1].lower()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = None
    try:
        if text is not None and _starts_front_matter(text):
            found = _defines(_front_matter(text))
            where = "its front matter"
        elif extension in MARKDOWN:
            return None  # no front matter: plain text to the CLI
        elif extension == ".json":
            found = _defines(_json(text))
            where = "it"
        elif extension in (".yaml", ".yml"):
            found = _defines(_yaml_all(text))
            where = "it"
        elif extension == ".toml":
            found = _defines(_toml(text))
            where = "it"
        else:
            return None
    except _Unreadable as exc:
        return str(exc)
    if found:
        return f"{where} defines {found}, which would run programs on your host"
    return None


def _starts_front_matter(text: str) -> bool:
    first = text.split("\n", 1)[0]
    return first.rstrip("\r").rstrip() == "---"


def _front_matter(text: str) -> Any:
    lines = text.split("\n")
    for index, line in enumerate(lines[1:], 1):
        if line.rstrip("\r").rstrip() in ("---", "..."):
            block = "\n".join(lines[1:index])
            break
    else:
        raise _Unreadable("its front matter has no closing `---` line, so what a CLI makes of it is unclear")
    if len(block.encode()) > FRONT_MATTER_LIMIT:
        raise _Unreadable(f"its front matter is larger than {FRONT_MATTER_LIMIT // 1024} KiB")
    try:
        return yaml.safe_load(block)
    except (yaml.YAMLError, RecursionError) as exc:
        raise _Unreadable(f"its front matter is not valid YAML ({_first_line(exc)})") from None


def _json(text: str | None) -> Any:
    if text is None:
        raise _Unreadable("not UTF-8 text, so not valid JSON")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Unreadable(f"not valid JSON ({_first_line(exc)})") from None


def _yaml_all(text: str | None) -> Any:
    if text is None:
        raise _Unreadable("not UTF-8 text, so not valid YAML")
    try:
        return list(yaml.safe_load_all(text))
    except (yaml.YAMLError, RecursionError) as exc:
        raise _Unreadable(f"not valid YAML ({_first_line(exc)})") from None


def _toml(text: str | None) -> Any:
    if text is None:
        raise _Unreadable("not UTF-8 text, so not valid TOML")

    tomllib = toml_parser()
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise _Unreadable(f"not valid TOML ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _defines(document: Any) -> str | None:
    """The first key in document (any depth) that names hooks or MCP servers, as `key` (what it is)."""
    seen: set[int] = set()  # YAML aliases share objects: each is looked at once, and a cycle ends
    stack: list[tuple[Any, int]] = [(document, 0)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        nodes += 1
        if depth > MAX_DEPTH or nodes > MAX_NODES:
            raise _Unreadable(f"it nests deeper than {MAX_DEPTH} levels or holds more than {MAX_NODES:,} "
                              "blocks, more than agentbox looks through")
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict):
            for key in node:
                if "".join(c for c in str(key).lower() if c.isalnum()) in _RUNS_PROGRAMS:
                    return f"`{_short(str(key))}`"
        stack.extend((child, depth + 1) for child in children)
    return None


def _short(key: str) -> str:
    return visible(key[:60])
