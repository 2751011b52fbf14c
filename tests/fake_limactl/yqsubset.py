"""The part of yq (mikefarah/yq v4, which Lima embeds for `--set` and the other edit flags) that the
double evaluates. Anything outside it is refused with "not implemented by the test double", never
ignored or guessed.

The subset:
  EXPR    := UPDATE ( "|" UPDATE )*           each update works on the whole document, in order
  UPDATE  := PATH ( "=" | "+=" ) VALUE
  PATH    := "." | ( "." NAME | "." '"KEY"' | '["KEY"]' | "[N]" | "[]" )+
             NAME is [A-Za-z_][A-Za-z0-9_-]*; "[]" (every element) only on the left; N >= 0 must exist
  VALUE   := TERM ( "+" TERM )*
  TERM    := a JSON value (string, number, true, false, null, [...], {...}) | PATH (read from the document)

yq's rules kept: a missing map key on the left is created (parents as maps); `.a[]` over a missing
or null value matches nothing; `+` of null and X is X, of two lists their concatenation, of two
strings or two numbers the usual; `A += B` is `A = A + B`.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from logrus import Fatal, bq

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_JSON = json.JSONDecoder()
_MISSING = object()


class Unsupported(Exception):
    pass


def refuse(expr: str, why: str) -> Fatal:
    return Fatal(f"fake limactl: yq expression {bq(expr)} is not implemented by the test double ({why})")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t\n\r":
            self.i += 1

    def peek(self, tok: str) -> bool:
        self.ws()
        return self.s.startswith(tok, self.i)

    def eat(self, tok: str) -> bool:
        if self.peek(tok):
            self.i += len(tok)
            return True
        return False

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def json_string(self) -> str:
        try:
            value, end = _JSON.raw_decode(self.s, self.i)
        except json.JSONDecodeError as e:
            raise Unsupported(f"a string that is not JSON at offset {self.i}: {e.msg}")
        if not isinstance(value, str):
            raise Unsupported(f"a key that is not a string at offset {self.i}")
        self.i = end
        return value

    def path(self) -> list[Any]:
        """A list of str (map key), int (index) and None (every element)."""
        self.ws()
        if not self.s.startswith(".", self.i):
            raise Unsupported(f"expected a path starting with `.` at offset {self.i}")
        self.i += 1
        parts: list[Any] = []
        first = True
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "[":
                self.i += 1
                self.ws()
                if self.s.startswith("]", self.i):
                    parts.append(None)
                elif self.s.startswith('"', self.i):
                    parts.append(self.json_string())
                else:
                    m = re.compile(r"[0-9]+").match(self.s, self.i)
                    if not m:
                        raise Unsupported(f"an index that is not a non-negative integer or a quoted key at offset "
                                          f"{self.i}")
                    parts.append(int(m[0]))
                    self.i = m.end()
                self.ws()
                if not self.s.startswith("]", self.i):
                    raise Unsupported(f"expected `]` at offset {self.i}")
                self.i += 1
            elif c == "." or first:
                if c == ".":
                    self.i += 1
                if self.s.startswith('"', self.i):
                    parts.append(self.json_string())
                else:
                    m = _NAME_RE.match(self.s, self.i)
                    if not m:
                        if first:
                            first = False
                            continue
                        raise Unsupported(f"expected a key after `.` at offset {self.i}")
                    parts.append(m[0])
                    self.i = m.end()
            else:
                break
            first = False
        return parts

    def term(self) -> tuple[str, Any]:
        self.ws()
        if self.s.startswith(".", self.i):
            return "path", self.path()
        try:
            value, end = _JSON.raw_decode(self.s, self.i)
        except json.JSONDecodeError:
            raise Unsupported(f"a value that is neither JSON nor a path at offset {self.i}")
        self.i = end
        return "value", value

    def value(self) -> list[tuple[str, Any]]:
        terms = [self.term()]
        while self.peek("+") and not self.peek("+="):
            self.i += 1
            terms.append(self.term())
        return terms


def _get(doc: Any, parts: list[Any]) -> Any:
    cur = doc
    for p in parts:
        if p is None:
            raise Unsupported("`[]` on the right-hand side")
        if isinstance(p, str):
            cur = cur.get(p) if isinstance(cur, dict) else None if cur is None else _bad_index(p, cur)
        else:
            cur = cur[p] if isinstance(cur, list) and p < len(cur) else None if cur is None or isinstance(
                cur, list) else _bad_index(p, cur)
    return cur


def _bad_index(p: Any, cur: Any) -> Any:
    raise Unsupported(f"indexing a {type(cur).__name__} with {p!r}")


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return copy.deepcopy(b)
    if b is None:
        return a
    if isinstance(a, list) and isinstance(b, list):
        return a + copy.deepcopy(b)
    if isinstance(a, str) and isinstance(b, str):
        return a + b
    if (isinstance(a, (int, float)) and not isinstance(a, bool)
            and isinstance(b, (int, float)) and not isinstance(b, bool)):
        return a + b
    raise Unsupported(f"`+` of a {type(a).__name__} and a {type(b).__name__}")


def _targets(doc: dict[str, Any], parts: list[Any]) -> list[tuple[Any, Any]]:
    """(container, key) pairs the left-hand path names, creating missing map keys as yq does."""
    if not parts:
        raise Unsupported("assigning to the whole document")
    found: list[tuple[Any, Any]] = []
    nodes: list[Any] = [doc]
    for depth, p in enumerate(parts):
        last = depth == len(parts) - 1
        nxt_nodes: list[Any] = []
        found = []
        for node in nodes:
            if p is None:
                if node is None:
                    continue
                if isinstance(node, list):
                    keys: list[Any] = list(range(len(node)))
                elif isinstance(node, dict):
                    keys = list(node)
                else:
                    raise Unsupported(f"`[]` over a {type(node).__name__}")
                for k in keys:
                    found.append((node, k))
                    nxt_nodes.append(node[k])
            elif isinstance(p, str):
                if not isinstance(node, dict):
                    raise Unsupported(f"the key {p!r} under a {type(node).__name__}")
                if not last and not isinstance(node.get(p), (dict, list)):
                    if node.get(p) is not None:
                        raise Unsupported(f"the key {parts[depth + 1]!r} under the scalar {p!r}")
                    if isinstance(parts[depth + 1], int):
                        raise Unsupported("an index into a list that does not exist")
                    if isinstance(parts[depth + 1], str):  # `.a[]` over a missing `.a` matches nothing
                        node[p] = {}
                found.append((node, p))
                nxt_nodes.append(node.get(p))
            else:
                if not isinstance(node, list) or p >= len(node):
                    raise Unsupported(f"index [{p}] outside an existing list")
                found.append((node, p))
                nxt_nodes.append(node[p])
        nodes = nxt_nodes
    return found


def evaluate(expr: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Apply EXPR to a copy of DOC; Fatal ("not implemented by the test double") outside the subset."""
    out = copy.deepcopy(doc)
    p = _Parser(expr)
    try:
        while True:
            lhs = p.path()
            if p.eat("+="):
                op = "+="
            elif p.eat("="):
                op = "="
            else:
                raise Unsupported(f"expected `=` or `+=` at offset {p.i}")
            terms = p.value()
            if not (p.at_end() or p.peek("|")):
                raise Unsupported(f"unexpected text at offset {p.i}")
            rhs: Any = None
            for n, (kind, v) in enumerate(terms):
                v = _get(out, v) if kind == "path" else v
                rhs = copy.deepcopy(v) if n == 0 else _add(rhs, v)
            for container, key in _targets(out, lhs):
                current = container[key] if isinstance(container, list) else container.get(key)
                container[key] = _add(current, rhs) if op == "+=" else copy.deepcopy(rhs)
            if p.at_end():
                return out
            p.eat("|")
    except Unsupported as e:
        raise refuse(expr, str(e))
