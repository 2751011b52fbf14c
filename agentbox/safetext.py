"""Text the agent wrote, made safe to print: every control character becomes a visible escape.

File names and file contents from the workspace reach the user's terminal in the tripwire's warnings
and in agentbox's notes. Printed raw, an escape sequence could move the cursor, recolour or erase
the very warning it appears in, a carriage return or backspace could overwrite it, and a bidi
override could make a line read differently from what it is. So anything that is not a printable
character is shown the way Python writes it in a string literal: `\\x1b`, `\\r`, `\\u202e`.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(text: str, keep_tab: bool = False) -> str:
    """text with control, format (bidi, zero-width), separator and unassigned characters escaped.

    keep_tab leaves tabs as they are: harmless on a terminal and common in the config files and
    Makefiles whose diffs the tripwire prints. File names show them escaped.
    """
    if text.isprintable():
        return text
    return "".join(char if _keep(char, keep_tab) else _escape(char) for char in text)


def _keep(char: str, keep_tab: bool) -> bool:
    return char == " " or (keep_tab and char == "\t") or char.isprintable()


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible_text(text: str) -> str:
    """Several lines (a file's content, a diff): each line made visible, newlines and tabs kept."""
    return "\n".join(visible(line, keep_tab=True) for line in text.split("\n"))
