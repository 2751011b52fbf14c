"""Show a merged config: as JSON in agentbox.yml's shape, or as text with the origin of each value."""

from __future__ import annotations

import json
from typing import Any

from agentbox.config import Config


def as_json(config: Config, show_secrets: bool = False) -> str:
    return json.dumps(shown(config, show_secrets), indent=2, ensure_ascii=False)


def shown(config: Config, show_secrets: bool) -> dict[str, Any]:
    """The merged config; env values (tokens, more often than not) masked unless asked for."""
    data = config.to_json()
    if not show_secrets:
        data["env"] = {key: masked(value) for key, value in data["env"].items()}
    return data


def masked(value: str) -> str:
    return f"<set, {len(value)} chars>"


def as_text(config: Config, show_secrets: bool = False) -> str:
    lines = [f"# workspace: {config.workspace}"]
    lines.append(f"# global config: {config.global_file or 'none'}")
    lines.append(f"# local config:  {config.local_file or 'none'}")
    rows = [(key, _show(value), origin_of(config, key)) for key, value in flatten(shown(config, show_secrets))]
    width = max(len(key) + len(value) for key, value, _ in rows) + 3
    for key, value, origin in rows:
        lines.append(f"{key}: {value}".ljust(width) + f"  # {origin}")
    return "\n".join(lines) + "\n"


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
    from agentbox.safetext import visible

    return visible(json.dumps(value, ensure_ascii=False))
