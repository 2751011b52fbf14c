"""Whether a GraphQL request only reads: every operation of every document in it is a query.

The broker lets a GraphQL request to GitHub carry the host's token only when this says so. It reads the request
as the server does: a lexer after the GraphQL specification (section 2: the BOM, white space and commas ignored,
every line terminator — LF, CRLF and a lone CR — ending a comment, strings with their escapes and block strings),
then each definition at the document's top level: `{ ... }` (a query), `query ...`, or `fragment ...`. Anything
else (`mutation`, `subscription`, a type definition) or anything it cannot read is not a read. Outside strings only
printable ASCII, tab, CR, LF and the BOM are accepted, so no character a lenient server might take for a line end
gets by.

The request: a JSON object {"query": ..., "variables", "operationName", "extensions"} or a non-empty array of them
(a batch), keys unique at every level; a persisted query (no `query` text) is not something it can read.
"""

from __future__ import annotations

import json
from typing import Any

from agentbox import lazyre

_NAME = lazyre.compile(r"[_A-Za-z][_0-9A-Za-z]*")
_NUMBER = lazyre.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_PUNCTUATORS = set("!$&()|:=@[]{}")
_ESCAPED = set('"\\/bfnrt')
_HEX = lazyre.compile(r"[0-9A-Fa-f]{4}")
_HEX_BRACED = lazyre.compile(r"\{[0-9A-Fa-f]{1,6}\}")
_OPEN = {"(": ")", "[": "]", "{": "}"}
BOM = "\ufeff"


class Unreadable(Exception):
    """Not a GraphQL request the broker can read."""


def only_reads(body: bytes) -> bool:
    """Whether a JSON GraphQL request body (one document or a batch) holds nothing but queries."""
    try:
        data = json.loads(body.decode("utf-8"), object_pairs_hook=_unique)
        documents = data if isinstance(data, list) else [data]
        if not documents:
            return False
        for document in documents:
            if not isinstance(document, dict) or not isinstance(document.get("query"), str):
                return False
            if not document_only_queries(document["query"]):
                return False
    except (ValueError, RecursionError, Unreadable):  # UnicodeDecodeError, a BOM, JSON's own errors included
        return False
    return True


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Unreadable("a key twice in one JSON object")
    return dict(pairs)


def document_only_queries(source: str) -> bool:
    """Whether the document's every operation is a query (and there is at least one)."""
    tokens = tokenize(source)
    at = 0
    operations = 0
    while at < len(tokens):
        token = tokens[at]
        if token == "{":
            at = _skip_group(tokens, at)
            operations += 1
        elif token == "query":
            at += 1
            if at < len(tokens) and _NAME.fullmatch(tokens[at]) and tokens[at] not in _OPEN:
                at += 1
            if at < len(tokens) and tokens[at] == "(":
                at = _skip_group(tokens, at)
            at = _skip_directives(tokens, at)
            if at >= len(tokens) or tokens[at] != "{":
                raise Unreadable("a query without a selection set")
            at = _skip_group(tokens, at)
            operations += 1
        elif token == "fragment":
            if at + 4 > len(tokens) or not _is_name(tokens[at + 1]) or tokens[at + 2] != "on" \
                    or not _is_name(tokens[at + 3]):
                raise Unreadable("a malformed fragment")
            at = _skip_directives(tokens, at + 4)
            if at >= len(tokens) or tokens[at] != "{":
                raise Unreadable("a fragment without a selection set")
            at = _skip_group(tokens, at)
        else:
            return False  # mutation, subscription, a type system definition, or nonsense
    return operations > 0


def _is_name(token: str) -> bool:
    return _NAME.fullmatch(token) is not None


def _skip_directives(tokens: list[str], at: int) -> int:
    while at < len(tokens) and tokens[at] == "@":
        if at + 1 >= len(tokens) or not _is_name(tokens[at + 1]):
            raise Unreadable("a malformed directive")
        at += 2
        if at < len(tokens) and tokens[at] == "(":
            at = _skip_group(tokens, at)
    return at


def _skip_group(tokens: list[str], at: int) -> int:
    """The index after the bracket group opening at `at` (brackets balanced and matched)."""
    stack = [_OPEN[tokens[at]]]
    at += 1
    while at < len(tokens):
        token = tokens[at]
        if token in _OPEN:
            stack.append(_OPEN[token])
        elif token in (")", "]", "}"):
            if token != stack.pop():
                raise Unreadable("unbalanced brackets")
            if not stack:
                return at + 1
        at += 1
    raise Unreadable("unbalanced brackets")


def tokenize(source: str) -> list[str]:
    """The document's significant tokens (strings as `"`, numbers as `0`): names and punctuators as written."""
    tokens: list[str] = []
    at, end = 0, len(source)
    while at < end:
        char = source[at]
        if char in " \t\n\r," or char == BOM:
            at += 1
        elif char == "#":
            at += 1
            while at < end and source[at] not in "\n\r":
                _check_outside_string(source[at])
                at += 1
        elif char in _PUNCTUATORS:
            tokens.append(char)
            at += 1
        elif source.startswith("...", at):
            tokens.append("...")
            at += 3
        elif char == '"':
            at = _block_string(source, at) if source.startswith('"""', at) else _string(source, at)
            tokens.append('"')
        elif char == "-" or "0" <= char <= "9":
            match = _NUMBER.match(source, at)
            if match is None:
                raise Unreadable("a malformed number")
            at = match.end()
            if at < end and (source[at] == "." or source[at] == "_" or source[at].isalnum()):
                raise Unreadable("a number followed by a name or a dot")
            tokens.append("0")
        elif char == "_" or (char.isascii() and char.isalpha()):
            match = _NAME.match(source, at)
            assert match is not None
            tokens.append(match.group())
            at = match.end()
        else:
            raise Unreadable(f"the character {char!r}")
    return tokens


def _check_outside_string(char: str) -> None:
    if not (char == "\t" or " " <= char <= "~" or char == BOM):
        raise Unreadable(f"the character {char!r} outside a string")


def _string(source: str, at: int) -> int:
    at += 1
    end = len(source)
    while at < end:
        char = source[at]
        if char == '"':
            return at + 1
        if char in "\n\r":
            raise Unreadable("a line break in a string")
        if char == "\\":
            following = source[at + 1:at + 2]
            if following == "u":
                match = _HEX.match(source, at + 2) or _HEX_BRACED.match(source, at + 2)
                if match is None:
                    raise Unreadable("a malformed \\u escape")
                at = match.end()
                continue
            if following not in _ESCAPED or not following:
                raise Unreadable("an unknown escape in a string")
            at += 2
            continue
        if char < " " and char != "\t":
            raise Unreadable("a control character in a string")
        at += 1
    raise Unreadable("a string that does not end")


def _block_string(source: str, at: int) -> int:
    at += 3
    end = len(source)
    while at < end:
        if source.startswith('\\"""', at):
            at += 4
        elif source.startswith('"""', at):
            return at + 3
        else:
            char = source[at]
            if char < " " and char not in "\t\n\r":
                raise Unreadable("a control character in a block string")
            at += 1
    raise Unreadable("a block string that does not end")
