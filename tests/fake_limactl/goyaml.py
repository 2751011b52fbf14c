"""YAML as Lima decodes it with goccy/go-yaml: YAML 1.2-like scalars, duplicate keys refused,
the source text of numbers kept (a string field gets `0644`, not `420`). PyYAML is imported on
first use only: most calls never parse YAML."""

from __future__ import annotations

import re
from typing import Any

from logrus import LoadError


class SrcInt(int):
    src: str


class SrcFloat(float):
    src: str


_LOADER: Any = None


def _yaml_loader() -> Any:
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    # libyaml's parser when PyYAML has it (a tenth of the time); the constructor and resolvers are Python either way.
    class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        m = seen[key]
                        raise yaml.constructor.ConstructorError(
                            None, None, f'mapping key "{key}" already defined at [{m.line + 1}:{m.column + 1}]',
                            key_node.start_mark)
                    seen[key] = key_node.start_mark
                except TypeError:
                    pass
            return super().construct_mapping(node, deep)

    dropped = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
               "tag:yaml.org,2002:timestamp"}
    Loader.yaml_implicit_resolvers = {
        k: [(t, r) for t, r in v if t not in dropped] for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                 re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:int",
                                 re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+.0123456789"))

    def construct_int(loader: Any, node: Any) -> SrcInt:
        s = loader.construct_scalar(node)
        v = int(s[2:], 8) if s.startswith("0o") else int(s, 16) if s.startswith("0x") else int(s)
        r = SrcInt(v)
        r.src = s
        return r

    def construct_float(loader: Any, node: Any) -> SrcFloat:
        s = loader.construct_scalar(node)
        r = SrcFloat(float(s.replace(".inf", "inf").replace(".Inf", "inf").replace(".INF", "inf")
                           .replace(".nan", "nan").replace(".NaN", "nan").replace(".NAN", "nan")))
        r.src = s
        return r

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_constructor("tag:yaml.org,2002:float", construct_float)
    _LOADER = Loader
    return Loader


def parse_yaml(data: bytes, comment: str) -> dict[str, Any]:
    import yaml
    try:
        doc = yaml.load(data, Loader=_yaml_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"[{mark.line + 1}:{mark.column + 1}] " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise LoadError(f"failed to unmarshal YAML ({comment}): {where}{problem}")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise LoadError(f"failed to unmarshal YAML ({comment}): [1:1] cannot unmarshal "
                        f"{type(doc).__name__} into Go value of type limatype.LimaYAML")
    return doc


def to_plain(v: Any) -> Any:
    """Strip the SrcInt/SrcFloat wrappers (for yaml/json output)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, dict):
        return {str(k): to_plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_plain(x) for x in v]
    return v


def go_str(v: Any) -> str:
    """How goccy/go-yaml decodes a scalar into a Go string field."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (SrcInt, SrcFloat)):
        return v.src
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    raise LoadError(f"cannot unmarshal {type(v).__name__} into Go value of type string")


_DUMPER: Any = None


def dump_yaml(doc: Any) -> bytes:
    """YAML text for an edited lima.yaml: keys in their order, lists not indented under their key
    (yamlfmt's indentless_arrays, as Lima formats yq's output), multi-line strings as `|` blocks,
    numbers as they were written, and every string that `parse_yaml` would read as something else
    quoted, so that parsing the text gives back DOC."""
    global _DUMPER
    import yaml
    if _DUMPER is None:
        class Dumper(yaml.SafeDumper):
            def ignore_aliases(self, data: Any) -> bool:
                return True

        def represent_str(dumper: Any, data: str) -> Any:
            style = "|" if "\n" in data and not any(c in data for c in "\r\t") else None
            return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

        Dumper.add_representer(str, represent_str)
        Dumper.add_representer(SrcInt, lambda d, v: d.represent_scalar("tag:yaml.org,2002:int", v.src))
        Dumper.add_representer(SrcFloat, lambda d, v: d.represent_scalar("tag:yaml.org,2002:float", v.src))
        loader = _yaml_loader()
        for tag, rx, first in (
                ("tag:yaml.org,2002:bool", loader.yaml_implicit_resolvers.get("t", []), "tTfF"),
                ("tag:yaml.org,2002:int", loader.yaml_implicit_resolvers.get("0", []), "-+0123456789"),
                ("tag:yaml.org,2002:float", loader.yaml_implicit_resolvers.get(".", []), "-+.0123456789")):
            for t, r in rx:
                if t == tag:
                    Dumper.add_implicit_resolver(tag, r, list(first))
        _DUMPER = Dumper
    text = yaml.dump(doc, Dumper=_DUMPER, sort_keys=False, default_flow_style=False, allow_unicode=True,
                     width=1 << 30)
    return text.encode("utf-8")
