"""Show a merged config: as JSON in agentbox.yml's shape, or as text with the origin of each value."""

from __future__ import annotations

import difflib
import json
import re
import textwrap
from typing import Any

from agentbox import lazyre
from agentbox.config import load
from agentbox.config.load import Config
from agentbox.errors import UsageError
from agentbox.safetext import visible

INDENT = "    "


def as_json(config: Config, show_secrets: bool = False, with_sources: bool = False) -> str:
    """The merged config; with_sources wraps it as {"config": ..., "sources": {"vm.cpus": "local (/p/agentbox.yml)"}}
    (the keys as `agentbox config` prints them), so scripts reading the plain object keep working."""
    data = shown(config, show_secrets)
    if with_sources:
        data = {"config": data, "sources": {key: origin_of(config, key) for key, _ in flatten(data)}}
    return json.dumps(data, indent=2, ensure_ascii=False)


def shown(config: Config, show_secrets: bool) -> dict[str, Any]:
    """The merged config; env values (tokens, more often than not) masked unless asked for."""
    data = config.to_json()
    if not show_secrets:
        data["env"] = {key: masked(value) for key, value in data["env"].items()}
    return data


def masked(value: str) -> str:
    return f"<set, {len(value)} chars>"


def as_text(config: Config, show_secrets: bool = False, width: int = 100, only_changed: bool = False) -> str:
    """One `key: value  # origin` line per value, unpadded. When that is wider than width, the value goes
    on its own line below `key:  # origin` (a list: one item per line), and an origin too long for the
    key's line goes below the value, and a value or origin still wider is cut between words onto further lines,
    indented deeper. Origins name the layer; the header names the files."""
    lines = [*_fitted(f"# global config: {_file_state(config, config.global_file, 'global')}", width, "#   "),
             *_fitted(f"# local config: {_file_state(config, config.local_file, 'local')}", width, "#   ")]
    rows = changed(config, show_secrets) if only_changed else flatten(shown(config, show_secrets))
    for key, value in rows:
        origin = f"# {_short_origin(config, origin_of(config, key))}"
        text = _show(value)
        line = f"{key}: {text}  {origin}"
        if len(line) <= width:
            lines.append(line)
            continue
        origin_fits = len(f"{key}:  {origin}") <= width
        lines.append(f"{key}:  {origin}" if origin_fits else f"{key}:")
        if isinstance(value, list) and len(INDENT) + len(text) > width:
            for item in value:
                lines.extend(_fitted(f"{INDENT}- {_show(item)}", width, INDENT + "    "))
        else:
            lines.extend(_fitted(INDENT + text, width, INDENT + "  "))
        if not origin_fits:
            lines.extend(_fitted(INDENT + origin, width, INDENT + "  "))
    return "\n".join(lines) + "\n"


def changed(config: Config, show_secrets: bool = False) -> list[tuple[str, Any]]:
    """The keys a config file sets to something other than agentbox's default, as `agentbox config` shows them:
    what the built-in defaults alone would give for the same workspace is the reference."""
    defaults = dict(flatten(shown(load.resolve(config.cwd, [], [], config.workspace), show_secrets)))
    return [(key, value) for key, value in flatten(shown(config, show_secrets))
            if origin_of(config, key).startswith(("global (", "local (")) and (key not in defaults
                                                                            or defaults[key] != value)]


def changed_json(config: Config, show_secrets: bool = False) -> str:
    """{"vm.cpus": 4, ...}: the changed keys, named as `agentbox config` names them."""
    return json.dumps(dict(changed(config, show_secrets)), indent=2)  # ASCII: see value_of


def value_of(config: Config, key: str, show_secrets: bool = False) -> str:
    """One key's effective value for `agentbox config get`: a string as it is, anything else as JSON (a section,
    like `vm` or `agents.claude`, as one JSON object). An unknown key is a usage error with the nearest known one."""
    data = shown(config, show_secrets)
    found = _lookup(data, key)
    if found is _MISSING:
        known = _known_keys(data)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)

        raise UsageError(visible(f"no config key `{key}`" + (f": did you mean {close[0]}?" if close else "")),
                         hint="`agentbox config` lists every key with its value and where it came from.")
    # What the workspace's file says reaches the terminal: a string with its control characters escaped, JSON as
    # ASCII (its escapes keep bidi and C1 characters from acting on the terminal and stay valid JSON).
    if isinstance(found, str):

        return visible(found)
    return json.dumps(found, indent=2 if isinstance(found, (dict, list)) and found else None)


_MISSING = object()
_PART = lazyre.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _lookup(data: Any, key: str) -> Any:
    """data at `vm.cpus`, `mounts[0].location` or `agents.claude`; _MISSING when there is nothing there."""
    if not key or not re.fullmatch(r"(?:[^.\[\]]+|\[\d+\])(?:\.[^.\[\]]+|\[\d+\])*", key):
        return _MISSING
    for name, index in _PART.findall(key):
        if name and isinstance(data, dict) and name in data:
            data = data[name]
        elif index and isinstance(data, list) and int(index) < len(data):
            data = data[int(index)]
        else:
            return _MISSING
    return data


def _known_keys(data: Any) -> list[str]:
    """Every key `config get` answers: each value's key and each section above it."""
    known: dict[str, None] = {}
    for key, _ in flatten(data):
        parts = [match.end() for match in re.finditer(r"(?=[.\[])", key)]
        for end in parts:
            known.setdefault(key[:end])
        known.setdefault(key)
    return [key for key in known if key]


def _fitted(line: str, width: int, continuation: str) -> list[str]:
    """The line as it is when it fits; else cut between words (inside a word longer than a line), each further
    piece indented below the first: a long install command stays readable at the terminal's width."""
    if len(line) <= width:
        return [line]

    first = line[:len(line) - len(line.lstrip())]
    return textwrap.wrap(line.lstrip(), max(width, len(continuation) + 20), initial_indent=first,
                         subsequent_indent=continuation, break_on_hyphens=False, drop_whitespace=True)


def _file_state(config: Config, path: Any, layer: str) -> str:
    """The file a layer came from, or why there is none (a file agentbox will not use says why)."""
    if path is not None:
        return visible(str(path))
    for unusable in config.unusable:
        if unusable.layer == layer:
            return f"none ({unusable.shown} is not used: {unusable.reason})"
    return "none"


def _short_origin(config: Config, origin: str) -> str:
    """"local (/p/agentbox.yml)" -> "local": the header already names the file."""
    for name, path in (("global", config.global_file), ("local", config.local_file)):
        if path is not None and origin == f"{name} ({path})":
            return name
    return origin


def flatten(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict) and data and prefix != "vm.lima":
        rows = []
        for key, value in data.items():
            rows.extend(flatten(value, f"{prefix}.{key}" if prefix else key))
        return rows
    if isinstance(data, list) and data and prefix != "agents" and not all(isinstance(i, str) for i in data):
        rows = []
        for index, value in enumerate(data):
            rows.extend(flatten(value, f"{prefix}[{index}]"))
        return rows
    return [(prefix, data)]


def origin_of(config: Config, key: str) -> str:
    """The origin recorded for key or, failing that, for the nearest enclosing key."""
    candidate = key
    while candidate:
        if candidate in config.origins:
            return config.origins[candidate]
        cut = max(candidate.rfind("."), candidate.rfind("["))
        candidate = candidate[:cut] if cut > 0 else ""
    return "default"


def _show(value: Any) -> str:
    if value is None:
        return "(not set)"

    return visible(json.dumps(value, ensure_ascii=False))
