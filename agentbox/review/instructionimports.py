"""The files an instruction file imports: Claude Code's and Gemini CLI's `@path` lines, read from approved copies.

Claude Code's CLAUDE.md (and Gemini CLI's GEMINI.md) may pull another file into the agent's instructions with
`@path/to/file`: relative to the importing file, recursively (Claude Code follows 5 hops), never inside a code span
or a fenced code block. Such a file steers the agent as much as the one importing it, so the quarantine covers it.
Only paths inside the workspace are followed: an absolute path, `~/...`, or one that leaves the workspace names
a file agentbox does not watch (said, never read).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from agentbox import lazyre, vmread
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.review.instructionscan import FILE, Entry

MAX_HOPS = 5  # Claude Code's limit: an import of an import ... five deep
_FENCE = lazyre.compile(r"^\s{0,3}(`{3,}|~{3,})")
_SPAN = lazyre.compile(r"(`+)(?:(?!\1).)+?\1")
_IMPORT = lazyre.compile(r"(?:^|(?<=\s))@((?:[^\s\\]|\\ )+)")


class Targets(NamedTuple):
    inside: list[str]  # workspace-relative labels
    outside: list[str]  # as written (absolute, ~, or leaving the workspace): not followed


def importing() -> tuple[str, ...]:
    """The names of the instruction files that may import others with `@path` (each agent's record says)."""
    return tuple(dict.fromkeys(name for spec in BUILTIN_AGENTS.values() for name in spec.instruction_imports))


def targets(label: str, data: bytes) -> Targets:
    """The `@path` imports of the file `label` (workspace-relative) whose bytes are `data`."""
    inside: list[str] = []
    outside: list[str] = []
    fence = ""
    for line in data.decode("utf-8", "replace").splitlines():
        opened = _FENCE.match(line)
        if opened:
            mark = opened.group(1)
            if not fence:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = ""
            continue
        if fence:
            continue
        for raw in _IMPORT.findall(_SPAN.sub("", line)):
            path = raw.replace("\\ ", " ").split("#", 1)[0]
            if not path:
                continue
            resolved = _resolved(label, path)
            (inside if resolved else outside).append(resolved or path)
    return Targets(list(dict.fromkeys(inside)), list(dict.fromkeys(outside)))


def _resolved(label: str, path: str) -> str | None:
    if path.startswith(("/", "~")):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(label), path))
    parts = joined.split("/")
    if joined in (".", "") or parts[0] == ".." or not all(vmread.single(part) for part in parts):
        return None
    return joined


def followed(approved: Mapping[str, Entry], importing: Iterable[str],
             blob: Callable[[str], bytes | None]) -> tuple[str, ...]:
    """Every workspace path the approved instruction files import, directly or through an import (MAX_HOPS):
    the imports of files named one of `importing` (CLAUDE.md, GEMINI.md, ... in any folder), then theirs."""
    names = {name.casefold() for name in importing}
    frontier = [label for label, entry in approved.items()
                if entry.kind == FILE and posixpath.basename(label).casefold() in names]
    seen: dict[str, None] = {}
    for _ in range(MAX_HOPS):
        after = []
        for label in frontier:
            entry = approved.get(label)
            data = blob(entry.value) if entry is not None and entry.kind == FILE else None
            for target in targets(label, data).inside if data is not None else ():
                if target not in seen and target != label:
                    seen[target] = None
                    after.append(target)
        frontier = after
    return tuple(sorted(seen))
