"""gh's hosts.yml in the shape gh writes it, read and written without PyYAML (~40 ms of every launch with a gh login):
block mappings of plain or simply quoted scalars, comments and blank lines. Anything else is declined (`None`) and
the caller reads it with PyYAML, so what either gives is the same (tests/test_ghhosts.py holds them side by side)."""

from __future__ import annotations

from typing import Any

MAX_SIZE = 64 << 10  # gh's own file is a few hundred bytes; a bigger one goes to PyYAML
MAX_DEPTH = 8
MAX_KEY = 100  # PyYAML writes a key of 128 characters or more as a complex key (`? key`)
_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_REST = _FIRST | frozenset("0123456789.-")
# Words YAML 1.1 (PyYAML's resolver) reads as booleans or null, not strings. `y` and `n` are not among PyYAML's,
# but declining them costs nothing.
_NOT_STRINGS = frozenset({"yes", "no", "true", "false", "on", "off", "null", "y", "n"})
_PRINTABLE = frozenset(range(0x20, 0x7F)) | {0x0A}


def plain(text: str) -> bool:
    """Whether `text` is a scalar YAML reads back as this string when written unquoted (and PyYAML writes so)."""
    return (bool(text) and text[0] in _FIRST and all(c in _REST for c in text)
            and text.lower() not in _NOT_STRINGS)


def load(data: bytes) -> tuple[dict[str, Any] | None] | None:
    """(the document: a mapping, or None for a file of comments and blank lines), or None: not a shape this reader
    takes (the caller asks PyYAML, which may also call it an error)."""
    if len(data) > MAX_SIZE or not _PRINTABLE.issuperset(data):
        return None
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(0, root)]  # (indent of the mapping's keys, the mapping)
    opened: tuple[dict[str, Any], str] | None = None  # a key without a value: null unless a deeper line follows
    for line in data.decode("ascii").split("\n"):
        content = line.lstrip(" ")
        if not content or content.startswith("#"):
            continue
        indent = len(line) - len(content)
        if opened is not None and indent > stack[-1][0]:
            if len(stack) >= MAX_DEPTH:
                return None
            nested: dict[str, Any] = {}
            opened[0][opened[1]] = nested
            stack.append((indent, nested))
        opened = None
        while indent < stack[-1][0]:
            stack.pop()
        parsed = _entry(content) if indent == stack[-1][0] else None
        if parsed is None:
            return None
        key, value, empty = parsed
        mapping = stack[-1][1]
        if key in mapping:
            return None  # PyYAML keeps the last of duplicate keys; gh never writes one
        mapping[key] = value
        if empty:
            opened = (mapping, key)
    return (root or None,)


def _entry(content: str) -> tuple[str, Any, bool] | None:
    """`key: value  # comment` as (key, value, whether the value is empty), or None: not a shape this reader takes."""
    colon = content.find(":")
    key, rest = content[:colon], content[colon + 1:]
    if not 0 < colon <= MAX_KEY or not plain(key) or rest[:1] not in ("", " "):
        return None
    rest = rest.lstrip(" ")
    if not rest or rest.startswith("#"):
        return key, None, True
    value: Any
    if rest[0] == "'":
        end, value = 1, ""
        while True:
            close = rest.find("'", end)
            if close < 0:
                return None
            value += rest[end:close]
            if rest[close + 1:close + 2] != "'":
                break
            value, end = value + "'", close + 2
        after = rest[close + 1:]
    elif rest[0] == '"':
        close = rest.find('"', 1)
        value, after = rest[1:close], rest[close + 1:]
        if close < 0 or "\\" in value:
            return None
    elif rest.startswith("{}"):
        value, after = {}, rest[2:]
    else:
        space = rest.find(" ")
        value, after = (rest, "") if space < 0 else (rest[:space], rest[space:])
        if not plain(value):
            return None
    stripped = after.lstrip(" ")
    if stripped and not (stripped.startswith("#") and stripped != after):
        return None
    return key, value, False


def dump(mapping: dict[str, Any], indent: int = 0) -> str | None:
    """PyYAML's safe_dump(mapping, default_flow_style=False, sort_keys=True) for a mapping of mappings and strings
    that need no quotes; None for anything else (the caller asks PyYAML)."""
    lines = []
    for key in sorted(mapping):
        value = mapping[key]
        if not isinstance(key, str) or len(key) > MAX_KEY or not plain(key):
            return None
        if isinstance(value, str) and plain(value):
            lines.append(f"{' ' * indent}{key}: {value}\n")
        elif isinstance(value, dict) and value:
            inner = dump(value, indent + 2)
            if inner is None:
                return None
            lines.append(f"{' ' * indent}{key}:\n{inner}")
        else:
            return None
    return "".join(lines)
