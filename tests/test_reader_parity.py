"""The two no-follow readers of what a VM wrote, held to one table: agentbox.vmread (the laptop's one reader) and
the standalone copy in agentbox/remote/far.py (the far end runs alone on a remote host with the standard library,
so it keeps its own). Every hostile file below goes through both readers by a thin adapter each, and both must
give the row's outcome, so neither copy drifts weaker than the other.

Each row builds its files in `box` (the VM's folder) and `outside` (what a link would reach: a secret file and a
secret folder), runs one operation (read a named file with a cap, open or create a folder path, remove an entry)
and states the outcome. After every row the outside is untouched, a read took at most cap+1 bytes from the file
(this process's read count in /proc/self/io), and no operation took long (a FIFO never blocks: a timer opens every
FIFO in the box for writing after a few seconds, which would release a reader stuck on one, and the row then fails
on time).
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from agentbox import vmread
from agentbox.remote import far

pytestmark = pytest.mark.timeout(60)

CAP = 16
SECRET = b"the host's secret 4b1d"
BLOCK_SEC = 3.0
READ_SLACK = 64 * 1024  # what else this process may read while a reader runs (the test runner's own pipe)

# Outcomes, the same words for both readers.
MISSING = "missing"  # absent (vmread: Refused.why MISSING; far: Missing)
REFUSED = "refused"  # a link, not a regular file, replaced meanwhile, not a single name: not taken
TOO_LARGE = "too large"  # more than the cap (vmread refuses it; far hands back cap+1 bytes and its caller cuts)


# -- the two readers, one adapter each ---------------------------------------------------------------


class Vmread:
    name = "vmread"

    def read(self, parent: int, name: str, cap: int) -> bytes | str:
        try:
            return vmread.read_checked(parent, name, cap)[0]
        except vmread.Refused as refused:
            return {vmread.MISSING: MISSING, vmread.TOO_LARGE: TOO_LARGE}.get(refused.why, REFUSED)

    def open(self, root: Path, parts: list[str], create: bool) -> list[str] | str:
        try:
            with vmread.folder(root, *parts, create=create) as fd:
                return sorted(os.listdir(fd))
        except FileNotFoundError:
            return MISSING
        except OSError:
            return REFUSED

    def remove(self, parent: int, name: str) -> bool:
        return vmread.remove(parent, name)


class Far:
    name = "far"

    def read(self, parent: int, name: str, cap: int) -> bytes | str:
        try:
            data, _ = far.read_regular(parent, name, cap)
        except far.Missing:
            return MISSING
        except far.Refused:
            return REFUSED
        if len(data) > cap:
            assert len(data) == cap + 1, "the far end read more than cap+1 bytes"
            return TOO_LARGE
        return data

    def open(self, root: Path, parts: list[str], create: bool) -> list[str] | str:
        try:
            fd = far.open_path(str(root), parts, create)
        except FileNotFoundError:
            return MISSING
        except OSError:
            return REFUSED
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def remove(self, parent: int, name: str) -> bool:
        return far.remove(parent, name)


READERS = [Vmread(), Far()]


# -- the hostile files ---------------------------------------------------------------------------------


class Scene(NamedTuple):
    box: Path
    outside: Path


class Read(NamedTuple):
    name: str
    cap: int = CAP


class Open(NamedTuple):
    parts: list[str]
    create: bool = False


class Remove(NamedTuple):
    name: str


class Case(NamedTuple):
    id: str
    build: Callable[[Scene], None]
    op: Read | Open | Remove
    expected: Any  # bytes / MISSING / REFUSED / TOO_LARGE; a listing for Open; (returned, still there) for Remove
    swap: Callable[[Scene], None] | None = None  # done between the reader's look (lstat) and its open


def write(path: Path, data: bytes = b"the VM's bytes") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def link(target: Path | str, at: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, at)


def fifo(at: Path) -> None:
    os.mkfifo(at)


def device(at: Path) -> None:
    try:
        os.mknod(at, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: endless bytes
    except PermissionError:
        pytest.skip("a device node cannot be made here (needs CAP_MKNOD)")


def socket_file(at: Path) -> None:
    if len(str(at)) > 100:
        pytest.skip("the folder's path is too long for a Unix socket")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(at))
    server.close()


def sparse(at: Path, size: int) -> None:
    write(at, b"")
    os.truncate(at, size)


def nested(at: Path, depth: int) -> None:
    write(at.joinpath(*["d"] * depth) / "f")


def nothing(scene: Scene) -> None:
    pass


def replace_with(make: Callable[[Scene, Path], None]) -> Callable[[Scene], None]:
    def swap(scene: Scene) -> None:
        (scene.box / "f").rename(scene.box / "f.old")  # kept, so the new file cannot reuse its inode number
        make(scene, scene.box / "f")
    return swap


CASES = [
    # reading a named file, cap 16 bytes
    Case("regular file", lambda s: write(s.box / "f", b"hello"), Read("f"), b"hello"),
    Case("exactly the cap", lambda s: write(s.box / "f", b"x" * CAP), Read("f"), b"x" * CAP),
    Case("one byte over the cap", lambda s: write(s.box / "f", b"x" * (CAP + 1)), Read("f"), TOO_LARGE),
    Case("a MiB over the cap", lambda s: write(s.box / "f", b"x" * (1 << 20)), Read("f"), TOO_LARGE),
    Case("sparse 1 GiB file", lambda s: sparse(s.box / "f", 1 << 30), Read("f", 1 << 20), TOO_LARGE),
    Case("absent", nothing, Read("f"), MISSING),
    Case("link to a file outside", lambda s: link(s.outside / "secret", s.box / "f"), Read("f"), REFUSED),
    Case("link to a file inside", lambda s: (write(s.box / "real"), link("real", s.box / "f")), Read("f"), REFUSED),
    Case("dangling link", lambda s: link(s.outside / "nowhere", s.box / "f"), Read("f"), REFUSED),
    Case("link to itself", lambda s: link("f", s.box / "f"), Read("f"), REFUSED),
    Case("FIFO", lambda s: fifo(s.box / "f"), Read("f"), REFUSED),
    Case("folder where a file is expected", lambda s: (s.box / "f").mkdir(), Read("f"), REFUSED),
    Case("device node", lambda s: device(s.box / "f"), Read("f"), REFUSED),
    Case("Unix socket", lambda s: socket_file(s.box / "f"), Read("f"), REFUSED),
    # A hard link is a regular file: both readers take it. The VM can only link what its own mount shows
    # (a link across mounts fails with EXDEV), so the bytes are the VM's either way.
    Case("hard link", lambda s: (write(s.box / "real", b"linked"), os.link(s.box / "real", s.box / "f")),
         Read("f"), b"linked"),
    Case("names the VM can make", lambda s: write(s.box / "-\n\x1b[2J...", b"odd"), Read("-\n\x1b[2J..."), b"odd"),
    Case("non-UTF-8 name", lambda s: write(Path(os.fsdecode(bytes(s.box) + b"/\xff")), b"raw"),
         Read(os.fsdecode(b"\xff")), b"raw"),
    # a name is one entry of the folder: never a path out of it or through a link
    Case("'..' as the name", nothing, Read(".."), REFUSED),
    Case("'../' to a file outside", nothing, Read("../outside/secret"), REFUSED),
    Case("absolute name", nothing, Read("/etc/hostname"), REFUSED),
    Case("a path through a linked folder", lambda s: link(s.outside / "secretdir", s.box / "d"),
         Read("d/secret"), REFUSED),
    # swapped between the reader's look and its open
    Case("swapped for a link to a file outside", lambda s: write(s.box / "f"), Read("f"), REFUSED,
         swap=replace_with(lambda s, at: link(s.outside / "secret", at))),
    Case("swapped for another regular file", lambda s: write(s.box / "f"), Read("f"), REFUSED,
         swap=replace_with(lambda s, at: write(at, b"other"))),
    Case("swapped for a FIFO", lambda s: write(s.box / "f"), Read("f"), REFUSED, swap=replace_with(lambda s, at: fifo(at))),
    # opening a folder path, one component at a time
    Case("a folder", lambda s: write(s.box / "sub" / "f"), Open(["sub"]), ["f"]),
    Case("a folder path", lambda s: write(s.box / "sub" / "in" / "f"), Open(["sub", "in"]), ["f"]),
    Case("link to a folder outside", lambda s: link(s.outside / "secretdir", s.box / "sub"), Open(["sub"]),
         REFUSED),
    Case("linked folder as an intermediate component", lambda s: link(s.outside, s.box / "sub"),
         Open(["sub", "secretdir"]), REFUSED),
    Case("link to a folder inside", lambda s: (write(s.box / "real" / "f"), link("real", s.box / "sub")),
         Open(["sub"]), REFUSED),
    Case("dangling link for a folder", lambda s: link(s.outside / "nowhere", s.box / "sub"), Open(["sub"]),
         REFUSED),
    Case("file where a folder is expected", lambda s: write(s.box / "sub"), Open(["sub"]), REFUSED),
    Case("FIFO where a folder is expected", lambda s: fifo(s.box / "sub"), Open(["sub"]), REFUSED),
    Case("absent folder", nothing, Open(["sub"]), MISSING),
    Case("'..' as a folder", nothing, Open([".."]), REFUSED),
    Case("'sub/..' as a folder", lambda s: (s.box / "sub").mkdir(), Open(["sub/.."]), REFUSED),
    Case("a path through a linked folder, as one part", lambda s: link(s.outside, s.box / "sub"),
         Open(["sub/secretdir"]), REFUSED),
    # with create, whatever stands in a folder's way is replaced, never followed
    Case("create: link to a folder outside", lambda s: link(s.outside / "secretdir", s.box / "sub"),
         Open(["sub"], create=True), []),
    Case("create: linked intermediate component", lambda s: link(s.outside, s.box / "sub"),
         Open(["sub", "secretdir"], create=True), []),
    Case("create: a file in the way", lambda s: write(s.box / "sub"), Open(["sub"], create=True), []),
    Case("create: a FIFO in the way", lambda s: fifo(s.box / "sub"), Open(["sub"], create=True), []),
    Case("create: absent", nothing, Open(["sub", "in"], create=True), []),
    # removing what the VM left, never through a link
    Case("remove a tree holding links out", lambda s: (write(s.box / "t" / "f"),
                                                       link(s.outside / "secret", s.box / "t" / "l1"),
                                                       link(s.outside / "secretdir", s.box / "t" / "l2"),
                                                       link(s.outside, s.box / "t" / "in" / "l3")),
         Remove("t"), (True, False)),
    Case("remove a link to a folder outside", lambda s: link(s.outside / "secretdir", s.box / "t"),
         Remove("t"), (True, False)),
    Case("remove a FIFO", lambda s: fifo(s.box / "t"), Remove("t"), (True, False)),
    Case("remove what is absent", nothing, Remove("t"), (True, False)),
    Case("remove a tree nested deeper than 32", lambda s: nested(s.box / "t", 40), Remove("t"), (False, True)),
    Case("remove '..'", nothing, Remove(".."), (False, True)),
    Case("remove '../outside'", nothing, Remove("../outside"), (False, True)),
]


# -- running a row --------------------------------------------------------------------------------------


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    outside = tmp_path / "outside"
    write(outside / "secret", SECRET)
    write(outside / "secretdir" / "secret", SECRET)
    box = tmp_path / "box"
    box.mkdir()
    return Scene(box, outside)


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


@contextmanager
def fifo_release(box: Path) -> Iterator[None]:
    """After BLOCK_SEC, every FIFO under box is opened for writing and closed: a reader stuck opening one is
    released (and reads end of file), so a blocking reader fails the row on time instead of hanging the run."""
    def release() -> None:
        for path in box.rglob("*"):
            try:
                if stat.S_ISFIFO(path.lstat().st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                continue

    timer = threading.Timer(BLOCK_SEC, release)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def bytes_read() -> int | None:
    """What this process has read so far (read(2) and its kin, every thread), when Linux tells."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    return int(text.split("rchar:")[1].split()[0])


@contextmanager
def swapped_after_look(box: Path, name: str, swap: Callable[[], None]) -> Iterator[None]:
    """The attacker's move at the worst moment: right after the reader's first look at box/name (its lstat),
    before it opens it. The real os.stat runs; only the timing is arranged."""
    real_stat = os.stat
    box_ino = box.stat().st_ino
    done = False

    def stat_then_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        nonlocal done
        result = real_stat(path, *args, **kwargs)
        parent = kwargs.get("dir_fd")
        if not done and path == name and parent is not None and os.fstat(parent).st_ino == box_ino:
            done = True
            swap()
        return result

    os.stat = stat_then_swap  # type: ignore[assignment]
    try:
        yield
        assert done, "the reader never looked at the file before opening it"
    finally:
        os.stat = real_stat


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader.name)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_both_readers_give_the_tables_outcome(case: Case, reader: Vmread | Far, scene: Scene) -> None:
    case.build(scene)
    outside_before = snapshot(scene.outside)
    started = time.monotonic()
    with fifo_release(scene.box):
        if isinstance(case.op, Open):
            got: Any = reader.open(scene.box, case.op.parts, case.op.create)
        else:
            parent = os.open(scene.box, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if isinstance(case.op, Read):
                    before = bytes_read()
                    if case.swap is not None:
                        with swapped_after_look(scene.box, case.op.name, lambda: case.swap(scene)):
                            got = reader.read(parent, case.op.name, case.op.cap)
                    else:
                        got = reader.read(parent, case.op.name, case.op.cap)
                    after = bytes_read()
                    if before is not None and after is not None:
                        assert after - before <= case.op.cap + 1 + READ_SLACK, f"{reader.name} read past the cap"
                else:
                    returned = reader.remove(parent, case.op.name)
                    got = (returned, os.path.lexists(scene.box / case.op.name))
            finally:
                os.close(parent)
    took = time.monotonic() - started
    assert got == case.expected, f"{reader.name}: {case.id}"
    assert took < BLOCK_SEC, f"{reader.name} took {took:.1f} s on {case.id} (blocked?)"
    assert snapshot(scene.outside) == outside_before, f"{reader.name} changed what is outside the VM's folder"
    assert scene.box.is_dir()


def test_the_table_runs_every_operation() -> None:
    """Reading, opening or creating folders and removing: each kind has rows (far.py stays standalone: that is
    tests/test_far.py::test_far_is_standalone_python_38)."""
    assert {type(case.op) for case in CASES} == {Read, Open, Remove}
    assert any(case.op.create for case in CASES if isinstance(case.op, Open))
    assert any(case.swap for case in CASES)
