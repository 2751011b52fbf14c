"""Which untracked files git would ignore, decided without git: gitignore(5) as git 2.39 implements it.

Checkpoints walk the workspace themselves (host git must never open a path of a work tree the agent
can change), so they need git's answer to "is this untracked entry ignored?" without running git.
This module is that answer, and only that: no I/O. The caller reads .gitignore, info/exclude and
core.excludesFile through agentbox's no-follow reader and hands the bytes to `parse_capped`.

The rules follow git's dir.c and wildmatch.c rather than the manual's prose, quirks included:
- a line is split at LF (one CR before it dropped), a UTF-8 BOM is skipped, a NUL ends the line,
  `#` starts a comment only as the first byte, trailing spaces go unless backslash-escaped;
- a pattern with no slash but a trailing one is matched against the last path component; any other
  slash anchors it to the folder of its file, with the literal part before the first wildcard
  compared first and the rest matched on its own (so `a/b**/c` treats that `**` as a leading `**/`);
- with core.ignoreCase the name and the pattern's plain letters are folded to lower case (ASCII
  only), but letters inside `[...]` and after a backslash are not, exactly as in wildmatch;
- a folder that is excluded excludes everything below it, whatever a negation deeper down says.
Names are matched as bytes: a path that is not ASCII is taken as its file-system bytes.

Speed: a walk calls `is_ignored` for every untracked entry. Decisions are made per folder: the
patterns that can apply to names directly in a folder are gathered once into dicts (exact names,
`*.ext` suffixes, `prefix*`), and only the rest run a regular expression, so a call is a few dict
lookups. Patterns with many stars run on a small automaton instead of `re`, whose backtracking
could be made exponential by a hostile .gitignore.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Sequence

_UTF8_BOM = b"\xef\xbb\xbf"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_GLOB_SPECIAL = frozenset("*?[\\")
# a class with more members than this is matched by a regular expression rather than expanded into names
_EXPAND_LIMIT = 64
# patterns with more unbounded wildcards than this avoid `re` (backtracking grows with their number)
_REGEX_STARS = 2

# tokens of a compiled pattern
_LIT, _ONE, _SET, _STAR, _ANY_END, _ANY_SLASH, _ANY, _NEVER = range(8)
_GLOBSTARS = (_ANY_END, _ANY_SLASH, _ANY)
Token = tuple  # (kind,) or (kind, value)


def _byte_text(text: str) -> str:
    """text as one character per byte of its file-system encoding (what git compares)."""
    return text if text.isascii() else os.fsencode(text).decode("latin-1")


def _fold(text: str) -> str:
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


# -- parsing ---------------------------------------------------------------------------------------


class _Line:
    """One pattern line of a file, parsed as git's parse_path_pattern does."""

    __slots__ = ("body", "lineno", "mustbedir", "negative", "nodir", "prefix", "text")

    def __init__(self, lineno: int, text: str) -> None:
        self.lineno = lineno
        self.text = text
        body = text
        self.negative = body.startswith("!")
        if self.negative:
            body = body[1:]
        simple = next((i for i, c in enumerate(body) if c in _GLOB_SPECIAL), len(body))
        self.mustbedir = body.endswith("/")
        if self.mustbedir:
            body = body[:-1]
        self.body = body
        self.nodir = "/" not in body
        self.prefix = min(simple, len(body))


def _trim_trailing_spaces(line: str) -> str:
    last_space = -1
    i = 0
    while i < len(line):
        c = line[i]
        if c == " ":
            if last_space < 0:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= len(line):
                return line
            last_space = -1
        else:
            last_space = -1
        i += 1
    return line[:last_space] if last_space >= 0 else line


def _parse_lines(data: bytes) -> tuple[_Line, ...]:
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    lines = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw or raw.startswith(b"#"):
            continue
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        raw = raw.split(b"\0", 1)[0]
        text = _trim_trailing_spaces(raw.decode("latin-1"))
        line = _Line(lineno, text)
        if line.body:  # an empty pattern ("", "/", "!") matches nothing
            lines.append(line)
    return tuple(lines)


class Rules:
    """The patterns of one file (a .gitignore, info/exclude or core.excludesFile), parsed once."""

    __slots__ = ("_compiled", "base", "lines", "problem", "source")

    def __init__(self, base: str, source: str, lines: tuple[_Line, ...] = (), problem: str | None = None) -> None:
        self.base = base.strip("/")
        self.source = source
        self.lines = lines
        self.problem = problem  # set when the file was not used (too large): the caller may say so
        self._compiled: dict[bool, tuple[_Compiled, ...]] = {}

    @classmethod
    def parse(cls, text: bytes, base: str, source: str) -> Rules:
        """text: the file's bytes; base: its folder relative to the work tree's top ("" for the top)."""
        return cls(base, source, _parse_lines(text))

    def patterns(self) -> list[tuple[int, str]]:
        """(line number, pattern as written) of every pattern, in file order."""
        return [(line.lineno, _latin1_to_text(line.text)) for line in self.lines]

    def compiled(self, fold: bool) -> tuple[_Compiled, ...]:
        done = self._compiled.get(fold)
        if done is None:
            done = tuple(_compile(line, index, fold) for index, line in enumerate(self.lines))
            self._compiled[fold] = done
        return done

    def __repr__(self) -> str:
        return f"Rules({self.source!r}, base={self.base!r}, {len(self.lines)} patterns)"


def parse_capped(data: bytes | None, base: str, source: str, limit: int = 1 << 20) -> Rules:
    """Rules from a file's bytes, or none when the file is missing (None) or larger than limit.

    git (2.40 and later) likewise ignores a pattern file that is too large, whole.
    """
    if data is None:
        return Rules(base, source)
    if len(data) > limit:
        problem = f"{source} is {len(data)} bytes, more than the {limit} agentbox reads: its patterns are not used"
        return Rules(base, source, problem=problem)
    return Rules.parse(data, base, source)


def _latin1_to_text(text: str) -> str:
    return os.fsdecode(text.encode("latin-1"))


# -- wildmatch -------------------------------------------------------------------------------------

_CLASSES: dict[str, Callable[[str], bool]] = {
    "alnum": lambda c: c.isascii() and c.isalnum(),
    "alpha": lambda c: c.isascii() and c.isalpha(),
    "blank": lambda c: c in " \t",
    "cntrl": lambda c: c < " " or c == "\x7f",
    "digit": lambda c: "0" <= c <= "9",
    "graph": lambda c: "!" <= c <= "~",
    "lower": lambda c: "a" <= c <= "z",
    "print": lambda c: " " <= c <= "~",
    "punct": lambda c: "!" <= c <= "~" and not c.isalnum(),
    "space": lambda c: c in "\t\n\r ",  # git's own isspace: not \v or \f
    "upper": lambda c: "A" <= c <= "Z",
    "xdigit": lambda c: c in "0123456789abcdefABCDEF",
}


def _parse_class(pat: str, i: int) -> tuple[list[tuple[str, ...]], bool, int] | None:
    """The bracket expression at pat[i] ("["): its members, whether negated, the index after "]".

    None when it is malformed (wildmatch then fails the whole match). Follows wildmatch.c's loop.
    """
    n = len(pat)

    def at(k: int) -> str:
        return pat[k] if k < n else ""

    j = i + 1
    p_ch = at(j)
    if p_ch == "^":
        p_ch = "!"
    negated = p_ch == "!"
    if negated:
        j += 1
        p_ch = at(j)
    prev_ch = ""
    members: list[tuple[str, ...]] = []
    while True:
        if not p_ch:
            return None
        if p_ch == "\\":
            j += 1
            p_ch = at(j)
            if not p_ch:
                return None
            members.append(("c", p_ch))
        elif p_ch == "-" and prev_ch and at(j + 1) and at(j + 1) != "]":
            j += 1
            p_ch = at(j)
            if p_ch == "\\":
                j += 1
                p_ch = at(j)
                if not p_ch:
                    return None
            members.append(("r", prev_ch, p_ch))
            p_ch = ""
        elif p_ch == "[" and at(j + 1) == ":":
            s = j + 2
            k = s
            while at(k) and at(k) != "]":
                k += 1
            if not at(k):
                return None
            if k - s - 1 < 0 or pat[k - 1] != ":":
                j = s - 2
                p_ch = "["
                members.append(("c", "["))
            else:
                name = pat[s : k - 1]
                if name not in _CLASSES:
                    return None
                members.append(("k", name))
                j = k
                p_ch = ""
        else:
            members.append(("c", p_ch))
        prev_ch = p_ch
        j += 1
        p_ch = at(j)
        if p_ch == "]":
            return members, negated, j + 1


_CLASS_CHARS = {name: frozenset(c for c in map(chr, range(128)) if test(c)) for name, test in _CLASSES.items()}
_BYTES = frozenset(map(chr, range(256)))
_UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _class_set(members: list[tuple[str, ...]], negated: bool, fold: bool) -> frozenset[str]:
    """The bytes (as latin-1 characters) a bracket expression matches; never "/" (git's WM_PATHNAME).

    With fold the text is already lower-cased: a range also takes the lower case of the capitals in it,
    [:upper:] means any letter, and capitals are left out (they can no longer occur). Members are
    deduplicated and the union stops once full, so a hostile class costs little.
    """
    chosen: set[str] = set()
    for member in set(members):
        kind = member[0]
        if kind == "c":
            chosen.add(member[1])
        elif kind == "r":
            span = [chr(code) for code in range(ord(member[1]), ord(member[2]) + 1)]
            chosen.update(span)
            if fold:
                chosen.update(c.lower() for c in span if c in _UPPER)
        elif member[1] == "upper" and fold:
            chosen.update(_CLASS_CHARS["lower"])
        else:
            chosen.update(_CLASS_CHARS[member[1]])
        if len(chosen) == len(_BYTES):
            break
    result = _BYTES - chosen if negated else frozenset(chosen)
    return result - {"/"} - (_UPPER if fold else frozenset())


def _tokens(pat: str, fold: bool, pathname: bool) -> list[Token]:
    """wildmatch's reading of pat, as tokens; pat starts a wildmatch call (for the `**` rules)."""
    out: list[Token] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "\\":
            if i + 1 >= n:
                return out + [(_NEVER,)]
            out.append((_LIT, pat[i + 1]))  # not folded: wildmatch compares the escaped byte as written
            i += 2
        elif c == "?":
            out.append((_ONE,))
            i += 1
        elif c == "[":
            parsed = _parse_class(pat, i)
            if parsed is None:
                return out + [(_NEVER,)]
            members, negated, i = parsed
            out.append((_SET, _class_set(members, negated, fold)))
        elif c == "*":
            j = i
            while j < n and pat[j] == "*":
                j += 1
            if pathname and j - i >= 2 and (i == 0 or pat[i - 1] == "/"):
                if j == n:
                    out.append((_ANY_END,))
                    i = j
                    continue
                if pat[j] == "/":
                    out.append((_ANY_SLASH,))
                    i = j + 1
                    continue
                if pat.startswith("\\/", j):
                    out.append((_ANY,))
                    i = j
                    continue
            out.append((_STAR,))
            i = j
        else:
            out.append((_LIT, c.lower() if fold and "A" <= c <= "Z" else c))
            i += 1
    return out


def _set_regex(chars: frozenset[str]) -> str:
    if not chars:
        return "(?!)"
    codes = sorted(map(ord, chars))
    parts = []
    start = prev = codes[0]
    for code in codes[1:] + [-1]:
        if code == prev + 1:
            prev = code
            continue
        parts.append(f"\\x{start:02x}" if start == prev else f"\\x{start:02x}-\\x{prev:02x}")
        start = prev = code
    return "[" + "".join(parts) + "]"


_REGEX_OF = {_ONE: "[^/]", _STAR: "[^/]*", _ANY_END: ".*", _ANY_SLASH: "(?:.*/)?", _ANY: ".*", _NEVER: "(?!)"}


def _regex(tokens: Sequence[Token]) -> str:
    parts = []
    for token in tokens:
        kind = token[0]
        if kind == _LIT:
            parts.append(re.escape(token[1]))
        elif kind == _SET:
            parts.append(_set_regex(token[1]))
        else:
            parts.append(_REGEX_OF[kind])
    return "".join(parts)


def _automaton(tokens: Sequence[Token]) -> Callable[[str], bool]:
    """A matcher that follows every way through the pattern at once: linear in the text per token."""
    def match(text: str) -> bool:
        n = len(text)
        here = {0}
        for token in tokens:
            kind = token[0]
            if kind == _LIT:
                here = {i + 1 for i in here if i < n and text[i] == token[1]}
            elif kind == _ONE:
                here = {i + 1 for i in here if i < n and text[i] != "/"}
            elif kind == _SET:
                here = {i + 1 for i in here if i < n and text[i] in token[1]}
            elif kind == _STAR:
                reached, covered = set(), -1
                for i in sorted(here):
                    if i <= covered:
                        continue
                    reached.add(i)
                    while i < n and text[i] != "/":
                        i += 1
                        reached.add(i)
                    covered = i
                here = reached
            elif kind == _ANY_END:
                return bool(here)
            elif kind == _ANY:
                here = set(range(min(here), n + 1))
            elif kind == _ANY_SLASH:
                first = min(here)
                here = here | {j + 1 for j in range(first, n) if text[j] == "/"}
            else:
                return False
            if not here:
                return False
        return n in here

    return match


def _matcher(tokens: Sequence[Token]) -> Callable[[str], bool]:
    if any(token[0] == _NEVER for token in tokens):
        return lambda text: False
    stars = sum(1 for token in tokens if token[0] in (_STAR, _ANY, _ANY_SLASH))
    if stars <= _REGEX_STARS:
        compiled = re.compile(_regex(tokens), re.DOTALL)
        return lambda text: compiled.fullmatch(text) is not None
    return _automaton(tokens)


# -- compiled patterns -----------------------------------------------------------------------------


class _Seg:
    """A matcher for one path component: names (exact), suffixes, prefixes, everything, or a function."""

    __slots__ = ("fn", "gate", "kind", "literals")

    def __init__(
        self, kind: str, literals: tuple[str, ...] = (), fn: Callable[[str], bool] | None = None, gate: str = ""
    ) -> None:
        self.kind = kind  # "exact" | "suffix" | "prefix" | "all" | "never" | "other"
        self.literals = literals
        self.fn = fn
        self.gate = gate  # for "other": the literal start every match has, tested before fn

    def match(self, name: str) -> bool:
        if self.kind == "exact":
            return name in self.literals
        if self.kind == "suffix":
            return name.endswith(self.literals)
        if self.kind == "prefix":
            return name.startswith(self.literals)
        if self.kind == "all":
            return True
        if self.kind == "never":
            return False
        assert self.fn is not None
        return self.fn(name)


_ALL = _Seg("all")


def _expand(tokens: Sequence[Token]) -> tuple[str, ...] | None:
    """Every string the literal-and-class tokens match, when there are few; None otherwise."""
    choices: list[Sequence[str]] = []
    count = 1
    for token in tokens:
        if token[0] == _LIT:
            choices.append((token[1],))
        elif token[0] == _SET:
            count *= len(token[1])
            if count > _EXPAND_LIMIT:
                return None
            choices.append(sorted(token[1]))
        else:
            return None
    return tuple("".join(parts) for parts in itertools.product(*choices))


def _segment(tokens: Sequence[Token]) -> _Seg:
    if any(token[0] == _NEVER for token in tokens):
        return _Seg("never")
    stars = [i for i, token in enumerate(tokens) if token[0] == _STAR]
    kind, body = "exact", tokens
    if stars == [0]:
        kind, body = "suffix", tokens[1:]
    elif stars == [len(tokens) - 1]:
        kind, body = "prefix", tokens[:-1]
    literals = None if len(stars) > 1 or (stars and kind == "exact") else _expand(body)
    if literals is None:
        return _Seg("other", fn=_matcher(tokens), gate=_literal_start(tokens))
    if kind != "exact" and "" in literals:
        return _ALL
    return _Seg(kind, literals)


def _literal_start(tokens: Sequence[Token]) -> str:
    return "".join(token[1] for token in itertools.takewhile(lambda token: token[0] == _LIT, tokens))


def _split(tokens: Sequence[Token]) -> list[list[Token]]:
    segments: list[list[Token]] = [[]]
    for token in tokens:
        if token == (_LIT, "/"):
            segments.append([])
        else:
            segments[-1].append(token)
    return segments


class _Compiled:
    """A pattern ready to match: for a name (kind "name"), per path component ("segments"), or with `**`."""

    __slots__ = ("full", "gate", "head", "index", "kind", "line", "seg", "segs")

    def __init__(self, line: _Line, index: int) -> None:
        self.line = line
        self.index = index
        self.kind = "name"
        self.seg: _Seg = _ALL
        self.segs: tuple[_Seg, ...] = ()
        self.head: tuple[_Seg, ...] = ()
        self.full: Callable[[str], bool] | None = None
        self.gate = ""


def _compile(line: _Line, index: int, fold: bool) -> _Compiled:
    out = _Compiled(line, index)
    if line.nodir:
        out.seg = _segment(_tokens(line.body, fold, pathname=False))
        return out
    body, prefix = line.body, line.prefix
    if body.startswith("/"):
        body, prefix = body[1:], prefix - 1
    literal = body[:prefix]
    tokens = [(_LIT, _fold(c) if fold else c) for c in literal] + _tokens(body[prefix:], fold, pathname=True)
    segments = _split(tokens)
    globbed = [i for i, seg in enumerate(segments) if any(token[0] in _GLOBSTARS for token in seg)]
    if not globbed:
        out.kind = "segments"
        out.segs = tuple(_segment(seg) for seg in segments)
        return out
    first = globbed[0]
    rest = segments[first]
    if len(segments) == 1 and len(rest) > 1 and rest[0] == (_ANY_SLASH,) and len(globbed) == 1:
        out.seg = _segment(rest[1:])  # "**/name" is "name" at any depth
        return out
    out.kind = "glob"
    out.head = tuple(_segment(seg) for seg in segments[:first])
    if len(globbed) == 1 and first == len(segments) - 1 and rest == [(_ANY_END,)]:
        out.full = None  # "dir/**": everything below
    else:
        out.full = _matcher(tokens)
        out.gate = _literal_start(tokens)
    return out


# -- decisions per folder --------------------------------------------------------------------------

_Full = tuple[Callable[[str], bool], int, str]  # a `**` pattern: its matcher, the offset of its folder, its gate
_NONE = -2  # no pattern matched; a match is rank * 2 + (1 if it excludes else 0), the highest wins


class _Plan:
    """What decides for the names directly in one folder (files, or folders when for_dir).

    Every entry that cannot beat a "match everything" pattern is dropped, so a lookup's default is that
    pattern's code. Names are screened with one endswith and one startswith (C loops over tuples) before
    any suffix, prefix or regular expression is tried.
    """

    __slots__ = (
        "all_code",
        "exact",
        "gated",
        "open",
        "prefixes",
        "start_gate",
        "suffix_gate",
        "suffixes",
    )

    def __init__(self, entries: Sequence[tuple[int, _Seg | _Full]]) -> None:
        all_code = max((code for code, what in entries if what is _ALL), default=_NONE)
        self.all_code = all_code
        exact: dict[str, int] = {}
        suffixes: dict[str, int] = {}
        prefixes: dict[str, int] = {}
        gated: list[tuple[int, str, Callable[[str], bool]]] = []
        open_: list[tuple[int, str, Callable[[str], bool], int]] = []
        for code, what in entries:
            if code < all_code:
                continue
            if not isinstance(what, _Seg):
                open_.append((code, what[2], what[0], what[1]))
                continue
            table = {"exact": exact, "suffix": suffixes, "prefix": prefixes}.get(what.kind)
            if table is not None:
                for literal in what.literals:
                    if table.get(literal, _NONE) < code:
                        table[literal] = code
            elif what.kind == "other":
                assert what.fn is not None
                if what.gate:
                    gated.append((code, what.gate, what.fn))
                else:
                    open_.append((code, "", what.fn, -1))
        self.exact = exact
        self.suffix_gate = tuple(suffixes)
        self.start_gate = tuple(prefixes) + tuple(gate for _, gate, _ in gated)
        # by last (first) character, highest code first: a name that passed the gate tries only a few
        self.suffixes = _buckets(suffixes, -1)
        self.prefixes = _buckets(prefixes, 0)
        self.gated = tuple(sorted(gated, key=lambda item: -item[0]))
        self.open = tuple(sorted(open_, key=lambda item: -item[0]))

    def decide(self, name: str, path: str) -> bool:
        best = self.exact.get(name, self.all_code)
        if name.endswith(self.suffix_gate):
            for suffix, code in self.suffixes[name[-1]]:
                if code <= best:
                    break
                if name.endswith(suffix):
                    best = code
                    break
        if name.startswith(self.start_gate):
            for prefix, code in self.prefixes.get(name[0], ()):
                if code <= best:
                    break
                if name.startswith(prefix):
                    best = code
                    break
            for code, gate, fn in self.gated:
                if code <= best:
                    break
                if name.startswith(gate) and fn(name):
                    best = code
                    break
        for code, gate, fn, offset in self.open:
            if code <= best:
                break
            text = name if offset < 0 else path[offset:]
            if text.startswith(gate) and fn(text):
                best = code
                break
        return best >= 0 and best & 1 == 1


def _buckets(literals: dict[str, int], at: int) -> dict[str, tuple[tuple[str, int], ...]]:
    grouped: dict[str, list[tuple[str, int]]] = {}
    for literal, code in literals.items():
        grouped.setdefault(literal[at], []).append((literal, code))
    return {key: tuple(sorted(items, key=lambda item: -item[1])) for key, items in grouped.items()}


class _Layer:
    """One file's compiled patterns where they apply: base folder and precedence."""

    __slots__ = ("base", "by_segments", "globs", "names", "offset", "rank", "under")

    def __init__(self, base: str, patterns: tuple[_Compiled, ...], rank: int) -> None:
        self.base = base
        self.under = base + "/" if base else ""
        self.offset = len(self.under)
        self.rank = rank
        self.names: list[tuple[_Compiled, int]] = []
        self.by_segments: dict[int, list[tuple[_Compiled, int]]] = {}
        self.globs: list[tuple[_Compiled, int]] = []
        for pattern in patterns:
            code = ((rank << 32) + pattern.index) * 2 + (0 if pattern.line.negative else 1)
            if pattern.kind == "name":
                self.names.append((pattern, code))
            elif pattern.kind == "segments":
                self.by_segments.setdefault(len(pattern.segs), []).append((pattern, code))
            else:
                self.globs.append((pattern, code))

    def applies_in(self, folder: str) -> bool:
        return not self.base or folder == self.base or folder.startswith(self.under)


_Pair = tuple[_Plan, _Plan]  # (for files, for folders)


class Matcher:
    """Decides, as git does, whether an untracked path is ignored.

    global_rules: info/exclude first, then core.excludesFile (their patterns are relative to the top);
    `with_dir` adds a folder's .gitignore. Deeper .gitignore files win over shallower ones, which win
    over info/exclude, which wins over core.excludesFile; within a file the last matching line wins.
    """

    def __init__(self, global_rules: Sequence[Rules] = (), ignore_case: bool = False) -> None:
        self._fold = ignore_case
        self._layers: tuple[_Layer, ...] = tuple(
            _Layer("", rules.compiled(ignore_case), rank)
            for rank, rules in enumerate(reversed(list(global_rules)))
        )
        self._global_count = len(self._layers)
        self._parent: Matcher | None = None
        self._newest: _Layer | None = None
        self._pairs: dict[str, _Pair] = {}
        self._files: dict[str, _Plan] = {}  # _pairs split by kind: one lookup on the hot path
        self._dirs: dict[str, _Plan] = {}
        self._name_plans: dict[tuple[int, ...], _Pair] = {}

    def with_dir(self, base: str, rules: Rules) -> Matcher:
        """A matcher that also applies rules, the .gitignore of folder base ("a/b"; "" for the top)."""
        base = _byte_text(base.strip("/"))
        if self._fold:
            base = _fold(base)
        depth = base.count("/") + 1 if base else 0
        layer = _Layer(base, rules.compiled(self._fold), self._global_count + 1 + depth)
        child = Matcher.__new__(Matcher)
        child._fold = self._fold
        child._layers = tuple(old for old in self._layers if old.rank != layer.rank) + (layer,)
        child._global_count = self._global_count
        child._parent = self
        child._newest = layer
        child._pairs = {}
        child._files = {}
        child._dirs = {}
        child._name_plans = {}
        return child

    def is_ignored(self, path: str, is_dir: bool) -> bool:
        """Whether git ignores path ("/"-separated, relative to the top), a folder when is_dir.

        True as well for anything below an ignored folder: git never looks inside one.
        """
        if not path.isascii():
            path = os.fsencode(path).decode("latin-1")
        if self._fold:
            path = _fold(path)
        folder, _, name = path.rpartition("/")
        plan = (self._dirs if is_dir else self._files).get(folder)
        if plan is None:
            plan = self._pair(folder)[is_dir]
        return plan.decide(name, path)

    def _pair(self, folder: str) -> _Pair:
        missing = [folder]
        while missing[-1]:
            up = missing[-1].rpartition("/")[0]
            if up in self._pairs:
                break
            missing.append(up)
        for each in reversed(missing):
            pair = self._compute(each)
            self._pairs[each] = pair
            self._files[each], self._dirs[each] = pair
        return self._pairs[folder]

    def _compute(self, folder: str) -> _Pair:
        newest = self._newest
        if newest is not None and not newest.applies_in(folder):
            assert self._parent is not None
            found = self._parent._pairs.get(folder)
            return self._parent._pair(folder) if found is None else found
        if folder:
            up, _, name = folder.rpartition("/")
            if self._pairs[up][1].decide(name, folder):  # an excluded folder's plan says so of everything
                return _EXCLUDED_PAIR
        return self._build(folder)

    def _build(self, folder: str) -> _Pair:
        layers = [layer for layer in self._layers if layer.applies_in(folder)]
        key = tuple(id(layer) for layer in layers)
        names = self._name_plans.get(key)
        if names is None:
            names = _plans([(code, pattern, pattern.seg) for layer in layers for pattern, code in layer.names])
            self._name_plans[key] = names
        extra: list[_Entry] = []
        for layer in layers:
            if not layer.by_segments and not layer.globs:
                continue
            relative = folder[layer.offset :] if folder != layer.base else ""
            parts = relative.split("/") if relative else []
            for pattern, code in layer.by_segments.get(len(parts) + 1, ()):
                if all(seg.match(part) for seg, part in zip(pattern.segs, parts, strict=False)):
                    extra.append((code, pattern, pattern.segs[-1]))
            for pattern, code in layer.globs:
                head = pattern.head
                if len(head) <= len(parts) and all(seg.match(part) for seg, part in zip(head, parts, strict=False)):
                    what = _ALL if pattern.full is None else (pattern.full, layer.offset, pattern.gate)
                    extra.append((code, pattern, what))
        if not extra:
            return names
        return _plans([(code, pattern, pattern.seg) for layer in layers for pattern, code in layer.names] + extra)


_Entry = tuple[int, _Compiled, "_Seg | _Full"]


def _plans(entries: Sequence[_Entry]) -> _Pair:
    files = _Plan([(code, what) for code, pattern, what in entries if not pattern.line.mustbedir])
    folders = _Plan([(code, what) for code, pattern, what in entries])
    return files, folders


_EXCLUDED = _Plan([(1, _ALL)])  # the plan of an excluded folder: everything in it is ignored
_EXCLUDED_PAIR = (_EXCLUDED, _EXCLUDED)
