"""Read a patch an agent proposes and say whether it may reach the host.

An isolated run hands back its work as the output of `git diff --binary --full-index`. The agent
wrote that patch, so it is read here as hostile input: `parse` accepts only the format git writes
(anything else is a PatchError naming the line, never a guess), and `problems` lists every change
the host must not take: paths out of the tree or into a git folder or agentbox's own files,
symbolic links that lead out of the tree or that other changes write through, submodules, names
with control characters, a file changed twice, and (unless allowed) the files the host runs
without asking (tripwire.host_exec_matcher answers that for a workspace).

Names are compared the way a macOS or Windows file system sees them: case folded, Unicode
normalized, with the characters HFS+ ignores dropped, and for `.git` also with the trailing dots
and spaces and the `git~1` short name that NTFS accepts. Files already on the host are not looked
at here (no I/O): the caller answers, through `on_host`, what each path is on the host (the
workspace, never followed, and the proposal's base). The type of a file a patch changes is the
host's, never the patch's: a change whose stated type differs is refused, a symbolic link on the
host is checked as one whatever the patch says, and a path through a folder that is a link on the
host is refused. A modification whose `index` line names no mode is refused outright: git apply
would then keep the host's type, so a link's target could be rewritten as if it were text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import NamedTuple

from agentbox import lazyre
from agentbox.safetext import visible

MAX_FILES = 100_000
REGULAR, EXECUTABLE, SYMLINK, GITLINK = "100644", "100755", "120000", "160000"
MODES = frozenset((REGULAR, EXECUTABLE, SYMLINK, GITLINK))
TREE, OTHER = "040000", "other"  # what a host path may be besides those: a folder; a FIFO, socket or device
_KINDS = {REGULAR: "a regular file", EXECUTABLE: "an executable file", SYMLINK: "a symbolic link",
          GITLINK: "a submodule", TREE: "a folder", OTHER: "a FIFO, socket or device"}

# HFS+ ignores these code points in names, so `.g\u200cit` is `.git` there (as git's utf8.c knows).
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])
_GIT_FOLDER_NAMES = frozenset((".git", "git~1"))
_AGENTBOX_FOLDER = ".agentbox"
# Files agentbox reads from a workspace: its config (found in any folder) and the CA file `agentbox ca` writes.
_AGENTBOX_FILES = frozenset(("agentbox.yml", "agentbox-ca.pem"))
# git refuses these as symbolic links (it reads them from the work tree).
_GIT_DOTFILES = frozenset((".gitmodules", ".gitattributes", ".gitignore", ".mailmap"))

_HEX = rb"(?:[0-9a-f]{40}|[0-9a-f]{64})"
_INDEX = lazyre.compile(rb"(" + _HEX + rb")\.\.(" + _HEX + rb")(?: ([0-9]{6}))?")
_HUNK = lazyre.compile(rb"@@ -([0-9]{1,10})(?:,([0-9]{1,10}))? \+([0-9]{1,10})(?:,([0-9]{1,10}))? @@(?: .*)?", re.S)
_BINARY_HUNK = lazyre.compile(rb"(literal|delta) ([0-9]{1,12})")
_BASE85 = frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~")
_UNESCAPE = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12, ord("r"): 13,
             ord('"'): ord('"'), ord("\\"): ord("\\")}
_HEADERS = (b"old mode ", b"new mode ", b"deleted file mode ", b"new file mode ", b"similarity index ",
            b"dissimilarity index ", b"rename from ", b"rename to ", b"copy from ", b"copy to ", b"index ")


class FileChange(NamedTuple):
    status: str  # "added" | "deleted" | "modified" | "renamed" | "copied" | "mode" (only a mode change)
    old_path: str | None  # repository-relative, decoded (undecodable bytes as surrogate escapes); None when added
    new_path: str | None  # None when deleted
    old_mode: str | None  # "100644", "100755", "120000", "160000", or None when the patch does not say
    new_mode: str | None
    binary: bool
    symlink_target: str | None  # a new or changed symbolic link's target, when the patch shows all of it
    added_lines: int
    removed_lines: int


class OnHost(NamedTuple):
    """What a path is on the host, as agentbox found it (never as the patch says)."""

    mode: str | None  # SYMLINK when the workspace or the base has a link there; else the workspace's type (a
    # MODES value, TREE or OTHER), else the base's; None when neither has anything there
    link_target: str | None  # the target of the workspace's symbolic link at the path
    linked_folder: str | None  # a folder on the way to the path that is a symbolic link in the workspace


NOT_THERE = OnHost(None, None, None)


class PatchError(Exception):
    """The patch is not in the format git writes; the message names the line and what was wrong."""


# -- parsing -----------------------------------------------------------------------------------


def parse(patch: bytes, limit: int = 64 * 1024 * 1024) -> list[FileChange]:
    """Every file change in a `git diff --binary --full-index` patch, in the patch's order."""
    return [change for change, _ in split(patch, limit)]


def split(patch: bytes, limit: int = 64 * 1024 * 1024) -> list[tuple[FileChange, bytes]]:
    """Every file change with its own text (from its `diff --git` line to the next one): the texts of some of
    them, joined in order, are the patch of those changes alone."""
    if len(patch) > limit:
        raise PatchError(f"the patch is {len(patch)} bytes, more than the limit of {limit}")
    if not patch:
        return []
    lines = _Lines(patch.split(b"\n"))
    if patch[-1:] != b"\n":
        raise PatchError(f"line {lines.count}: the patch ends in the middle of a line (cut short?)")
    changes: list[tuple[FileChange, bytes]] = []
    while not lines.done():
        if len(changes) == MAX_FILES:
            raise PatchError(f"line {lines.number}: the patch changes more than {MAX_FILES} files")
        start = lines.number
        change = _file(lines)
        changes.append((change, lines.text_from(start)))
    return changes


class _Lines:
    """The patch's lines (split at LF only: a CR is part of its line), read one at a time."""

    def __init__(self, lines: list[bytes]) -> None:
        self._lines = lines[:-1]  # the text after the final newline is empty
        self._next = 0

    @property
    def count(self) -> int:
        return len(self._lines) + 1

    @property
    def number(self) -> int:
        """The 1-based number of the line peek() and take() return."""
        return self._next + 1

    def done(self) -> bool:
        return self._next >= len(self._lines)

    def peek(self) -> bytes | None:
        return None if self.done() else self._lines[self._next]

    def text_from(self, number: int) -> bytes:
        """The lines from line `number` up to the next one take() returns, each with its newline."""
        return b"".join(line + b"\n" for line in self._lines[number - 1:self._next])

    def take(self, what: str) -> bytes:
        if self.done():
            raise PatchError(f"line {self.number}: the patch ends where {what} was expected (cut short?)")
        self._next += 1
        return self._lines[self._next - 1]


class _Hunks(NamedTuple):
    added: int
    removed: int
    old_total: int
    new_total: int
    new_text: bytes | None  # the whole new content, when kept and one hunk shows it from line 1 to the end


def _file(lines: _Lines) -> FileChange:
    first = lines.number
    diff_line = lines.take("a `diff --git` line")
    if not diff_line.startswith(b"diff --git "):
        raise PatchError(f"line {first}: expected a `diff --git` line, found {_show(diff_line)}")
    git_line = diff_line[len(b"diff --git "):]
    if git_line.endswith(b"\r"):
        raise PatchError(f"line {first}: the line ends in a carriage return: git writes none there, "
                         "so the patch was changed after git wrote it (CRLF line endings?)")
    headers: dict[bytes, tuple[int, bytes]] = {}
    while (line := lines.peek()) is not None:
        key = next((k for k in _HEADERS if line.startswith(k)), None)
        if key is None:
            break
        if key in headers:
            raise PatchError(f"line {lines.number}: a second `{key.decode().strip()}` line for one file")
        headers[key] = (lines.number, line[len(key):])
        lines.take("")
    header = _Header(headers, first)
    old_mode, new_mode = header.modes()
    dashes: tuple[bytes | None, bytes | None] | None = None
    hunks: _Hunks | None = None
    binary = False
    line = lines.peek()
    if line is not None and line.startswith(b"--- "):
        dashes = _dash_names(lines)
        hunks = _hunks(lines, keep_new_text=new_mode == SYMLINK)
    elif line == b"GIT binary patch":
        lines.take("")
        _binary_block(lines)
        binary = True
    elif line is not None and line.startswith(b"Binary files ") and line.endswith(b" differ"):
        lines.take("")
        binary = True
    line = lines.peek()
    if line is not None and not line.startswith(b"diff --git "):
        raise PatchError(f"line {lines.number}: expected the next `diff --git` line, found {_show(line)}")

    status, old, new = _identify(header, git_line, dashes)
    content = hunks is not None or binary
    if status == "modified" and not content:
        if not header.has(b"old mode "):
            raise PatchError(f"line {first}: the change of {_show(old or b'')} shows neither a mode change nor content")
        status = "mode"
    if content and not header.has(b"index "):
        raise PatchError(f"line {first}: a content change without an `index` line")
    if hunks is not None and status == "added" and hunks.old_total:
        raise PatchError(f"line {first}: a new file whose hunks remove lines")
    if hunks is not None and status == "deleted" and hunks.new_total:
        raise PatchError(f"line {first}: a deleted file whose hunks add lines")
    return FileChange(
        status=status,
        old_path=None if old is None else _decode(old),
        new_path=None if new is None else _decode(new),
        old_mode=old_mode,
        new_mode=new_mode,
        binary=binary,
        symlink_target=None if hunks is None or hunks.new_text is None else _decode(hunks.new_text),
        added_lines=hunks.added if hunks else 0,
        removed_lines=hunks.removed if hunks else 0,
    )


class _Header:
    """The extended header lines of one file (`new file mode`, `rename from`, `index`...)."""

    def __init__(self, headers: dict[bytes, tuple[int, bytes]], first: int) -> None:
        self._headers = headers
        self.first = first

    def has(self, key: bytes) -> bool:
        return key in self._headers

    def name(self, key: bytes) -> bytes | None:
        if key not in self._headers:
            return None
        number, value = self._headers[key]
        return _whole_name(value, number)

    def mode(self, key: bytes) -> str | None:
        if key not in self._headers:
            return None
        return _mode(*self._headers[key])

    def modes(self) -> tuple[str | None, str | None]:
        """(old mode, new mode) as the header states them; both None for a rename that says nothing."""
        for key in (b"similarity index ", b"dissimilarity index "):
            if key in self._headers:
                number, value = self._headers[key]
                if not re.fullmatch(rb"[0-9]{1,3}%", value) or int(value[:-1]) > 100:
                    raise PatchError(f"line {number}: {_show(value)} is not a percentage")
        index_mode = None
        if b"index " in self._headers:
            number, value = self._headers[b"index "]
            match = _INDEX.fullmatch(value)
            if match is None:
                raise PatchError(f"line {number}: expected `index <full hash>..<full hash> [mode]`, "
                                 f"found {_show(value)} (the patch must be made with --full-index)")
            if match[3] is not None:
                index_mode = _mode(number, match[3])
        old, new = self.mode(b"old mode "), self.mode(b"new mode ")
        created, deleted = self.mode(b"new file mode "), self.mode(b"deleted file mode ")
        if (old is None) != (new is None):
            raise PatchError(f"line {self.first}: `old mode` and `new mode` come together")
        if old is not None and new is not None and _file_type(old) != _file_type(new):
            raise PatchError(f"line {self.first}: a change of file type in place "
                             "(git writes it as a deletion and an addition)")
        if index_mode is not None and (old or created or deleted):
            raise PatchError(f"line {self.first}: the `index` line names a mode although the mode is given apart")
        if created and deleted:
            raise PatchError(f"line {self.first}: a file both created and deleted")
        if created:
            return None, created
        if deleted:
            return deleted, None
        if old:
            return old, new
        return index_mode, index_mode


def _mode(number: int, value: bytes) -> str:
    mode = value.decode("ascii", "replace")
    if mode not in MODES:
        raise PatchError(f"line {number}: {_show(value)} is not a file mode git writes")
    return mode


def _identify(header: _Header, git_line: bytes,
              dashes: tuple[bytes | None, bytes | None] | None) -> tuple[str, bytes | None, bytes | None]:
    """(status, old name, new name), each name checked against every line that states it."""
    first = header.first
    created, deleted = header.has(b"new file mode "), header.has(b"deleted file mode ")
    renamed = header.has(b"rename from ") or header.has(b"rename to ")
    copied = header.has(b"copy from ") or header.has(b"copy to ")
    if ((created or deleted) and (renamed or copied)) or (renamed and copied):
        raise PatchError(f"line {first}: a file change that is more than one of: new, deleted, renamed, copied")
    if header.has(b"similarity index ") != (renamed or copied):
        raise PatchError(f"line {first}: `similarity index` belongs with, and only with, a rename or copy")
    kind = "rename" if renamed else "copy"
    source, target = header.name(f"{kind} from ".encode()), header.name(f"{kind} to ".encode())
    if (renamed or copied) and (source is None or target is None):
        raise PatchError(f"line {first}: a {kind} needs both `{kind} from` and `{kind} to`")
    if dashes is not None:
        old_dash, new_dash = dashes
        if (old_dash is None) != created or (new_dash is None) != deleted:
            raise PatchError(f"line {first}: the `---`/`+++` lines disagree with the file being "
                             f"{'new' if created else 'deleted' if deleted else 'changed'}")
        named_old = old_dash if old_dash is not None else new_dash
        named_new = new_dash if new_dash is not None else old_dash
        if source is not None and (named_old, named_new) != (source, target):
            raise PatchError(f"line {first}: the `---`/`+++` names disagree with the {kind} lines")
        source, target = named_old, named_new
    names = _git_line_names(git_line, first, source, target)
    if names is None or (names[0] != names[1] and not (renamed or copied)):
        raise PatchError(f"line {first}: {_show(git_line)} is not one name twice, and no rename or copy lines "
                         "name the two")
    old, new = names
    if source is not None and (source, target) != (old, new):
        raise PatchError(f"line {first}: the `diff --git` names disagree with the lines below it")
    if created:
        return "added", None, new
    if deleted:
        return "deleted", old, None
    if renamed or copied:
        return ("renamed" if renamed else "copied"), old, new
    return "modified", old, new


def _git_line_names(rest: bytes, number: int, old: bytes | None, new: bytes | None) -> tuple[bytes, bytes] | None:
    """The names on a `diff --git` line, without their a/ and b/ prefixes.

    Unquoted names with spaces are ambiguous there. git writes two unquoted names that differ only
    for a rename or copy, whose own lines give them (old, new): the line must then spell exactly those.
    """
    if rest.startswith(b'"'):
        first, after = _quoted(rest, number)
        if not after.startswith(b" "):
            raise PatchError(f"line {number}: expected a space after the first name of `diff --git`")
        pair = (first, _whole_name(after[1:], number))
    elif b'"' in rest:  # an unquoted name has no `"`: this one starts the second name
        at = rest.index(b'"')
        if rest[at - 1:at] != b" ":
            raise PatchError(f"line {number}: a `\"` inside an unquoted name")
        pair = (_plain(rest[:at - 1], number), _whole_name(rest[at:], number))
    else:
        _plain(rest, number)
        half = (len(rest) - 1) // 2
        if len(rest) % 2 == 1 and rest[half:half + 1] == b" " and rest[2:half] == rest[half + 3:]:
            pair = (rest[:half], rest[half + 1:])
        elif old is not None and new is not None and rest == b"a/" + old + b" b/" + new:
            return old, new
        else:
            return None
    a_name, b_name = pair
    if not a_name.startswith(b"a/") or not b_name.startswith(b"b/"):
        raise PatchError(f"line {number}: the names of `diff --git` must start with a/ and b/")
    return a_name[2:], b_name[2:]


def _dash_names(lines: _Lines) -> tuple[bytes | None, bytes | None]:
    """The names of the `---` and `+++` lines (None for /dev/null), prefixes removed."""
    names: list[bytes | None] = []
    for marker, prefix in ((b"--- ", b"a/"), (b"+++ ", b"b/")):
        number = lines.number
        line = lines.take(f"a `{marker.decode().strip()}` line")
        if not line.startswith(marker):
            raise PatchError(f"line {number}: expected a `{marker.decode().strip()}` line, found {_show(line)}")
        value = line[len(marker):]
        if value == b"/dev/null":
            names.append(None)
            continue
        # git ends the name with a tab when it has a space (so a name may end in spaces).
        if value.startswith(b'"'):
            name, after = _quoted(value, number)
            if after not in (b"", b"\t"):
                raise PatchError(f"line {number}: unexpected text after the name: {_show(after)}")
        else:
            name = _plain(value.removesuffix(b"\t"), number)
        if not name.startswith(prefix):
            raise PatchError(f"line {number}: the name must start with {prefix.decode()} or be /dev/null")
        names.append(name[len(prefix):])
    if names == [None, None]:
        raise PatchError(f"line {lines.number - 1}: both `---` and `+++` are /dev/null")
    return names[0], names[1]


def _whole_name(value: bytes, number: int) -> bytes:
    """A name that is the rest of its line: quoted, or plain."""
    if value.startswith(b'"'):
        name, after = _quoted(value, number)
        if after:
            raise PatchError(f"line {number}: unexpected text after the quoted name: {_show(after)}")
        return name
    return _plain(value, number)


def _plain(name: bytes, number: int) -> bytes:
    """An unquoted name. git quotes every name with a control character, `"` or `\\`."""
    if b"\r" in name:
        raise PatchError(f"line {number}: a carriage return in a name ({_show(name)}); git quotes such names, "
                         "so the patch was changed after git wrote it (CRLF line endings?)")
    if any(byte < 0x20 or byte == 0x7F for byte in name) or b"\\" in name:
        raise PatchError(f"line {number}: a control character or backslash in an unquoted name ({_show(name)}); "
                         "git quotes such names")
    if not name:
        raise PatchError(f"line {number}: an empty name")
    return name


def _quoted(value: bytes, number: int) -> tuple[bytes, bytes]:
    """A C-style quoted name at the start of value, as git writes it: (the name, the text after it)."""
    out = bytearray()
    i = 1
    while i < len(value):
        byte = value[i]
        if byte == ord('"'):
            return bytes(out), value[i + 1:]
        if byte == ord("\\"):
            code = value[i + 1:i + 2]
            if code and code[0] in _UNESCAPE:
                out.append(_UNESCAPE[code[0]])
                i += 2
                continue
            digits = value[i + 1:i + 4]
            if re.fullmatch(rb"[0-3][0-7][0-7]", digits):
                out.append(int(digits, 8))
                i += 4
                continue
            raise PatchError(f"line {number}: an unknown escape in a quoted name: {_show(value[i:i + 4])}")
        out.append(byte)
        i += 1
    raise PatchError(f"line {number}: a quoted name without its closing quote")


def _hunks(lines: _Lines, keep_new_text: bool) -> _Hunks:
    """The hunks after `---`/`+++`; each must hold exactly the lines its `@@` header counts."""
    added = removed = old_total = new_total = count = 0
    new_text: list[bytes] = []
    whole = False
    while (line := lines.peek()) is not None and line.startswith(b"@@ "):
        start = lines.number
        lines.take("")
        match = _HUNK.fullmatch(line)
        if match is None:
            raise PatchError(f"line {start}: not a hunk header: {_show(line)}")
        new_start = int(match[3])
        old_left = 1 if match[2] is None else int(match[2])
        new_left = 1 if match[4] is None else int(match[4])
        old_total, new_total, count = old_total + old_left, new_total + new_left, count + 1
        previous = b""
        new_ends_unterminated = False  # the last new-side line is followed by `\ No newline at end of file`
        while True:
            line = lines.peek()
            if line is not None and line.startswith(b"\\"):
                if previous not in (b" ", b"-", b"+") or not line.startswith(b"\\ "):
                    raise PatchError(f"line {lines.number}: a misplaced `\\ No newline at end of file` line")
                new_ends_unterminated = new_ends_unterminated or previous in (b" ", b"+")
                previous = b"\\"
                lines.take("")
                continue
            if not old_left and not new_left:
                break
            missing = f"the hunk at line {start} ends early, {old_left} old and {new_left} new lines short"
            if line is None:
                raise PatchError(f"line {lines.number}: {missing} (cut short?)")
            kind = line[:1]
            if kind == b" " and old_left and new_left:
                old_left, new_left = old_left - 1, new_left - 1
            elif kind == b"-" and old_left:
                old_left, removed = old_left - 1, removed + 1
            elif kind == b"+" and new_left:
                new_left, added = new_left - 1, added + 1
            elif kind in (b" ", b"-", b"+"):
                raise PatchError(f"line {lines.number}: the hunk at line {start} has more "
                                 f"{'old' if kind == b'-' else 'new'} lines than its header counts")
            elif not line:
                raise PatchError(f"line {lines.number}: an empty line in the hunk at line {start} "
                                 "(git writes an empty context line as one space)")
            else:
                raise PatchError(f"line {lines.number}: {missing}, found {_show(line)}")
            if kind in (b" ", b"+"):
                new_ends_unterminated = False
                if keep_new_text:
                    new_text.append(line[1:])
            previous = kind
            lines.take("")
        following = lines.peek()
        if following is not None and following[:1] in (b" ", b"-", b"+"):
            raise PatchError(f"line {lines.number}: the hunk at line {start} has more lines than its header counts")
        whole = count == 1 and new_start == 1 and new_ends_unterminated
    if count == 0:
        raise PatchError(f"line {lines.number}: expected a hunk (`@@ -a,b +c,d @@`) after `---` and `+++`")
    return _Hunks(added, removed, old_total, new_total, b"\n".join(new_text) if keep_new_text and whole else None)


def _binary_block(lines: _Lines) -> None:
    """Skip a `GIT binary patch` block after checking its shape: a forward and an optional reverse
    hunk, each `literal N` or `delta N`, lines of base85 data, and an empty line."""
    for hunk in range(2):
        line = lines.peek()
        if hunk == 1 and (line is None or _BINARY_HUNK.fullmatch(line) is None):
            return
        number = lines.number
        line = lines.take("`literal N` or `delta N`")
        if _BINARY_HUNK.fullmatch(line) is None:
            raise PatchError(f"line {number}: expected `literal N` or `delta N` in a binary patch, found {_show(line)}")
        while (line := lines.take("the rest of a binary patch")) != b"":
            if not _base85_line(line):
                raise PatchError(f"line {lines.number - 1}: not a line of base85 data: {_show(line)}")
        if lines.number - 1 == number + 1:
            raise PatchError(f"line {number}: a binary hunk without data")


def _base85_line(line: bytes) -> bool:
    """A length character (A-Z: 1-26 bytes, a-z: 27-52) and five base85 characters per four bytes."""
    first = line[:1]
    size = ord(first) - ord("A") + 1 if b"A" <= first <= b"Z" else ord(first) - ord("a") + 27 if first else 0
    return 1 <= size <= 52 and len(line) == 1 + (size + 3) // 4 * 5 and all(byte in _BASE85 for byte in line[1:])


def _decode(name: bytes) -> str:
    return name.decode("utf-8", "surrogateescape")


def _show(data: bytes, limit: int = 80) -> str:
    text = visible(_decode(data[:limit]))
    return f"`{text}`" + ("..." if len(data) > limit else "")


def _file_type(mode: str) -> str:
    return mode[:3]


# -- checking ----------------------------------------------------------------------------------


def problems(
    changes: list[FileChange],
    host_exec: Callable[[str], bool] | None = None,
    allow_host_exec: bool = False,
    link_target: Callable[[str], str | None] | None = None,
    on_host: Callable[[str], OnHost] | None = None,
) -> list[str]:
    """One line per change the host must not take (empty: the patch is safe to apply).

    host_exec(path) says whether the host runs that file without asking (tripwire.host_exec_matcher);
    such changes are refused unless allow_host_exec. on_host(path) says what the path is on the host;
    with it, the host's type decides (see the module's docstring), and a link's target there decides a
    rename or copy of it. Without on_host, link_target(path) gives the target of the symbolic link at
    that path in the workspace (None: not a link) for such a rename or copy; without either, a move to a
    shallower folder is refused: a relative link moved up could lead out of the tree.
    """
    if on_host is not None:
        host = on_host
        link_target = lambda path: host(path).link_target  # noqa: E731
    found: list[str] = []
    touched: dict[str, FileChange] = {}
    removed: set[str] = set()  # folded paths that earlier changes delete or move away
    links = [c.new_path for c in changes if c.new_mode == SYMLINK and c.new_path is not None]
    folded_links = {fold(path): path for path in links}
    for change in changes:
        paths = list(dict.fromkeys(p for p in (change.old_path, change.new_path) if p is not None))
        path_problems = [f"{visible(path)}: {why}{_role(change, path)}" for path in paths
                         if (why := path_problem(path)) is not None]
        found += path_problems
        if path_problems:
            continue
        found += _index_mode_problems(change)
        if on_host is not None:
            found += _host_problems(change, on_host, removed)
        found += _change_problems(change, link_target)
        for path in paths:
            for parent in _parents(fold(path)):
                if parent in folded_links:
                    found.append(f"{visible(path)}: written through the symbolic link {visible(folded_links[parent])} "
                                 "that the same patch creates")
                    break
        for key, path in {fold(path): path for path in _changed_paths(change)}.items():
            earlier = touched.get(key)
            if earlier is not None and not _type_change(earlier, change):
                other = "" if path in _changed_paths(earlier) else \
                    " (under another name of the same file on a case-insensitive file system)"
                found.append(f"{visible(path)}: changed twice in one patch{other}")
            touched[key] = change
        if change.status in ("deleted", "renamed") and change.old_path is not None:
            removed.add(fold(change.old_path))
        if host_exec is not None and not allow_host_exec:
            found += [f"{visible(path)}: a file your host runs without asking (hooks, build files, editor tasks); "
                      "refused unless host execution is allowed" for path in paths if host_exec(path)]
    return found


def path_problem(path: str) -> str | None:
    """Why a repository-relative path may not be written from a patch, or None."""
    if not path:
        return "an empty path"
    if any(0xDC80 <= ord(char) <= 0xDCFF for char in path):
        return "a name that is not valid UTF-8"
    if any(unicodedata.category(char) == "Cc" for char in path):
        return "a name with a control character"
    if path.startswith("/"):
        return "an absolute path"
    parts = path.split("/")
    if "" in parts:
        return "an empty path component (`//` or a trailing `/`)"
    if "." in parts or ".." in parts:
        return "a `.` or `..` component"
    if any(_is_git_folder(part) for part in re.split(r"[/\\]", path)):
        return "inside a git folder (`.git`): host git reads its config and runs its hooks"
    if any(_stripped(part) == _AGENTBOX_FOLDER for part in parts):
        return "inside agentbox's own folder (`.agentbox`)"
    if fold(parts[-1]) in _AGENTBOX_FILES:
        return "agentbox's own file (change it by hand, after reading it)"
    return None


def fold(path: str) -> str:
    """A path as a case-insensitive, normalization-insensitive file system (macOS) tells names apart."""
    return unicodedata.normalize("NFC", path.translate(_HFS_IGNORED).casefold())


def _stripped(part: str) -> str:
    """A folded name as NTFS reads it: an alternate data stream (`:x`) and trailing dots and spaces dropped."""
    return fold(part).partition(":")[0].rstrip(". ")


def _is_git_folder(part: str) -> bool:
    return _stripped(part) in _GIT_FOLDER_NAMES


def _change_problems(change: FileChange, link_target: Callable[[str], str | None] | None) -> list[str]:
    found = []
    path = change.new_path or change.old_path or ""
    if GITLINK in (change.old_mode, change.new_mode):
        found.append(f"{visible(path)}: a submodule (gitlink): it changes what git on your host fetches")
    if change.new_mode == SYMLINK and change.new_path is not None:
        why = _link_problem(change.new_path, change)
        if why:
            found.append(f"{visible(change.new_path)}: {why}")
    elif change.status in ("renamed", "copied") and change.new_mode is None and change.old_path and change.new_path:
        # The patch does not say whether this is a symbolic link; its target stays, its folder changes.
        if link_target is not None:
            target = link_target(change.old_path)
            why = None if target is None else _target_problem(change.new_path, target)
            if why:
                found.append(f"{visible(change.new_path)}: a symbolic link {why}{_role(change, change.new_path)}")
        elif change.new_path.count("/") < change.old_path.count("/"):
            found.append(f"{visible(change.new_path)}: moved up from {visible(change.old_path)} without the patch "
                         "saying whether it is a symbolic link (whose relative target could then lead out of the tree)")
    return found


def _index_mode_problems(change: FileChange) -> list[str]:
    """git writes the mode on the `index` line of every changed file; without it git apply keeps the type the
    file has on the host, so a symbolic link's target would be rewritten by hunks that look like text."""
    content = change.binary or change.added_lines or change.removed_lines
    if change.old_mode is None and change.old_path is not None and (
            change.status == "modified" or (change.status in ("renamed", "copied") and content)):
        return [f"{visible(change.old_path)}: changed by a patch whose `index` line names no file mode (git writes "
                "one; without it the file's type on your host would decide what the patch does)"
                f"{_role(change, change.old_path)}"]
    return []


def _host_problems(change: FileChange, on_host: Callable[[str], OnHost], removed: set[str]) -> list[str]:
    """What the host's own view of the change's paths refuses: the type comes from the host, not the patch."""
    found = []
    paths = list(dict.fromkeys(p for p in (change.old_path, change.new_path) if p is not None))
    linked = False
    for path in paths:
        folder = on_host(path).linked_folder
        if folder is not None:
            linked = True
            found.append(f"{visible(path)}: inside {visible(folder)}, which is a symbolic link on your host"
                         f"{_role(change, path)}")
    if linked:
        return found
    old = change.old_path
    if old is not None:
        host = on_host(old)
        stated = change.old_mode
        if host.mode is not None and stated is not None and _file_type(host.mode) != _file_type(stated):
            found.append(f"{visible(old)}: the patch takes it for {_KINDS[stated]}, but on your host it is "
                         f"{_KINDS.get(host.mode, 'something else')}{_role(change, old)}")
        elif host.mode == SYMLINK and change.status in ("renamed", "copied") and change.new_mode is None \
                and host.link_target is None and change.new_path is not None:
            found.append(f"{visible(change.new_path)}: a symbolic link in the proposal's base that is no longer one in "
                         f"the workspace, so its target cannot be checked{_role(change, change.new_path)}")
    new = change.new_path
    if new is not None and new != old and on_host(new).mode == SYMLINK and fold(new) not in removed:
        found.append(f"{visible(new)}: already a symbolic link on your host, which the patch does not remove"
                     f"{_role(change, new)}")
    return found


def _link_problem(path: str, change: FileChange) -> str | None:
    if change.binary:
        return "a symbolic link given as binary data: its target cannot be checked"
    if fold(path.rsplit("/", 1)[-1]) in _GIT_DOTFILES:
        return "a symbolic link with a name git reads from the work tree (git refuses these)"
    if change.symlink_target is None:
        return "a symbolic link whose target the patch does not show in full"
    why = _target_problem(path, change.symlink_target)
    return f"a symbolic link {why}" if why else None


def _target_problem(path: str, target: str) -> str | None:
    """Why a link at path with this target is refused: resolved lexically from the link's folder."""
    shown = visible(target)
    if not target:
        return "with an empty target"
    if any(0xDC80 <= ord(char) <= 0xDCFF or unicodedata.category(char) == "Cc" for char in target):
        return f"whose target {shown} has a control character or is not valid UTF-8"
    if target.startswith("/"):
        return f"to an absolute path ({shown})"
    depth = path.count("/")  # of the link's folder
    named = False
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if named:
                # Where `x/..` leads depends on whether x is itself a link.
                return f"to {shown}, with `..` after a folder name"
            if not depth:
                return f"to {shown}, which leads out of the tree"
            depth -= 1
            continue
        named = True
        if _is_git_folder(part) or _stripped(part) == _AGENTBOX_FOLDER:
            return f"to {shown}, into a git folder or agentbox's own folder"
    return None


def _changed_paths(change: FileChange) -> list[str]:
    """The paths a change writes or removes (a copy's source is only read)."""
    if change.status == "copied":
        return [change.new_path] if change.new_path else []
    return list(dict.fromkeys(p for p in (change.old_path, change.new_path) if p is not None))


def _type_change(earlier: FileChange, later: FileChange) -> bool:
    """git writes a file replaced by a link (or the other way) as its deletion, then an addition."""
    return (earlier.status == "deleted" and later.status == "added" and earlier.old_path == later.new_path
            and earlier.old_mode is not None and later.new_mode is not None
            and _file_type(earlier.old_mode) != _file_type(later.new_mode))


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _role(change: FileChange, path: str) -> str:
    if change.status not in ("renamed", "copied") or change.old_path == change.new_path:
        return ""
    kind = "rename" if change.status == "renamed" else "copy"
    return f" (the source of a {kind})" if path == change.old_path else f" (the destination of a {kind})"
