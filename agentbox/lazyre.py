"""Regular expressions compiled on first use: `lazyre.compile` takes what `re.compile` takes and answers the same
methods, but importing a module compiles nothing (issue 40: ~30 ms of every start-up went to patterns compiled at
import, most of which the command never used)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, AnyStr, Generic


class Pattern(Generic[AnyStr]):
    """A re.Pattern made by the first call that needs it; `compiled` is that re.Pattern."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: AnyStr, flags: int = 0) -> None:
        self.pattern: AnyStr = pattern
        self.flags: int = flags
        self._compiled: re.Pattern[AnyStr] | None = None

    @property
    def compiled(self) -> re.Pattern[AnyStr]:
        compiled = self._compiled
        if compiled is None:  # two threads may both compile: the same pattern, either one kept
            compiled = self._compiled = re.compile(self.pattern, self.flags)
        return compiled

    def match(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[AnyStr] | None:
        return self.compiled.match(string, pos, endpos)

    def fullmatch(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[AnyStr] | None:
        return self.compiled.fullmatch(string, pos, endpos)

    def search(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[AnyStr] | None:
        return self.compiled.search(string, pos, endpos)

    def findall(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        return self.compiled.findall(string, pos, endpos)

    def finditer(self, string: AnyStr, pos: int = 0, endpos: int = sys.maxsize) -> Iterator[re.Match[AnyStr]]:
        return self.compiled.finditer(string, pos, endpos)

    def split(self, string: AnyStr, maxsplit: int = 0) -> list[AnyStr | Any]:
        return self.compiled.split(string, maxsplit)

    def sub(self, repl: AnyStr | Callable[[re.Match[AnyStr]], AnyStr], string: AnyStr, count: int = 0) -> AnyStr:
        return self.compiled.sub(repl, string, count)

    def subn(self, repl: AnyStr | Callable[[re.Match[AnyStr]], AnyStr], string: AnyStr,
             count: int = 0) -> tuple[AnyStr, int]:
        return self.compiled.subn(repl, string, count)

    def __repr__(self) -> str:
        return f"lazyre.compile({self.pattern!r}, {self.flags!r})"


def compile(pattern: AnyStr, flags: int = 0) -> Pattern[AnyStr]:
    """re.compile(pattern, flags) when first used."""
    return Pattern(pattern, flags)
