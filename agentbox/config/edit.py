"""Add an entry to a list in a config file, keeping the rest of the file as the user wrote it.

Used by `agentbox net allow`. The file's text is edited where the list is (a block list gets a line; a flow
value is rewritten in flow style, which is JSON); a missing key is added under its mapping, or at the end.
The result is parsed again and must equal the old data with the entry added, else nothing is written. The
file is replaced atomically with its mode kept; a symlink or a file that is not regular is refused.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from agentbox.errors import ConfigError
from agentbox.fsutil import atomic_write

MAX_CONFIG = 1_000_000


def add_to_list(path: Path, keypath: tuple[str, ...], entry: str) -> bool:
    """Append entry to the list at keypath in the YAML file (created when missing); False when already there."""
    text = _read(path)
    root = yaml.compose(text) if text.strip() else None
    data = yaml.safe_load(text) if text.strip() else None
    data = data if data is not None else {}
    if not isinstance(data, dict) or (root is not None and not isinstance(root, yaml.MappingNode)):
        raise ConfigError(f"{path}: expected a mapping at the top level",
                          hint="Fix the file, then run the command again.")
    expected = copy.deepcopy(data)
    target: Any = expected
    for part in keypath[:-1]:
        if target.get(part) is None:
            target[part] = {}
        value = target[part]
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {'.'.join(keypath[:keypath.index(part) + 1])}: expected a mapping",
                              hint="Fix the file, then run the command again.")
        target = value
    current = target.get(keypath[-1])
    if current is None:
        current = []
    if not isinstance(current, list):
        raise ConfigError(f"{path}: {'.'.join(keypath)}: expected a list, found {type(current).__name__}",
                          hint=f"Write it as a list, e.g. `{keypath[-1]}: [{entry}]`.")
    if entry in current:
        return False
    target[keypath[-1]] = [*current, entry]
    new_text = _edited(text, root, keypath, entry, target[keypath[-1]])
    if yaml.safe_load(new_text) != expected:
        raise ConfigError(f"{path}: agentbox could not add {entry} to {'.'.join(keypath)} without changing other "
                          "settings", hint=f"Add it by hand: `{'.'.join(keypath)}: [{entry}]`.")
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o644
    atomic_write(path, new_text, mode=mode)
    return True


def _read(path: Path) -> str:
    if os.path.islink(path):
        raise ConfigError(f"{path} is a symlink; agentbox edits only a regular file",
                          hint=f"Edit {os.path.realpath(path)} by hand.")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ConfigError(f"{path} is not a regular file", hint="Replace it with a YAML file.")
        raw = handle.read(MAX_CONFIG + 1)
    if len(raw) > MAX_CONFIG:
        raise ConfigError(f"{path} is larger than {MAX_CONFIG:,} bytes", hint="A config file is much smaller.")
    return raw.decode()


def _edited(text: str, root: yaml.Node | None, keypath: tuple[str, ...], entry: str, new_list: list[str]) -> str:
    """The text with the list at keypath now new_list (entry appended)."""
    node = root
    depth = 0
    while isinstance(node, yaml.MappingNode) and depth < len(keypath):
        child = next((value for key, value in node.value if key.value == keypath[depth]), None)
        if child is None or (isinstance(child, yaml.ScalarNode) and child.value in ("", "~", "null")):
            break
        node, depth = child, depth + 1
    if node is None:  # an empty file
        return text + _block(keypath, new_list, 0)
    if not isinstance(node, yaml.MappingNode) and depth < len(keypath):
        return _replace(text, node, json.dumps(_nested(keypath[depth:], new_list)))
    if depth == len(keypath):  # the list exists
        if getattr(node, "flow_style", False) or not isinstance(node, yaml.SequenceNode) or not node.value:
            return _replace(text, node, json.dumps(new_list))
        last = node.value[-1]
        indent = " " * node.value[0].start_mark.column
        end = _line_end(text, last.end_mark.index)
        return text[:end] + f"\n{indent[:-2]}- {_scalar(entry)}" + text[end:]
    # The mapping at keypath[:depth] exists; what is below it does not.
    if getattr(node, "flow_style", False):
        value = yaml.safe_load(text[node.start_mark.index:node.end_mark.index]) or {}
        inner = value
        for part in keypath[depth:-1]:
            inner = inner.setdefault(part, {})
        inner[keypath[-1]] = new_list
        return _replace(text, node, json.dumps(value))
    assert isinstance(node, yaml.MappingNode)
    # A key set to nothing (`allow:`): replace that empty value.
    empty = next((value for key, value in node.value if depth < len(keypath) and key.value == keypath[depth]), None)
    if empty is not None:
        return _replace(text, empty, " " + json.dumps(_nested(keypath[depth + 1:], new_list)))
    if not node.value:
        return _replace(text, node, json.dumps(_nested(keypath[depth:], new_list)))
    column = node.value[0][0].start_mark.column
    end = _block_end(text, node)
    return text[:end] + "\n" + _block(keypath[depth:], new_list, column).rstrip("\n") + text[end:]


def _nested(keys: tuple[str, ...], value: Any) -> Any:
    for key in reversed(keys):
        value = {key: value}
    return value


def _block(keys: tuple[str, ...], items: list[str], column: int) -> str:
    lines = []
    for depth, key in enumerate(keys):
        lines.append(" " * (column + 2 * depth) + f"{key}:")
    lines += [" " * (column + 2 * len(keys)) + f"- {_scalar(item)}" for item in items]
    return "\n".join(lines) + "\n"


def _scalar(value: str) -> str:
    return json.dumps(value)


def _replace(text: str, node: yaml.Node, replacement: str) -> str:
    return text[:node.start_mark.index] + replacement + text[node.end_mark.index:]


def _line_end(text: str, index: int) -> int:
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _block_end(text: str, node: yaml.MappingNode) -> int:
    """The end of the last line holding a value of the block mapping (before any trailing comments)."""
    last_key, last_value = node.value[-1]
    index = max(last_value.end_mark.index, last_key.end_mark.index)
    # A block value's end mark sits at the start of the next line: step back over the newline.
    while index > 0 and text[index - 1] in "\n":
        index -= 1
    return _line_end(text, index)

