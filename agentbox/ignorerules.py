"""Which untracked files git ignores, decided in Python (no git runs on the work tree; see agentbox.snapshot).

gitignore(5): blank lines and `#` comments are skipped, trailing spaces dropped unless escaped, `!`
re-includes, a trailing `/` matches folders only, a slash at the start or in the middle anchors the
pattern to the folder of its file, otherwise it matches a name at any depth below it; `*`, `?` and
`[...]` never match a `/`, `**/`, `/**` and `/**/` match across folders. Every file's patterns are
turned into regular expressions on the path from the top of the work tree, so the rules of all files
form one list: the global excludes file, info/exclude, then each .gitignore from the top down, the last
matching pattern deciding (git's precedence). Without any `!` pattern one combined expression answers.

A path below an ignored folder is ignored too (git cannot re-include it): the walk does not descend into
ignored folders, and passes `inside_ignored` for the tracked ones it must enter anyway.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_CLASSES = {"alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f",
            "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
            "space": " \\t\\n\\r\\f\\v", "upper": "A-Z", "xdigit": "0-9A-Fa-f"}


class Pattern(NamedTuple):
    regex: str  # on the path from the top of the work tree
    negated: bool
    dir_only: bool


class Rules(NamedTuple):
    patterns: tuple[Pattern, ...]

    @staticmethod
    def parse(text: bytes, base: str, source: str = "") -> Rules:
        prefix = re.escape(base + "/") if base else ""
        found = []
        for raw in text.decode("utf-8", "surrogateescape").split("\n"):
            line = _strip_trailing_spaces(raw.rstrip("\r") if raw.endswith("\r") else raw)
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            if negated or line.startswith(("\\!", "\\#")):
                line = line[1:]
            dir_only = line.endswith("/") and not line.endswith("\\/")
            if dir_only:
                line = line.rstrip("/")
            if not line:
                continue
            anchored = "/" in line
            if line.startswith("/"):
                line = line[1:]
            body = _translate(line)
            if body is None:
                continue
            regex = prefix + body if anchored else prefix + "(?:.*/)?" + body
            found.append(Pattern("^" + regex + "$", negated, dir_only))
        return Rules(tuple(found))


def parse_capped(data: bytes | None, base: str, source: str, limit: int = 1 << 20) -> Rules:
    """The rules of a file agentbox read itself (None: absent or not a regular file: no rules)."""
    if data is None:
        return Rules(())
    return Rules.parse(data[:limit], base, source)


class Matcher:
    def __init__(self, global_rules: list[Rules], ignore_case: bool = False,
                 _patterns: tuple[Pattern, ...] | None = None) -> None:
        # Lowest precedence first: the global excludes file, then info/exclude (the caller gives them in
        # that order: info/exclude, excludes file).
        if _patterns is None:
            _patterns = tuple(pattern for rules in reversed(global_rules) for pattern in rules.patterns)
        self.ignore_case = ignore_case
        self.patterns = _patterns
        flags = re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL
        self._compiled = [(re.compile(p.regex, flags), p.negated, p.dir_only) for p in _patterns]
        self._simple = not any(p.negated for p in _patterns)
        if self._simple:
            files = [p.regex for p in _patterns if not p.dir_only]
            self._files = re.compile("|".join(f"(?:{r})" for r in files), flags) if files else None
            every = [p.regex for p in _patterns]
            self._dirs = re.compile("|".join(f"(?:{r})" for r in every), flags) if every else None

    def with_dir(self, base: str, rules: Rules) -> Matcher:
        if not rules.patterns:
            return self
        return Matcher([], self.ignore_case, self.patterns + rules.patterns)

    def is_ignored(self, path: str, is_dir: bool) -> bool:
        """Whether path (from the top, "/"-separated) is ignored by its own name (not its folders')."""
        if self._simple:
            combined = self._dirs if is_dir else self._files
            return combined is not None and combined.match(path) is not None
        for regex, negated, dir_only in reversed(self._compiled):
            if dir_only and not is_dir:
                continue
            if regex.match(path):
                return not negated
        return False


def _strip_trailing_spaces(line: str) -> str:
    end = len(line)
    while end > 0 and line[end - 1] == " ":
        backslashes = len(line[:end - 1]) - len(line[:end - 1].rstrip("\\"))
        if backslashes % 2:
            break
        end -= 1
    return line[:end]


def _translate(pattern: str) -> str | None:
    """A wildmatch pattern (WM_PATHNAME) as a regular expression; None when it cannot match anything."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            stars = j - i
            at_start = i == 0 or pattern[i - 1] == "/"
            at_end = j == n or pattern[j] == "/"
            if stars >= 2 and at_start and at_end:
                if j == n:
                    out.append(".*")  # `/**` at the end: everything inside
                    i = j
                else:
                    out.append("(?:.*/)?")  # `**/` : zero or more folders
                    i = j + 1
                continue
            out.append("[^/]*")
            i = j
        elif ch == "?":
            out.append("[^/]")
            i += 1
        elif ch == "[":
            translated, i = _bracket(pattern, i)
            if translated is None:
                return None
            out.append(translated)
        elif ch == "\\":
            if i + 1 < n:
                out.append(re.escape(pattern[i + 1]))
                i += 2
            else:
                return None  # a trailing backslash matches nothing (git)
        else:
            out.append(re.escape(ch))
            i += 1
    return "".join(out)


def _bracket(pattern: str, start: int) -> tuple[str | None, int]:
    """A `[...]` class from start; (None, _) when it is not closed (then the pattern matches nothing)."""
    i = start + 1
    n = len(pattern)
    negate = i < n and pattern[i] in "!^"
    if negate:
        i += 1
    parts: list[str] = []
    first = True
    while i < n:
        ch = pattern[i]
        if ch == "]" and not first:
            body = "".join(parts)
            return ("[^/" + body + "]" if negate else "[" + body + "]"), i + 1
        first = False
        if ch == "[" and pattern.startswith("[:", i):
            end = pattern.find(":]", i + 2)
            if end != -1 and pattern[i + 2:end] in _CLASSES:
                parts.append(_CLASSES[pattern[i + 2:end]])
                i = end + 2
                continue
        if ch == "\\" and i + 1 < n:
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if ch == "-" and parts and i + 1 < n and pattern[i + 1] != "]":
            parts.append("-")
            i += 1
            continue
        parts.append(re.escape(ch) if ch not in "-" else "\\-")
        i += 1
    return None, n
