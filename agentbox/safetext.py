"""Text from files the agent could have written, made safe to print on the user's terminal.

Escape sequences in a file name or a diff line could erase a warning, retitle the terminal or fake
output; bidi controls could make text read differently from what it is. They are shown as visible
escapes (`\\x1b`, `\\r`, `\\u202e`) instead.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, and the Unicode bidi/direction marks.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\r": "\\r", "\x1b": "\\x1b", "\x08": "\\b"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """text with every control character but tab and newline escaped."""
    return _UNSAFE.sub(_escape, text)


def visible_line(text: str) -> str:
    """One line: newlines are escaped too."""
    return visible(text).replace("\n", "\\n")
