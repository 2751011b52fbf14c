"""Write parsed TOML data back as TOML: the small writer agentbox needs for the Codex config it filters.

Python reads TOML (tomllib, 3.11+) but cannot write it. This writer covers exactly what tomllib
returns: strings, integers, floats, booleans, dates and times, arrays and tables, arrays of tables.
Comments and the original layout are not kept (the VM gets a filtered copy; the host's file is
never rewritten). `dumps(tomllib.loads(dumps(data))) == dumps(data)` for any such data, and
tests check that parsing the output gives back the data.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def dumps(data: Mapping[str, Any]) -> str:
    """A TOML document for a table (a mapping of string keys)."""
    lines: list[str] = []
    _table(data, (), lines)
    text = "\n".join(lines).strip("\n")
    return text + "\n" if text else ""


def _table(data: Mapping[str, Any], path: tuple[str, ...], lines: list[str]) -> None:
    """Plain values first (they belong to this table's header), then sub-tables and arrays of tables."""
    later: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, Mapping) or _is_table_array(value):
            later.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in later:
        sub = (*path, key)
        if isinstance(value, Mapping):
            if _needs_header(value):
                lines.extend(["", f"[{_dotted(sub)}]"])
            _table(value, sub, lines)
        else:
            for item in value:
                lines.extend(["", f"[[{_dotted(sub)}]]"])
                _table(item, sub, lines)


def _needs_header(table: Mapping[str, Any]) -> bool:
    """A table that holds only sub-tables is implied by their headers; an empty or plain-valued one needs its own."""
    return not table or any(not isinstance(v, Mapping) and not _is_table_array(v) for v in table.values())


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, Mapping) for item in value)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_key(part) for part in path)


def _key(key: str) -> str:
    if not isinstance(key, str):
        raise TypeError(f"TOML keys are strings, not {type(key).__name__}")
    return key if _BARE_KEY.match(key) else _string(key)


def _string(text: str) -> str:
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):  # a table inside an array: written inline
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"TOML has no value of type {type(value).__name__}")
