"""Bounded, position-keeping YAML reading. The only module that parses agentbox's YAML config."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox.errors import ConfigError
from agentbox.fsutil import file_kind

if TYPE_CHECKING:
    import yaml

MAX_CONFIG_BYTES = 1_000_000


class ConfigText(NamedTuple):
    """One read of a config file: its text, the digest of exactly those bytes, and the stat of what was read."""

    text: str
    sha256: str
    st: os.stat_result


def read_config(path: Path) -> ConfigText:
    """Read a config file that must be a regular UTF-8 file of at most 1 MB, in one open.

    Directories, FIFOs and devices are refused from stat before anything is opened, so reading never
    blocks; what is read is checked again on the open descriptor, so a file swapped in between is
    refused rather than read. The digest is of the very bytes that are parsed.
    """
    try:
        before = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from exc
    _require_regular(path, before)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise ConfigError(
                f"{path}: the file was replaced while agentbox was reading it", hint="Run the command again."
            )
        _require_regular(path, st)
        try:
            data = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the config file: {exc.strerror}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: the file is larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: the file is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint="Save the file as UTF-8.",
        ) from exc
    return ConfigText(text, hashlib.sha256(data).hexdigest(), st)


def read_config_text(path: Path) -> str:
    return read_config(path).text


def _require_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"{path}: is {file_kind(st.st_mode)}, not a regular file",
            hint="agentbox reads its config from a regular YAML file; rename or remove this one.",
        )
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{path}: the file is {st.st_size:,} bytes; a config may be at most {MAX_CONFIG_BYTES:,} bytes",
        )


def compose(text: str, path: Path) -> yaml.Node | None:
    """Parse text into a node tree that keeps line and column of every value."""
    # deferred: start-up (yaml, ~22 ms: the warm launch reads the cached config, never YAML)
    import yaml

    try:
        return yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        tab = _indenting_tab(text, mark.line) if mark else None
        if mark and tab is not None:
            raise ConfigError(
                f"{path}:{mark.line + 1}:{tab + 1}: a tab in the indentation: YAML allows no tabs there",
                hint="Replace the tab with spaces (YAML indents with spaces only), then run the command again.",
            ) from exc
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: YAML syntax error: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: the YAML is nested too deeply") from exc


def _indenting_tab(text: str, line: int) -> int | None:
    """The column (from 0) of the first tab in the leading whitespace of that line, if it has one."""
    lines = text.splitlines()
    if line >= len(lines):
        return None
    content = lines[line]
    indent = content[:len(content) - len(content.lstrip(" \t"))]
    return indent.index("\t") if "\t" in indent else None


def construct_scalar(node: yaml.Node) -> Any:
    """The Python value of one scalar node, as YAML's safe loader resolves it."""
    return _constructor().construct_object(node)


def flatten_merge_keys(node: yaml.MappingNode) -> None:
    """Apply YAML merge keys (`<<: *base`) in place, as the safe loader would."""
    _constructor().flatten_mapping(node)


_CONSTRUCTOR: Any = None


def _constructor() -> Any:
    global _CONSTRUCTOR
    if _CONSTRUCTOR is None:
        # deferred: start-up (yaml, ~22 ms: the warm launch reads the cached config, never YAML)
        import yaml

        _CONSTRUCTOR = yaml.constructor.SafeConstructor()
    return _CONSTRUCTOR
