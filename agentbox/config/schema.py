"""Validation of one config file against the key table in keys.py.

Validation works on YAML nodes so that every error can name file:line:column. It returns plain
Python data (lists normalized, strings checked) plus the position of each value.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agentbox import lazyre, sizes
from agentbox.config.keys import (
    AGENT_KEYS,
    CREDENTIAL_KEYS,
    DOCKER_ERA_AGENT_CREDENTIALS,
    MOUNT_KEYS,
    PUSH_SESSION,
    SCHEMA,
    TASK_HOST_KEYS,
    Key,
    retired_reason,
)
from agentbox.config.layers import Layer
from agentbox.config.naming import instance_name_problem
from agentbox.config.problems import Problems, StopsReading
from agentbox.config.yamlio import construct_scalar, flatten_merge_keys
from agentbox.errors import ConfigError
from agentbox.net.policy import check_host_pattern, check_port
from agentbox.paths import control_character_problem

ENV_NAME = lazyre.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
AGENT_NAME = lazyre.compile(r"^[a-z][a-z0-9-]*$")

# How many YAML nodes one file may expand to. Aliases share nodes, so a "billion laughs" file is
# small to compose but huge to walk; the budget stops the walk long before time or memory runs out.
MAX_NODES = 100_000


def validate(node: yaml.Node | None, path: Path, layer: str) -> Layer:
    walker = _Walker(path, layer)
    if node is None:
        return Layer(layer, path, {}, {})
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(
            f"{walker.where(node)}: the top level must be a mapping of keys (like `vm:` or `env:`), "
            f"found {_describe_node(node)}"
        )
    data = walker.mapping(node, SCHEMA, ())
    walker.problems.raise_any(str(path))
    return Layer(layer, path, data, walker.positions, walker.notices)


class _Walker:
    def __init__(self, path: Path, layer: str) -> None:
        self.path = path
        self.layer = layer
        self.positions: dict[tuple[str, ...], str] = {}
        self.notices: list[str] = []
        self.visited = 0
        self.problems = Problems()  # every error of the file, reported together at the end

    def where(self, node: yaml.Node) -> str:
        mark = node.start_mark
        return f"{self.path}:{mark.line + 1}:{mark.column + 1}"

    def fail(self, node: yaml.Node, keypath: tuple[str, ...], message: str, hint: str | None = None) -> ConfigError:
        name = ".".join(keypath) if keypath else "(top level)"
        return ConfigError(f"{self.where(node)}: {name}: {message}", hint=hint)

    def visit(self, node: yaml.Node, keypath: tuple[str, ...]) -> None:
        self.visited += 1
        if self.visited > MAX_NODES:
            raise StopsReading(
                f"{self.where(node)}: the config expands to more than {MAX_NODES:,} values "
                "(a YAML alias bomb?); refusing to read it"
            )
        self.positions.setdefault(keypath, self.where(node))

    def mapping_items(self, node: yaml.MappingNode, keypath: tuple[str, ...]) -> list[tuple[str, yaml.Node, yaml.Node]]:
        try:
            flatten_merge_keys(node)
        except yaml.YAMLError as exc:
            raise self.fail(node, keypath, f"invalid merge key: {exc}") from exc
        seen: dict[str, yaml.Node] = {}
        items: list[tuple[str, yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                self.problems.errors.append(self.fail(key_node, keypath, "keys must be plain names"))
                continue
            key = key_node.value  # as written: YAML 1.1 would read keys like `yes` or `on` as booleans
            if key in seen:
                self.problems.errors.append(self.fail(
                    key_node,
                    keypath + (key,),
                    f"the key appears twice (first at line {seen[key].start_mark.line + 1})",
                ))
                continue
            seen[key] = key_node
            items.append((key, key_node, value_node))
        return items

    def mapping(self, node: yaml.Node, keys: Mapping[str, Key], keypath: tuple[str, ...]) -> dict[str, Any]:
        self.visit(node, keypath)
        if _is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, keypath, f"expected a mapping, found {_describe_node(node)}")
        result: dict[str, Any] = {}
        for key, key_node, value_node in self.mapping_items(node, keypath):
            with self.problems.gathering():
                self.mapping_key(result, keys, keypath, key, key_node, value_node)
        return result

    def mapping_key(self, result: dict[str, Any], keys: Mapping[str, Key], keypath: tuple[str, ...], key: str,
                    key_node: yaml.Node, value_node: yaml.Node) -> None:
        """One key of a mapping, its value checked into result (or a notice, or an error raised)."""
        child_path = keypath + (key,)
        spec = keys.get(key)
        retired = retired_reason(child_path)
        if spec is None and retired:
            self.notices.append(f"{self.where(key_node)}: {'.'.join(child_path)} is ignored: {retired}")
            return
        if spec is None:
            raise self.fail(key_node, child_path, "unknown key", hint=_suggest(key, keys, keypath))
        if self.layer not in spec.files:
            # The previous agentbox silently ignored these here; keep accepting them, but say so.
            self.notices.append(
                f"{self.where(key_node)}: {'.'.join(child_path)} is ignored: it only has a meaning in a "
                "project's agentbox.yml"
            )
            return
        self.positions[child_path] = self.where(value_node)
        if _is_null(value_node) and spec.kind not in ("mapping", "agents", "env", "freeform"):
            return  # `key:` with no value means "not set", as in the previous agentbox
        result[key] = self.value(value_node, spec, child_path)

    def value(self, node: yaml.Node, spec: Key, keypath: tuple[str, ...]) -> Any:
        kind = spec.kind
        if kind == "mapping":
            return self.mapping(node, spec.children, keypath)
        if kind == "agents":
            return self.agents(node, keypath)
        if kind == "mounts":
            return self.mounts(node, keypath)
        if kind == "taskhosts":
            return self.task_hosts(node, keypath)
        if kind == "env":
            return self.env(node, keypath)
        if kind == "freeform":
            return self.freeform(node, keypath, top=True)
        if kind in ("credentials", "agent_credentials"):
            return self.credentials(node, keypath, per_agent=kind == "agent_credentials")
        if kind in ("strlist", "args", "hosts"):
            check = _check_host_pattern if kind == "hosts" else spec.check
            return self.string_list(node, keypath, split=kind == "args", check=check)
        if kind == "hostports":
            return self.host_ports(node, keypath)
        if kind == "pushmode":
            return self.push_mode(node, keypath)
        if kind == "image":
            return self.image(node, spec, keypath)
        self.visit(node, keypath)
        value = self.scalar(node, keypath)
        if kind == "word" and isinstance(value, bool):
            value = node.value  # `off` as written, not YAML 1.1's false
        if kind in ("str", "path", "vmname", "word"):
            if not isinstance(value, str):
                raise self.fail(node, keypath, f"expected a string, found {_describe_value(value)}")
            if kind in ("path", "vmname") and not value.strip():
                raise self.fail(node, keypath, "must not be empty")
            if kind == "path":
                self.check_path_text(node, keypath, value)
            if kind == "vmname":

                problem = instance_name_problem(value)
                if problem:
                    raise self.fail(
                        node, keypath, problem, hint="Pick a name of letters, digits and single . _ - between them."
                    )
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.fail(node, keypath, f"expected a whole number, found {_describe_value(value)}")
            if spec.minimum is not None and value < spec.minimum:
                raise self.fail(node, keypath, f"must be at least {spec.minimum}, found {value}")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.fail(node, keypath, f"expected true or false, found {_describe_value(value)}")
        elif kind == "cap" and value is False:
            return False
        elif kind in ("size", "bytes", "cap"):
            problem = sizes.size_problem(value) if kind == "size" else sizes.bytes_problem(value)
            if problem:
                example = '"8GiB" or "512MiB"' if kind == "size" else '"5MiB" or "512KiB"'
                hint = f"Write sizes as Lima does, for example {example}" + (
                    ", or false for no cap." if kind == "cap" else ".")
                raise self.fail(node, keypath, problem, hint=hint)
            value = str(value)  # a bare YAML number is bytes, as Lima reads it
        if spec.check is not None and isinstance(value, str):
            problem = spec.check(value)
            if problem:
                raise self.fail(node, keypath, problem)
        return value

    def scalar(self, node: yaml.Node, keypath: tuple[str, ...]) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, keypath, f"expected a single value, found {_describe_node(node)}")
        return construct_scalar(node)

    def push_mode(self, node: yaml.Node, keypath: tuple[str, ...]) -> bool | str:
        """git.allowPush: false, or `session` (pushes only to the VM's own branches). `true` is refused: pushes
        anywhere are sync.remoteWrite's, and a word that reads like a yes must not widen more than it says."""
        self.visit(node, keypath)
        value = self.scalar(node, keypath)
        if value is False:
            return False
        if value == PUSH_SESSION:
            return PUSH_SESSION
        hint = ("Write `allowPush: session` to let the agent push branches under agentbox/<vm>/ only, or "
                "`sync: {remoteWrite: true}` to allow every push.")
        if value is True:
            raise self.fail(node, keypath, f"{node.value} is refused: it would allow pushes anywhere, which is "
                            "sync.remoteWrite's to allow", hint=hint)
        raise self.fail(node, keypath, f"expected false or session, found {_describe_value(value)}", hint=hint)

    def host_ports(self, node: yaml.Node, keypath: tuple[str, ...]) -> bool | list[int]:
        """true, false, one port or a list of ports (network.allowHost)."""
        self.visit(node, keypath)
        hint = "Write true, false, or the ports as a list, e.g. `allowHost: [5432, 8080]`."
        items = [(node, keypath)] if isinstance(node, yaml.ScalarNode) else None
        if isinstance(node, yaml.ScalarNode):
            value = construct_scalar(node)
            if isinstance(value, bool):
                return value
        elif isinstance(node, yaml.SequenceNode):
            items = [(item, keypath + (f"[{index}]",)) for index, item in enumerate(node.value)]
        if items is None:
            raise self.fail(node, keypath, f"expected true, false or a list of ports, found {_describe_node(node)}",
                            hint=hint)
        ports = []
        for item, item_path in items:
            self.visit(item, item_path)
            value = self.scalar(item, item_path)
            problem = check_port(value)
            if problem:
                raise self.fail(item, item_path, problem, hint=hint)
            ports.append(value)
        return ports

    def string_list(self, node: yaml.Node, keypath: tuple[str, ...], split: bool,
                    check: Callable[[Any], str | None] | None = None) -> list[str]:
        self.visit(node, keypath)
        if isinstance(node, yaml.ScalarNode):
            value = construct_scalar(node)
            if not isinstance(value, str):
                raise self.fail(
                    node, keypath, f"expected a string or a list of strings, found {_describe_value(value)}"
                )
            if split:

                try:
                    return shlex.split(value)
                except ValueError as exc:
                    raise self.fail(node, keypath, f"cannot split into arguments: {exc}") from exc
            self.check_path_text(node, keypath, value)
            if check is not None and value.strip():
                self._check_item(node, keypath, value, check)
            return [value] if value.strip() else []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, keypath, f"expected a string or a list of strings, found {_describe_node(node)}")
        items = []
        for index, item in enumerate(node.value):
            item_path = keypath + (f"[{index}]",)
            self.visit(item, item_path)
            value = self.scalar(item, item_path)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and split:
                value = item.value  # `defaultArgs: [--max-turns, 5]`: the number is an argument
            if not isinstance(value, str):
                raise self.fail(item, item_path, f"expected a string, found {_describe_value(value)}")
            if not split:
                self.check_path_text(item, item_path, value)
            if check is not None:
                self._check_item(item, item_path, value, check)
            items.append(value)
        return items

    def _check_item(self, node: yaml.Node, keypath: tuple[str, ...], value: str,
                    check: Callable[[Any], str | None]) -> None:
        problem = check(value)
        if problem:
            raise self.fail(node, keypath, problem)

    def check_path_text(self, node: yaml.Node, keypath: tuple[str, ...], value: str) -> None:
        problem = control_character_problem(value)
        if problem:
            raise self.fail(node, keypath, problem)

    def env(self, node: yaml.Node, keypath: tuple[str, ...]) -> dict[str, str]:
        self.visit(node, keypath)
        if _is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, keypath, f"expected a mapping of NAME: value, found {_describe_node(node)}")
        result = {}
        for key, key_node, value_node in self.mapping_items(node, keypath):
            with self.problems.gathering():
                result[key] = self.env_value(keypath + (key,), key, key_node, value_node)
        return result

    def env_value(self, item_path: tuple[str, ...], key: str, key_node: yaml.Node, value_node: yaml.Node) -> str:
        self.visit(value_node, item_path)
        if not ENV_NAME.match(key):
            raise self.fail(
                key_node,
                item_path,
                "is not a valid environment variable name",
                hint="Use letters, digits and _, not starting with a digit.",
            )
        if not isinstance(value_node, yaml.ScalarNode) or _is_null(value_node):
            raise self.fail(value_node, item_path, f"expected a string value, found {_describe_node(value_node)}")
        # The text as written: `yes`, `0755` and `1.10` stay what the user typed, not YAML 1.1's reading.
        value: str = value_node.value
        if "\x00" in value:
            raise self.fail(value_node, item_path, "contains a NUL byte, which no environment can carry")
        return value

    def mounts(self, node: yaml.Node, keypath: tuple[str, ...]) -> list[dict[str, Any]]:
        self.visit(node, keypath)
        if _is_null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, keypath, f"expected a list of mounts, found {_describe_node(node)}")
        mounts = []
        for index, item in enumerate(node.value):
            item_path = keypath + (f"[{index}]",)
            if isinstance(item, yaml.ScalarNode) and isinstance(construct_scalar(item), str):
                self.visit(item, item_path)
                self.check_path_text(item, item_path, construct_scalar(item))
                mounts.append({"location": construct_scalar(item)})
                continue
            with self.problems.gathering():
                mount = self.mapping(item, MOUNT_KEYS, item_path)
                if "location" not in mount and item_path + ("location",) not in self.positions:
                    raise self.fail(item, item_path, "a mount needs `location` (the host folder)")
                mounts.append(mount)
        return mounts

    def image(self, node: yaml.Node, spec: Key, keypath: tuple[str, ...]) -> dict[str, Any]:
        """vm.image: a location, or a mapping of Lima's `images` fields; always returned as a mapping."""
        if isinstance(node, yaml.ScalarNode):
            location = self.value(node, spec.children["location"], keypath)
            self.check_path_text(node, keypath, location)
            return {"location": location}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(
                node, keypath, f"expected the image's location or a mapping, found {_describe_node(node)}",
                hint="One image, for the VM's arch: `image: https://mirror.example.com/disk.qcow2`, or "
                "`image: {location: ..., digest: sha256:..., kernel: {location: ..., cmdline: ...}, "
                "initrd: {location: ...}}`.",
            )
        value = self.mapping(node, spec.children, keypath)
        for part, where in ((value, keypath), (value.get("kernel"), keypath + ("kernel",)),
                            (value.get("initrd"), keypath + ("initrd",))):
            if isinstance(part, dict) and "location" in part:
                self.check_path_text(node, where + ("location",), part["location"])
            elif part is not None and where + ("location",) not in self.positions:
                raise self.fail(node, where, "needs `location`: an https:// URL or a host path")
        if "initrd" in value and "kernel" not in value:
            raise self.fail(node, keypath + ("initrd",), "an initrd is only used with a kernel",
                            hint="Add `kernel: {location: ...}` beside it, or remove `initrd`.")
        return value

    def task_hosts(self, node: yaml.Node, keypath: tuple[str, ...]) -> list[dict[str, Any]]:
        """tasks.hosts: a list of names, or of `{name, maxConcurrent}`; each name once."""
        self.visit(node, keypath)
        hint = "Write e.g. `hosts: [local, {name: server, maxConcurrent: 4}]` (add hosts with `agentbox hosts add`)."
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, keypath, f"expected a list of host names, found {_describe_node(node)}", hint=hint)
        hosts: list[dict[str, Any]] = []
        for index, item in enumerate(node.value):
            item_path = keypath + (f"[{index}]",)
            if isinstance(item, yaml.ScalarNode):
                self.visit(item, item_path)
                name = construct_scalar(item)
                if not isinstance(name, str):
                    raise self.fail(item, item_path, f"expected a host name, found {_describe_value(name)}", hint=hint)
                self._check_item(item, item_path, name, TASK_HOST_KEYS["name"].check)  # type: ignore[arg-type]
                entry: dict[str, Any] = {"name": name}
            else:
                entry = self.mapping(item, TASK_HOST_KEYS, item_path)
                if "name" not in entry:
                    raise self.fail(item, item_path, "a host needs `name`", hint=hint)
            if any(known["name"] == entry["name"] for known in hosts):
                raise self.fail(item, item_path, f"{entry['name']!r} is listed twice", hint=hint)
            hosts.append(entry)
        return hosts

    def agents(self, node: yaml.Node, keypath: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        self.visit(node, keypath)
        if _is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, keypath, f"expected a mapping of agent names, found {_describe_node(node)}")
        result = {}
        for name, key_node, value_node in self.mapping_items(node, keypath):
            if not AGENT_NAME.match(name):
                self.problems.errors.append(self.fail(
                    key_node,
                    keypath + (name,),
                    "is not a valid agent name",
                    hint="Agent names become commands: use lowercase letters, digits and -, starting with a letter.",
                ))
                continue
            self.positions[keypath + (name,)] = self.where(value_node)
            with self.problems.gathering():
                result[name] = self.mapping(value_node, AGENT_KEYS, keypath + (name,))
        return result

    def credentials(self, node: yaml.Node, keypath: tuple[str, ...], per_agent: bool) -> Any:
        """`false`/`true`, or a mapping; per agent also a list of host files (or the Docker-era {enabled, files})."""
        self.visit(node, keypath)
        if isinstance(node, yaml.ScalarNode):
            value = construct_scalar(node)
            if isinstance(value, bool):
                return value
            raise self.fail(
                node,
                keypath,
                f"expected true, false or {'a list of files' if per_agent else 'a mapping'}, "
                f"found {_describe_value(value)}",
            )
        if isinstance(node, yaml.SequenceNode):
            if not per_agent:
                raise self.fail(node, keypath, "expected true, false or a mapping of netrc/gh/git, found a list")
            return self.string_list(node, keypath, split=False)
        if per_agent:
            data = self.mapping(node, DOCKER_ERA_AGENT_CREDENTIALS, keypath)
            return data.get("files", []) if data.get("enabled", True) else False
        return self.mapping(node, CREDENTIAL_KEYS, keypath)

    def freeform(self, node: yaml.Node, keypath: tuple[str, ...], top: bool = False) -> Any:
        self.visit(node, keypath)
        if isinstance(node, yaml.MappingNode):
            return {key: self.freeform(value, keypath + (key,)) for key, _, value in self.mapping_items(node, keypath)}
        if isinstance(node, yaml.SequenceNode):
            if top:
                raise self.fail(node, keypath, "expected a mapping of Lima settings, found a list")
            return [self.freeform(item, keypath + (f"[{i}]",)) for i, item in enumerate(node.value)]
        value = construct_scalar(node)
        if top and value is not None:
            raise self.fail(node, keypath, f"expected a mapping of Lima settings, found {_describe_value(value)}")
        return {} if top else value


def _check_host_pattern(value: Any) -> str | None:
    return check_host_pattern(value)


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _describe_node(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _describe_value(construct_scalar(node))


def _describe_value(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int):
        return f"{value} (a number)"
    if isinstance(value, float):
        return f"{value} (a decimal number)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    return type(value).__name__


def _all_key_paths(keys: Mapping[str, Key], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, spec in keys.items():
        paths.append(prefix + (name,))
        paths.extend(_all_key_paths(spec.children, prefix + (name,)))
        if spec.kind == "agents":
            paths.extend(_all_key_paths(AGENT_KEYS, prefix + (name, "<agent>")))
        if spec.kind == "mounts":
            paths.extend(_all_key_paths(MOUNT_KEYS, prefix + (name, "[]")))
    return paths


def _suggest(key: str, siblings: Mapping[str, Key], keypath: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(key, list(siblings), n=1, cutoff=0.6)
    if not close:
        lowered = {name.lower(): name for name in siblings}
        if key.lower() in lowered:
            close = [lowered[key.lower()]]
    if close:
        return f"Did you mean `{'.'.join(keypath + (close[0],))}`?"
    elsewhere = [p for p in _all_key_paths(SCHEMA) if p[-1] == key and p[:-1] != keypath]
    if elsewhere:
        return f"`{key}` belongs under `{'.'.join(elsewhere[0][:-1])}`: write it as `{'.'.join(elsewhere[0])}`."
    return "Known keys here: " + ", ".join(sorted(siblings)) + "."
