r"""The part of yq (mikefarah/yq v4, which Lima embeds for `--set` and the other edit flags) that the
double evaluates. Anything outside it is refused with "not implemented by the test double", never
ignored or guessed.

The subset:
  EXPR    := UPDATE ( "|" UPDATE )*           each update works on the whole document, in order
  UPDATE  := PATH ( "=" | "+=" ) VALUE
  PATH    := "." | ( "." NAME | "." '"KEY"' | '["KEY"]' | "[N]" | "[]" )+
             NAME is [A-Za-z_][A-Za-z0-9_-]*; "[]" (every element) only on the left; N >= 0 must exist
  VALUE   := TERM ( "+" TERM )*
  TERM    := LITERAL | PATH (read from the document)
  LITERAL := STRING | NUMBER | true | false | null | "[" LITERAL,... "]" | "{" STRING ":" LITERAL,... "}"
             (so JSON is accepted; true/false/null in any case, `~` is null)

Strings are read as yq v4.53 (Lima v2.2's) reads them, not as JSON: the lexer's `"..."` token,
then processEscapeCharacters (pkg/yqlib/lib.go: \\ is \ except before "(", \" \n \t \r \f \v \b \a;
any other backslash stays, so \u00e9 and \/ are kept as written), then string interpolation
(pkg/yqlib/operator_strings.go: \\ is \ once more; "\(" would evaluate an expression: refused).
Numbers keep the text they were written with (yq prints it back as written).

yq's rules kept: a missing map key on the left is created (parents as maps); `.a[]` over a missing
or null value matches nothing; `+` of null and X is X, of two lists their concatenation, of two
strings or two numbers the usual; `A += B` is `A = A + B`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from goyaml import SrcFloat, SrcInt
from logrus import Fatal, bq

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# pkg/yqlib/lexer_participle.go: QuotedStringValue, HexValue, FloatValueScientific, FloatValue, NumberValue
_STRING_RE = re.compile(r'"([^"\\]*(\\.[^"\\]*)*)"')
_NUMBER_RES = (("hex", re.compile(r"0[xX][0-9A-Fa-f]+")), ("float", re.compile(r"-?[1-9](\.\d+)?[Ee][-+]?\d+")),
               ("float", re.compile(r"-?\d+(\.\d+)")), ("int", re.compile(r"-?\d+")))
_WORDS = ((re.compile(r"[Tt][Rr][Uu][Ee]"), True), (re.compile(r"[Ff][Aa][Ll][Ss][Ee]"), False),
          (re.compile(r"[Nn][Uu][Ll][Ll]|~"), None))
_ESCAPES = {'"': '"', "n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "b": "\b", "a": "\a"}


def yq_string(body: str) -> str:
    """The value of a yq string literal whose text between the quotes is BODY."""
    out: list[str] = []
    i = 0
    while i < len(body):  # processEscapeCharacters
        c = body[i]
        if c == "\\" and i < len(body) - 1:
            nxt = body[i + 1]
            if nxt == "\\":
                if i + 2 < len(body) and body[i + 2] == "(":
                    out.append("\\\\")
                else:
                    out.append("\\")
                i += 2
                continue
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
        out.append(c)
        i += 1
    text = "".join(out)
    result: list[str] = []
    i = 0
    while i < len(text):  # interpolate, without expressions
        c = text[i]
        if c == "\\" and i < len(text) - 1:
            if text[i + 1] == "(":
                raise Unsupported("string interpolation `\\(...)`")
            if text[i + 1] == "\\":
                i += 1
        result.append(c)
        i += 1
    return "".join(result)


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

    def string(self) -> str:
        m = _STRING_RE.match(self.s, self.i)
        if not m:
            raise Unsupported(f"an unterminated string at offset {self.i}")
        self.i = m.end()
        return yq_string(m[1])

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
                    parts.append(self.string())
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
                    parts.append(self.string())
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
        return "value", self.literal()

    def literal(self) -> Any:
        self.ws()
        start = self.i
        if self.s.startswith('"', self.i):
            return self.string()
        if self.eat("["):
            items: list[Any] = []
            if self.eat("]"):
                return items
            while True:
                items.append(self.literal())
                if self.eat("]"):
                    return items
                if not self.eat(","):
                    raise Unsupported(f"expected `,` or `]` at offset {self.i}")
        if self.eat("{"):
            obj: dict[str, Any] = {}
            if self.eat("}"):
                return obj
            while True:
                self.ws()
                if not self.s.startswith('"', self.i):
                    raise Unsupported(f"an object key that is not a quoted string at offset {self.i}")
                key = self.string()
                if not self.eat(":"):
                    raise Unsupported(f"expected `:` at offset {self.i}")
                obj[key] = self.literal()
                if self.eat("}"):
                    return obj
                if not self.eat(","):
                    raise Unsupported(f"expected `,` or `}}` at offset {self.i}")
        for kind, rx in _NUMBER_RES:
            m = rx.match(self.s, self.i)
            if m and not _NAME_RE.match(self.s, m.end()):
                self.i = m.end()
                value: SrcInt | SrcFloat
                if kind == "float":
                    value = SrcFloat(float(m[0]))
                else:
                    value = SrcInt(int(m[0][2:], 16) if kind == "hex" else int(m[0]))
                value.src = m[0]
                return value
        for rx, word in _WORDS:
            m = rx.match(self.s, self.i)
            if m and not _NAME_RE.match(self.s, m.end()):
                self.i = m.end()
                return word
        raise Unsupported(f"a value that is neither a literal nor a path at offset {start}")

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
