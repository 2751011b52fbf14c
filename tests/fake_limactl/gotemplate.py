"""A tiny subset of Go's text/template: {{.Field}}, {{.Param.K}}, {{"lit"}}, {{json .X}}, trim
markers; a missing map key renders as <no value>, a missing struct field is an error."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from logrus import TemplateError


class GoMap(dict):
    """A Go map: a missing key renders as <no value> (a struct's missing field is an error)."""


class _NoValue:
    pass


NO_VALUE = _NoValue()


def go_print(v: Any) -> str:
    if v is NO_VALUE:
        return "<no value>"
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, GoMap):
        return "map[" + " ".join(f"{k}:{go_print(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, dict):
        return "{" + " ".join(go_print(x) for x in v.values()) + "}"
    if isinstance(v, list):
        return "[" + " ".join(go_print(x) for x in v) + "]"
    return str(v)


def _template_operand(tok: str, data: Any) -> Any:
    if tok == ".":
        return data
    if tok.startswith('"'):
        try:
            return json.loads(tok)
        except ValueError:
            raise TemplateError(f"malformed string {tok}")
    if len(tok) >= 2 and tok[0] == tok[-1] == "`":
        return tok[1:-1]
    if tok.startswith(".") and re.fullmatch(r"(\.[A-Za-z_][A-Za-z0-9_]*)+", tok):
        cur = data
        for part in tok[1:].split("."):
            if isinstance(cur, GoMap):
                cur = cur.get(part, NO_VALUE)
            elif isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                raise TemplateError(f"can't evaluate field {part}")
        return cur
    raise TemplateError(f"unsupported template operand {tok}")


def render_template(text: str, data: Any, funcs: dict[str, Callable[[Any], str]] | None = None) -> str:
    out: list[str] = []
    pos = 0
    while True:
        i = text.find("{{", pos)
        if i < 0:
            out.append(text[pos:])
            return "".join(out)
        j = text.find("}}", i + 2)
        if j < 0:
            raise TemplateError("unclosed action")
        literal, inner = text[pos:i], text[i + 2:j]
        if inner.startswith("- "):
            literal, inner = literal.rstrip(" \t\r\n"), inner[2:]
        trim_right = inner.endswith(" -")
        if trim_right:
            inner = inner[:-2]
        out.append(literal)
        out.append(_template_action(inner.strip(), data, funcs or {}, i))
        pos = j + 2
        if trim_right:
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1


def _template_action(expr: str, data: Any, funcs: dict[str, Callable[[Any], str]], offset: int) -> str:
    if expr.startswith("/*") and expr.endswith("*/"):
        return ""
    tokens = expr.split()
    try:
        if len(tokens) == 1:
            return go_print(_template_operand(tokens[0], data))
        if len(tokens) == 2 and tokens[0] in funcs:
            return funcs[tokens[0]](_template_operand(tokens[1], data))
    except TemplateError as e:
        raise TemplateError(f"template: format:1:{offset + 2}: executing \"format\" at <{tokens[-1]}>: {e}"
                            + (" in type store.FormatData" if "can't evaluate" in str(e) else ""))
    raise TemplateError(f"fake limactl: unsupported template action {{{{{expr}}}}}")
