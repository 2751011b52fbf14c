"""Reading a workspace's git folder without git: config, refs, the index and objects, in pure Python.

The workspace's git folder is written by the agent, so no host git ever runs with it as its git dir (its
config could make git run a program, its files could be links to the user's secrets). agentbox reads the
few things it needs itself:

- every file is opened through `_open_file`: folder by folder from the git dir down with
  `O_DIRECTORY|O_NOFOLLOW`, the file with `O_NOFOLLOW|O_NONBLOCK` (a FIFO never blocks), regular files
  only, with a size cap; a link, a FIFO or a device anywhere on the way is an error that names the file;
- every object is checked against its id (the hash of its type, size and content), so a forged object
  the agent planted under an existing id is refused instead of being believed;
- `objects/info/alternates` is never followed (it would point the reader at any folder on the host),
  nor are config `include`s; the reftable ref format, a split index and a sparse index are refused
  with a GitReadError the caller can fall back from.

Nothing here writes anything, and nothing runs a subprocess.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import re
import stat
import struct
import sys
import zlib
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from agentbox import lazyre, vmread
from agentbox.errors import StateError
from agentbox.fsutil import file_kind
from agentbox.safetext import visible

MAX_CONFIG = 4 << 20
MAX_REF_FILE = 4096
MAX_PACKED_REFS = 256 << 20
MAX_SYMREF_DEPTH = 5
MAX_OBJECT = 256 << 20  # the default cap on one object's size (ObjectReader's max_size)
MAX_PACKS = 1000
MAX_PACK_FILE = 1 << 44  # packs are read with pread, never whole: this cap only keeps the fstat check uniform
MAX_DELTA_DEPTH = 4095  # the deepest chain `git repack --depth` can write
MAX_TREE_ENTRIES = 2_000_000
MAX_TREE_DEPTH = 1000
BASE_CACHE_BYTES = 32 << 20

HASH_LEN = {"sha1": 20, "sha256": 32}
OBJECT_TYPES = ("commit", "tree", "blob", "tag")
_PACK_TYPES = {1: "commit", 2: "tree", 3: "blob", 4: "tag"}
_OFS_DELTA = 6
_REF_DELTA = 7
_HEX = lazyre.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class GitReadError(StateError):
    """Something in a workspace's git folder that agentbox will not read: the message names the file."""


def _shown(path: Path | str) -> str:
    return visible(os.fsdecode(str(path)))


def _open_file(base: Path, rel: str, limit: int) -> tuple[int, int] | None:
    """(fd, size) of base/rel when it is a regular file of at most `limit` bytes; None when it does not exist.

    The one place this module opens a file. base is a folder agentbox located itself (the git dir, the
    common dir); rel is walked one component at a time through folder descriptors without following a
    link, so nothing the agent put below base leads out of it. A FIFO does not block (O_NONBLOCK).
    Anything but a missing file raises GitReadError.
    """
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise GitReadError(f"{_shown(base / rel)}: agentbox reads only plain names inside the git folder")
    try:
        fd = os.open(base, _DIR_FLAGS)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return None
        raise GitReadError(f"{_shown(base)} cannot be opened as a folder (not following links): "
                           f"{err.strerror}") from err
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            if last:
                child = _open_last(fd, base, rel, part)
                os.close(fd)
                if child is None:
                    return None
                fd = child
                break
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                where = base.joinpath(*parts[: index + 1])
                try:
                    mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                except FileNotFoundError:
                    os.close(fd)
                    return None
                except OSError:
                    mode = None
                if mode is not None and not last and stat.S_ISREG(mode):
                    os.close(fd)
                    return None  # refs/heads/x is a file, so refs/heads/x/y does not exist
                kind = file_kind(mode) if mode is not None else "unreadable"
                raise GitReadError(f"{_shown(where)} is {kind}, not a {'regular file' if last else 'folder'}: "
                                   "agentbox reads the workspace's git folder without following links "
                                   f"({err.strerror})") from err
            os.close(fd)
            fd = child
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GitReadError(f"{_shown(base / rel)} is {file_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise GitReadError(f"{_shown(base / rel)} is {st.st_size} bytes, more than the {limit} agentbox reads")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _open_last(parent: int, base: Path, rel: str, name: str) -> int | None:
    """The file itself, opened by agentbox's one reader of what the VM writes (agentbox.vmread): regular,
    no link, never blocking; None when it does not exist."""
    try:
        return vmread.open_regular(parent, name)[0]
    except vmread.Refused as refused:
        if refused.why == vmread.MISSING:
            return None
        reason = "is a symbolic link, not a regular file" if refused.why == vmread.LINK else refused.reason
        raise GitReadError(f"{_shown(base / rel)} {reason}: agentbox reads the workspace's git folder "
                           "without following links") from None


def _read_file(base: Path, rel: str, limit: int) -> bytes | None:
    """The whole of base/rel (see _open_file), or None when it does not exist."""
    opened = _open_file(base, rel, limit)
    if opened is None:
        return None
    fd, size = opened
    try:
        chunks = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(max(size, 1 << 16), limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:
        raise GitReadError(f"{_shown(base / rel)} grew past the {limit} bytes agentbox reads")
    return b"".join(chunks)


# --- config -----------------------------------------------------------------------------------------------


def _parse_config(text: str, where: Path) -> dict[tuple[str, str], str]:
    """{(section, key): last value} from git's config syntax. Section names and keys are lowercased; a
    subsection keeps its case ("remote.origin"). A key without `=` is boolean true ("true"). Includes are
    not followed."""
    values: dict[tuple[str, str], str] = {}
    section = ""
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        rest = line.lstrip(" \t\r\ufeff" if number == 1 else " \t\r")
        if not rest or rest[0] in "#;":
            continue
        if rest[0] == "[":
            section, rest = _section_header(rest, where, number)
            rest = rest.lstrip(" \t\r")
            if not rest or rest[0] in "#;":
                continue
        match = re.match(r"([A-Za-z][A-Za-z0-9-]*)[ \t]*", rest)
        if not match or not section:
            raise GitReadError(f"{_shown(where)}, line {number}: not a line of git's config syntax",
                               hint="Fix or remove the line (git itself refuses this config).")
        key = match.group(1).lower()
        rest = rest[match.end():]
        if not rest or rest[0] in "#;\r":
            values[(section, key)] = "true"
            continue
        if rest[0] != "=":
            raise GitReadError(f"{_shown(where)}, line {number}: not a line of git's config syntax")
        value, number = _config_value(rest[1:], lines, number, where)
        values[(section, key)] = value
    return values


def _section_header(rest: str, where: Path, number: int) -> tuple[str, str]:
    match = re.match(r'\[[ \t]*([A-Za-z0-9.-]+)[ \t]*(?:"((?:[^"\\\n]|\\.)*)")?[ \t]*\]', rest)
    if not match:
        raise GitReadError(f"{_shown(where)}, line {number}: not a section header of git's config syntax")
    name, sub = match.group(1), match.group(2)
    if sub is not None:
        name = name.lower() + "." + re.sub(r"\\(.)", r"\1", sub)
    else:
        name = name.lower()  # [section.sub] (the old form) is case-insensitive throughout
    return name, rest[match.end():]


def _config_value(rest: str, lines: list[str], number: int, where: Path) -> tuple[str, int]:
    out: list[str] = []
    kept = 0  # length of out up to its last character that is not unquoted trailing white space
    quoted = False
    index = 0
    while True:
        if index >= len(rest):
            if quoted:
                raise GitReadError(f"{_shown(where)}, line {number}: a quoted value does not end")
            break
        char = rest[index]
        index += 1
        if char == "\\":
            if index >= len(rest) or rest[index:] == "\r":
                if number >= len(lines):
                    break
                rest, index = lines[number], 0  # a backslash at the end of a line continues the value
                number += 1
                continue
            escaped = rest[index]
            index += 1
            if escaped not in '"\\ntb':
                raise GitReadError(f"{_shown(where)}, line {number}: unknown escape \\{_shown(escaped)} in a value")
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(escaped, escaped))
            kept = len(out)
        elif char == '"':
            quoted = not quoted
            kept = len(out)
        elif not quoted and char in "#;":
            break
        elif not quoted and char in " \t\r":
            if out:
                out.append(char)
        else:
            out.append(char)
            kept = len(out)
    return "".join(out[:kept]), number


def _config(common_dir: Path) -> dict[tuple[str, str], str]:
    data = _read_file(common_dir, "config", MAX_CONFIG)
    if data is None:
        return {}
    return _parse_config(data.decode("utf-8", "surrogateescape"), common_dir / "config")


def config_value(common_dir: Path, section: str, key: str) -> str | None:
    """The value of section.key in <common_dir>/config (the last one given), or None. section may name a
    subsection ("remote.origin"); section and key are case-insensitive, a subsection is not."""
    name, dot, sub = section.partition(".")
    wanted = f"{name.lower()}{dot}{sub}"
    return _config(common_dir).get((wanted, key.lower()))


def config_file_value(path: Path, section: str, key: str) -> str | None:
    """section.key of any git config file (the user's own ~/.gitconfig), read the same careful way; no includes."""
    data = _read_file(path.parent, path.name, MAX_CONFIG)
    if data is None:
        return None
    name, dot, sub = section.partition(".")
    return _parse_config(data.decode("utf-8", "surrogateescape"), path).get((f"{name.lower()}{dot}{sub}", key.lower()))


def object_format(common_dir: Path) -> str:
    """ "sha1" or "sha256": the repository's hash (extensions.objectformat). A repository whose refs are in
    the reftable format is refused: agentbox reads only loose refs and packed-refs."""
    values = _config(common_dir)
    storage = values.get(("extensions", "refstorage"), "files").lower()
    if storage != "files":
        raise GitReadError(f"{_shown(common_dir / 'config')}: this repository keeps its refs in the "
                           f"{_shown(storage)} format (extensions.refstorage), which agentbox cannot read",
                           hint="agentbox reads refs stored as files; `git refs migrate --ref-format=files` "
                                "converts a repository back.")
    fmt = values.get(("extensions", "objectformat"), "sha1").lower()
    if fmt not in HASH_LEN:
        raise GitReadError(f"{_shown(common_dir / 'config')}: unknown object format {_shown(fmt)} "
                           "(extensions.objectformat); agentbox knows sha1 and sha256")
    return fmt


# --- refs -------------------------------------------------------------------------------------------------


def _valid_ref_name(name: str) -> bool:
    if name == "HEAD" or re.fullmatch(r"[A-Z][A-Z0-9_]*_HEAD", name):
        return True
    if not name.startswith("refs/") or name.endswith(("/", ".", ".lock")) or ".." in name or "@{" in name:
        return False
    if any(char in name for char in " ~^:?*[\\\x7f") or any(ord(char) < 0x20 for char in name):
        return False
    return all(part and not part.startswith(".") for part in name.split("/"))


def _per_worktree(name: str) -> bool:
    return "/" not in name or name.startswith(("refs/bisect/", "refs/worktree/", "refs/rewritten/"))


def _packed_ref(common_dir: Path, name: str) -> str | None:
    data = _read_file(common_dir, "packed-refs", MAX_PACKED_REFS)
    if data is None:
        return None
    wanted = os.fsencode(name)
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line or line[:1] in (b"#", b"^"):
            continue
        oid, sep, refname = line.partition(b" ")
        if not sep:
            raise GitReadError(f"{_shown(common_dir / 'packed-refs')}, line {number}: not a line of packed refs")
        if refname.rstrip(b"\r") == wanted:
            return _oid_or_error(oid.decode("ascii", "replace"), common_dir / "packed-refs")
    return None


def _oid_or_error(text: str, where: Path) -> str:
    if not _HEX.fullmatch(text):
        raise GitReadError(f"{_shown(where)} holds {_shown(text[:80])!s}, not an object id")
    return text


def ref(git_dir: Path, common_dir: Path, name: str) -> str | None:
    """The object id `name` (e.g. "HEAD", "refs/heads/main") points to, following symbolic refs (at most
    5 deep); None when it or the ref it points to does not exist (an unborn branch).

    Per-worktree refs (HEAD, refs/bisect/..., refs/worktree/...) are read from git_dir; the others from
    common_dir, loose first, then packed-refs.
    """
    for _ in range(MAX_SYMREF_DEPTH + 1):
        if not _valid_ref_name(name):
            raise GitReadError(f"{_shown(name)} is not a ref name agentbox reads",
                               hint=f"It was looked up in {_shown(git_dir)}.")
        base = git_dir if _per_worktree(name) else common_dir
        data = _read_file(base, name, MAX_REF_FILE)
        if data is None:
            if _per_worktree(name):
                return None
            return _packed_ref(common_dir, name)
        text = data.decode("utf-8", "surrogateescape").strip()
        if text.startswith("ref:"):
            name = text[4:].strip()
            continue
        return _oid_or_error(text, base / name)
    raise GitReadError(f"{_shown(git_dir / 'HEAD')}: symbolic refs nest more than {MAX_SYMREF_DEPTH} deep")


def head(git_dir: Path, common_dir: Path) -> str | None:
    """HEAD's commit id, or None on an unborn branch."""
    return ref(git_dir, common_dir, "HEAD")


# --- the index --------------------------------------------------------------------------------------------


class IndexEntry(NamedTuple):
    path: str  # decoded with surrogateescape (os.fsdecode), so os.fsencode gives the bytes back
    mode: int
    oid: str
    stage: int


_ENTRY_HEAD = 40  # ctime, mtime, dev, ino, mode, uid, gid, size: ten 32-bit fields
_INDEX_EXTENDED = 0x4000
_NAME_MASK = 0xFFF


# A path git refuses (verify_path), among paths each between NULs: empty, absolute, ending in "/", with "//",
# or with a component ".", ".." or ".git" (any case). Every match starts at a NUL or "/": re scans for those fast.
_BAD_PATHS = lazyre.compile(rb"[\0/](?:\.(?:\.|[gG][iI][tT])?[/\0]|[/\0])")
_BAD_MARKS = (b"\0\0", b"\0/", b"/\0", b"//", b"/.", b"\0.")  # one of them is in every match


def read_index(index_file: Path, limit: int, fmt: str = "sha1") -> list[IndexEntry]:
    """The entries of a git index file of at most `limit` bytes: versions 2, 3 (extended flags) and 4
    (prefix-compressed paths), its trailing checksum verified (`fmt`'s hash; an all-zero one, which
    `index.skipHash` writes, is taken as none). Extensions are skipped; a split index (the "link"
    extension) or a sparse index (folder entries, "sdir") raises GitReadError saying "split index" or
    "sparse index", for the caller to fall back on something else.
    """
    data = _read_file(index_file.parent, index_file.name, limit)
    if data is None:
        raise GitReadError(f"{_shown(index_file)} does not exist")
    hash_len = HASH_LEN[fmt]

    def corrupt(what: str) -> GitReadError:
        return GitReadError(f"{_shown(index_file)} is not a git index agentbox can read: {what}")

    if len(data) < 12 + hash_len or data[:4] != b"DIRC":
        raise corrupt("it does not start with the index signature")
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3, 4):
        raise corrupt(f"version {version} (agentbox reads 2, 3 and 4)")
    body, trailer = data[:-hash_len], data[-hash_len:]
    if trailer != bytes(hash_len) and hashlib.new(fmt, body).digest() != trailer:
        raise corrupt(f"its {fmt} checksum does not match its content")
    # Tens of thousands of small tuples would set off the cyclic garbage collector again and again (none
    # of them can form a cycle): paused, a 50,000-entry index reads in half the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _index_entries(body, version, count, hash_len, corrupt)
    finally:
        if collecting:
            gc.enable()


def _index_entries(body: bytes, version: int, count: int, hash_len: int,
                   corrupt: Callable[[str], GitReadError]) -> list[IndexEntry]:
    end = len(body)
    paths: list[bytes] = []
    fields: list[tuple[int, bytes, int]] = []  # (mode, raw id, flags) of each entry
    add_path = paths.append
    add_fields = fields.append
    unpack = struct.Struct(f">24xI12x{hash_len}sH").unpack_from
    find = body.find
    pos = 12
    if version == 4:
        previous = b""
        for number in range(1, count + 1):
            if pos + _ENTRY_HEAD + hash_len + 2 > end:
                raise corrupt(f"it ends inside entry {number} of {count}")
            found = unpack(body, pos)
            name_at = pos + _ENTRY_HEAD + hash_len + (4 if found[2] & _INDEX_EXTENDED else 2)
            strip, name_at = _offset_varint(body, name_at, corrupt)
            nul = find(b"\0", name_at)
            if nul < 0 or strip > len(previous):
                raise corrupt(f"entry {number} has no valid path")
            previous = previous[:len(previous) - strip] + body[name_at:nul]
            add_path(previous)
            add_fields(found)
            pos = nul + 1
    else:
        # The hot loop of a large index: bounds are left to struct and indexing, which raise past the end.
        head = _ENTRY_HEAD + hash_len + 2
        extended = _INDEX_EXTENDED if version == 3 else 0
        try:
            for _ in range(count):
                found = unpack(body, pos)
                flags = found[2]
                name_at = pos + head
                if flags & _INDEX_EXTENDED:
                    if not extended:
                        raise corrupt("an entry has extended flags in a version 2 index")
                    name_at += 2
                length = flags & _NAME_MASK
                if length < _NAME_MASK:
                    nul = name_at + length
                else:
                    nul = find(b"\0", name_at)
                    if nul < 0:
                        raise IndexError
                if body[nul]:
                    raise IndexError
                add_path(body[name_at:nul])
                add_fields(found)
                pos += (nul - pos + 8) & ~7  # 1 to 8 NULs pad the entry to a multiple of 8 bytes
        except (struct.error, IndexError):
            raise corrupt(f"entry {len(paths) + 1} of {count} is cut off or has no valid path") from None
    if pos > end:
        raise corrupt("its last entry runs past its end")
    sparse = False
    while pos + 8 <= end:
        signature = body[pos:pos + 4]
        (size,) = struct.unpack_from(">I", body, pos + 4)
        if signature == b"link":
            raise corrupt("it is a split index (core.splitIndex); agentbox reads only whole ones")
        if signature == b"sdir":
            sparse = True
        pos += 8 + size
    if pos != end:
        raise corrupt("its extensions do not end where its checksum starts")
    if sparse or any(stat.S_ISDIR(mode) for mode in {mode for mode, _, _ in fields}):
        raise corrupt("it is a sparse index (index.sparse), whose folders hide their files; "
                      "agentbox reads only whole ones (a split index is refused the same way)")
    if not paths:
        return []
    # All paths at once, each between NULs (no path holds one): a few substring searches, at most one
    # regular expression and one decode instead of 50,000 of each keep a large index well under 100 ms.
    framed = b"\0".join([b"", *paths, b""])
    bad = _BAD_PATHS.search(framed) if any(mark in framed for mark in _BAD_MARKS) else None
    if bad is not None:
        number = framed.count(b"\0", 0, bad.start() + 1)
        raise corrupt(f"entry {number} has the path {_shown(os.fsdecode(paths[number - 1]))}, which git refuses")
    names = framed.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()).split("\0")[1:-1]
    new = tuple.__new__
    return [new(IndexEntry, (name, mode, raw.hex(), (flags >> 12) & 3))
            for name, (mode, raw, flags) in zip(names, fields, strict=True)]


def _offset_varint(data: bytes, pos: int, corrupt: Callable[[str], GitReadError]) -> tuple[int, int]:
    """git's offset varint (each continuation adds one before shifting), as in v4 paths and OFS_DELTA."""
    value = -1
    for _ in range(10):
        if pos >= len(data):
            break
        byte = data[pos]
        pos += 1
        value = ((value + 1) << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, pos
    raise corrupt("a number in it is malformed")


# --- objects ----------------------------------------------------------------------------------------------


def _check_oid(oid: str, fmt: str) -> None:
    if len(oid) != HASH_LEN[fmt] * 2 or not _HEX.fullmatch(oid):
        raise GitReadError(f"{_shown(oid[:80])} is not a {fmt} object id")


def _object_hash(fmt: str, kind: str, content: bytes) -> str:
    digest = hashlib.new(fmt, f"{kind} {len(content)}\0".encode())
    digest.update(content)
    return digest.hexdigest()


class _Pack:
    """One objects/pack/pack-*.idx (version 2) with its .pack, read with pread on open descriptors."""

    def __init__(self, common_dir: Path, stem: str, hash_len: int) -> None:
        self.name = common_dir / "objects" / "pack" / f"{stem}.pack"
        self.idx_name = common_dir / "objects" / "pack" / f"{stem}.idx"
        self.hash_len = hash_len
        self.idx_fd = -1
        self.pack_fd = -1
        idx = _open_file(common_dir, f"objects/pack/{stem}.idx", MAX_PACK_FILE)
        if idx is None:
            raise GitReadError(f"{_shown(self.idx_name)} went away while agentbox read the pack folder")
        self.idx_fd, idx_size = idx
        pack = _open_file(common_dir, f"objects/pack/{stem}.pack", MAX_PACK_FILE)
        if pack is None:
            self.close()
            raise FileNotFoundError(self.name)
        self.pack_fd, self.pack_size = pack
        head = os.pread(self.idx_fd, 8 + 256 * 4, 0)
        if len(head) != 8 + 256 * 4 or head[:8] != b"\xfftOc\x00\x00\x00\x02":
            self.close()
            raise GitReadError(f"{_shown(self.idx_name)} is not a version 2 pack index")
        self.fanout = struct.unpack_from(">256I", head, 8)
        self.count = self.fanout[255]
        self.oids_at = 8 + 256 * 4
        self.offsets_at = self.oids_at + self.count * (hash_len + 4)
        self.large_at = self.offsets_at + self.count * 4
        ordered = all(a <= b for a, b in zip(self.fanout, self.fanout[1:], strict=False))
        if self.large_at + 2 * hash_len > idx_size or not ordered:
            self.close()
            raise GitReadError(f"{_shown(self.idx_name)} is not a pack index agentbox can read: "
                               "its tables do not fit in it")
        if os.pread(self.pack_fd, 4, 0) != b"PACK":
            self.close()
            raise GitReadError(f"{_shown(self.name)} is not a pack file")

    def close(self) -> None:
        for fd in (self.idx_fd, self.pack_fd):
            if fd >= 0:
                os.close(fd)
        self.idx_fd = self.pack_fd = -1

    def offset(self, raw: bytes) -> int | None:
        """The offset of the object in the pack, or None when this pack does not have it."""
        first = raw[0]
        low = self.fanout[first - 1] if first else 0
        high = self.fanout[first]
        size = self.hash_len
        while low < high:
            middle = (low + high) // 2
            found = os.pread(self.idx_fd, size, self.oids_at + middle * size)
            if found == raw:
                (value,) = struct.unpack(">I", os.pread(self.idx_fd, 4, self.offsets_at + middle * 4))
                if value & 0x80000000:
                    large = os.pread(self.idx_fd, 8, self.large_at + (value & 0x7FFFFFFF) * 8)
                    if len(large) != 8:
                        raise GitReadError(f"{_shown(self.idx_name)}: a large offset lies past its end")
                    (value,) = struct.unpack(">Q", large)
                return int(value)
            if found < raw:
                low = middle + 1
            else:
                high = middle
        return None


class ObjectReader:
    """Objects of a repository, by id, each verified against its id: loose objects and packs (index
    version 2; deltas by offset and by id, chains up to MAX_DELTA_DEPTH deep).

    objects/info/alternates is never followed: it names other object folders anywhere on the host, and
    what the agent writes there must not widen what agentbox reads. An object only reachable through it
    is missing. At most MAX_PACKS packs are read; an object bigger than max_size is refused.
    Use it as a context manager (or call close()) to release the pack descriptors.
    """

    def __init__(self, common_dir: Path, fmt: str, max_size: int = MAX_OBJECT) -> None:
        self._packs: list[_Pack] | None = None
        if fmt not in HASH_LEN:
            raise ValueError(f"object format {fmt!r}: sha1 or sha256")
        self.common_dir = common_dir
        self.fmt = fmt
        self.hash_len = HASH_LEN[fmt]
        self.max_size = max_size
        self._bases: OrderedDict[tuple[int, int], tuple[str, bytes]] = OrderedDict()
        self._base_bytes = 0

    def __enter__(self) -> ObjectReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        for pack in self._packs or ():
            pack.close()
        self._packs = None
        self._bases.clear()
        self._base_bytes = 0

    def read(self, oid: str) -> tuple[str, bytes]:
        """(type, content) of the object `oid`; GitReadError when it is missing, unreadable, too big, or does
        not hash to its id."""
        _check_oid(oid, self.fmt)
        found = self._read_unverified(oid)
        if found is None:
            raise GitReadError(f"object {oid} is not in {_shown(self.common_dir / 'objects')}",
                               hint="agentbox reads the repository's own objects only (never alternates).")
        kind, content, where = found
        if _object_hash(self.fmt, kind, content) != oid:
            raise GitReadError(f"{_shown(where)} does not hold what its id says: object {oid} hashes to "
                               "something else (altered or forged)")
        return kind, content

    def _read_unverified(self, oid: str) -> tuple[str, bytes, Path] | None:
        raw = bytes.fromhex(oid)
        for number, pack in enumerate(self._load_packs()):
            offset = pack.offset(raw)
            if offset is not None:
                kind, content = self._packed(number, offset)
                return kind, content, pack.name
        loose = self._loose(oid)
        if loose is None:
            return None
        kind, content = loose
        return kind, content, self.common_dir / "objects" / oid[:2] / oid[2:]

    def _loose(self, oid: str) -> tuple[str, bytes] | None:
        rel = f"objects/{oid[:2]}/{oid[2:]}"
        where = self.common_dir / rel
        data = _read_file(self.common_dir, rel, self.max_size + self.max_size // 64 + 1024)
        if data is None:
            return None
        inflater = zlib.decompressobj()
        try:
            header = inflater.decompress(data, 64)
            nul = header.find(b"\0")
            kind, _, size_text = header[:nul].decode("ascii").partition(" ")
            size = int(size_text) if size_text.isdigit() else -1
        except (zlib.error, UnicodeDecodeError) as err:
            raise GitReadError(f"{_shown(where)} is not a loose git object ({err})") from err
        if nul < 0 or kind not in OBJECT_TYPES or size < 0:
            raise GitReadError(f"{_shown(where)} is not a loose git object (no valid header)")
        if size > self.max_size:
            raise GitReadError(f"{_shown(where)}: object {oid} is {size} bytes, more than the {self.max_size} "
                               "agentbox reads")
        try:
            rest = header[nul + 1:] + inflater.decompress(inflater.unconsumed_tail, size + 1)
        except zlib.error as err:
            raise GitReadError(f"{_shown(where)} is not a loose git object ({err})") from err
        if len(rest) != size or not inflater.eof:
            raise GitReadError(f"{_shown(where)}: the object's size is not the {size} bytes its header says")
        return kind, rest

    def _load_packs(self) -> list[_Pack]:
        if self._packs is not None:
            return self._packs
        packs: list[_Pack] = []
        self._packs = packs
        try:
            fd = os.open(self.common_dir, _DIR_FLAGS)
        except OSError:
            return packs
        try:
            names = self._pack_names(fd)
        finally:
            os.close(fd)
        if len(names) > MAX_PACKS:
            raise GitReadError(f"{_shown(self.common_dir / 'objects' / 'pack')} holds {len(names)} packs, more "
                               f"than the {MAX_PACKS} agentbox reads", hint="`git gc` in the VM repacks them.")
        for stem in sorted(names):
            try:
                packs.append(_Pack(self.common_dir, stem, self.hash_len))
            except FileNotFoundError:
                continue  # an .idx without its .pack: git ignores it too
        return packs

    def _pack_names(self, common_fd: int) -> list[str]:
        """Stems of objects/pack/*.idx; listing the folder through descriptors, not following links."""
        fd = common_fd
        opened: list[int] = []
        try:
            for part in ("objects", "pack"):
                try:
                    fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as err:
                    if err.errno == errno.ENOENT:
                        return []
                    raise GitReadError(f"{_shown(self.common_dir / 'objects' / 'pack')} cannot be opened as a "
                                       f"folder (not following links): {err.strerror}") from err
                opened.append(fd)
            return [name[:-4] for name in os.listdir(fd) if name.startswith("pack-") and name.endswith(".idx")]
        finally:
            for each in opened:
                os.close(each)

    def _packed(self, number: int, offset: int) -> tuple[str, bytes]:
        """(type, content) of the object at offset in pack `number`, deltas applied."""
        assert self._packs is not None
        pack = self._packs[number]
        chain: list[tuple[tuple[int, int], int, int]] = []  # (where, data offset, delta size) of each delta
        at = (number, offset)
        while True:
            cached = self._bases.get(at)
            if cached is not None:
                self._bases.move_to_end(at)
                kind, content = cached
                break
            pack = self._packs[at[0]]
            code, size, data_at, base = self._entry_header(pack, at[1])
            if size > self.max_size:
                raise GitReadError(f"{_shown(pack.name)}: an object at offset {at[1]} is {size} bytes, more "
                                   f"than the {self.max_size} agentbox reads")
            if code in _PACK_TYPES:
                kind, content = _PACK_TYPES[code], self._inflate(pack, data_at, size)
                break
            chain.append((at, data_at, size))
            if len(chain) > MAX_DELTA_DEPTH:
                raise GitReadError(f"{_shown(pack.name)}: a delta chain is deeper than {MAX_DELTA_DEPTH}")
            if code == _OFS_DELTA:
                at = (at[0], base)
                continue
            base_oid = os.pread(pack.pack_fd, self.hash_len, base).hex()
            located = self._locate(base_oid)
            if located is not None:
                at = located
                continue
            loose = self._loose(base_oid)
            if loose is None:
                raise GitReadError(f"{_shown(pack.name)}: the delta base {base_oid} is missing")
            kind, content = loose
            break
        for where, data_at, size in reversed(chain):
            delta = self._inflate(self._packs[where[0]], data_at, size)
            content = _apply_delta(content, delta, self.max_size, self._packs[where[0]].name)
            self._remember(where, kind, content)
        return kind, content

    def _locate(self, oid: str) -> tuple[int, int] | None:
        raw = bytes.fromhex(oid)
        for number, pack in enumerate(self._load_packs()):
            offset = pack.offset(raw)
            if offset is not None:
                return number, offset
        return None

    def _remember(self, where: tuple[int, int], kind: str, content: bytes) -> None:
        if len(content) > BASE_CACHE_BYTES // 4 or where in self._bases:
            return
        self._bases[where] = (kind, content)
        self._base_bytes += len(content)
        while self._base_bytes > BASE_CACHE_BYTES:
            _, (_, dropped) = self._bases.popitem(last=False)
            self._base_bytes -= len(dropped)

    def _entry_header(self, pack: _Pack, offset: int) -> tuple[int, int, int, int]:
        """(type code, size, where the zlib data starts, base offset or where the base id is) of an entry."""
        if offset < 12 or offset >= pack.pack_size:
            raise GitReadError(f"{_shown(pack.name)}: an object offset {offset} lies outside the pack")
        head = os.pread(pack.pack_fd, 32, offset)
        if not head:
            raise GitReadError(f"{_shown(pack.name)}: the pack ends at offset {offset}")
        byte = head[0]
        code = (byte >> 4) & 7
        size = byte & 0x0F
        shift = 4
        pos = 1
        while byte & 0x80:
            if pos >= len(head) or shift > 60:
                raise GitReadError(f"{_shown(pack.name)}: a malformed object header at offset {offset}")
            byte = head[pos]
            pos += 1
            size |= (byte & 0x7F) << shift
            shift += 7
        base = 0
        if code == _OFS_DELTA:
            def corrupt(what: str) -> GitReadError:
                return GitReadError(f"{_shown(pack.name)}: a malformed delta at offset {offset} ({what})")
            back, pos = _offset_varint(head, pos, corrupt)
            base = offset - back
            if back <= 0 or base < 12:
                raise corrupt("its base lies outside the pack")
        elif code == _REF_DELTA:
            base = offset + pos
            pos += self.hash_len
        elif code not in _PACK_TYPES:
            raise GitReadError(f"{_shown(pack.name)}: an object of unknown type {code} at offset {offset}")
        return code, size, offset + pos, base

    def _inflate(self, pack: _Pack, at: int, size: int) -> bytes:
        inflater = zlib.decompressobj()
        out: list[bytes] = []
        got = 0
        step = min(size + 512, 1 << 20)
        try:
            while not inflater.eof:
                chunk = os.pread(pack.pack_fd, step, at)
                if not chunk:
                    break
                at += len(chunk)
                step = 1 << 20
                while chunk and not inflater.eof and got <= size:
                    piece = inflater.decompress(chunk, size + 1 - got)
                    got += len(piece)
                    out.append(piece)
                    chunk = inflater.unconsumed_tail
                if got > size:
                    break
        except zlib.error as err:
            raise GitReadError(f"{_shown(pack.name)}: compressed data at offset {at} is damaged ({err})") from err
        if got != size or not inflater.eof:
            raise GitReadError(f"{_shown(pack.name)}: an object near offset {at} is not the {size} bytes its "
                               "header says")
        return b"".join(out)


def _delta_size(delta: bytes, pos: int, where: Path) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(delta) or shift > 63:
            raise GitReadError(f"{_shown(where)}: a malformed delta (its header)")
        byte = delta[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _apply_delta(base: bytes, delta: bytes, max_size: int, where: Path) -> bytes:
    source_size, pos = _delta_size(delta, 0, where)
    target_size, pos = _delta_size(delta, pos, where)
    if source_size != len(base):
        raise GitReadError(f"{_shown(where)}: a delta expects a base of {source_size} bytes, not {len(base)}")
    if target_size > max_size:
        raise GitReadError(f"{_shown(where)}: a delta makes an object of {target_size} bytes, more than the "
                           f"{max_size} agentbox reads")
    out = bytearray()
    source = memoryview(base)
    end = len(delta)
    try:
        while pos < end:
            op = delta[pos]
            pos += 1
            if op & 0x80:  # copy from the base: which offset and size bytes follow is in op's low bits
                offset = length = 0
                if op & 0x01:
                    offset = delta[pos]
                    pos += 1
                if op & 0x02:
                    offset |= delta[pos] << 8
                    pos += 1
                if op & 0x04:
                    offset |= delta[pos] << 16
                    pos += 1
                if op & 0x08:
                    offset |= delta[pos] << 24
                    pos += 1
                if op & 0x10:
                    length = delta[pos]
                    pos += 1
                if op & 0x20:
                    length |= delta[pos] << 8
                    pos += 1
                if op & 0x40:
                    length |= delta[pos] << 16
                    pos += 1
                length = length or 0x10000
                if offset + length > source_size:
                    raise GitReadError(f"{_shown(where)}: a delta copies from past the end of its base")
                out += source[offset:offset + length]
            elif op:
                if pos + op > end:
                    raise GitReadError(f"{_shown(where)}: a delta ends inside an insert")
                out += delta[pos:pos + op]
                pos += op
            else:
                raise GitReadError(f"{_shown(where)}: a delta holds the reserved instruction 0")
            if len(out) > target_size:
                break
    except IndexError:
        raise GitReadError(f"{_shown(where)}: a delta ends inside a copy instruction") from None
    if len(out) != target_size:
        raise GitReadError(f"{_shown(where)}: a delta makes {len(out)} bytes, not the {target_size} it says")
    return bytes(out)


# --- trees and commits ------------------------------------------------------------------------------------


_MODES = {b"100644", b"100755", b"120000", b"40000", b"160000", b"100664", b"100640"}


_TREE_ENTRY = {
    fmt: lazyre.compile(rb"([0-7]{5,6}) ([^\0/]+)\0(.{%d})" % length, re.DOTALL) for fmt, length in HASH_LEN.items()
}


def tree_entries(content: bytes, fmt: str) -> list[tuple[str, str, str]]:
    """(mode as git writes it, e.g. "100644" or "40000"; name; object id) of each entry of a tree object.
    Names git refuses ("", ".", "..", ".git", anything with "/") are an error."""
    entries: list[tuple[str, str, str]] = []
    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    pos = 0
    for match in _TREE_ENTRY[fmt].finditer(content):
        if match.start() != pos:
            break
        mode, name, raw = match.groups()
        if mode not in _MODES:
            raise GitReadError(f"a tree object has an entry of unknown mode {_shown(mode.decode())}")
        if name[:1] == b"." and name.lower() in (b".", b"..", b".git"):
            raise GitReadError(f"a tree object has an entry named {_shown(os.fsdecode(name))}, which git refuses")
        entries.append((mode.decode(), name.decode(encoding, errors), raw.hex()))
        pos = match.end()
    if pos != len(content):
        raise GitReadError(f"a tree object is malformed (entry {len(entries) + 1})")
    return entries


def commit_tree(content: bytes) -> str:
    """The tree id of a commit object (its first line)."""
    match = re.match(rb"tree ([0-9a-f]{64}|[0-9a-f]{40})\n", content)
    if not match:
        raise GitReadError("a commit object does not start with its tree's id")
    return match.group(1).decode()


def read_tree_recursive(reader: ObjectReader, tree_oid: str, fmt: str,
                        max_entries: int = MAX_TREE_ENTRIES) -> dict[str, tuple[str, str]]:
    """path -> (mode, object id) of every entry that is not a tree (files, links, gitlinks) below tree_oid,
    paths joined with "/". Every tree read is verified against its id; a subtree that is shared is read
    once. More than max_entries entries, or folders nested more than MAX_TREE_DEPTH deep, is an error."""
    found: dict[str, tuple[str, str]] = {}
    parsed: dict[str, list[tuple[str, str, str]]] = {}
    pending: list[tuple[str, str, int]] = [("", tree_oid, 0)]
    seen = 0
    while pending:
        prefix, oid, depth = pending.pop()
        if depth > MAX_TREE_DEPTH:
            raise GitReadError(f"tree {tree_oid} nests folders more than {MAX_TREE_DEPTH} deep")
        entries = parsed.get(oid)
        if entries is None:
            kind, content = reader.read(oid)
            if kind != "tree":
                raise GitReadError(f"object {oid} ({_shown(prefix) or 'the top'}) is a {kind}, not a tree")
            entries = parsed[oid] = tree_entries(content, fmt)
        seen += len(entries)
        if seen > max_entries:
            raise GitReadError(f"tree {tree_oid} has more than {max_entries} entries")
        for mode, name, child in entries:
            path = f"{prefix}{name}"
            if mode == "40000":
                pending.append((f"{path}/", child, depth + 1))
            else:
                found[path] = (mode, child)
    return found
