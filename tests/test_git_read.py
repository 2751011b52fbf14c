"""agentbox/git/read.py against real git: repositories the tests make, read back without git, compared
with what git says; and the git folder as an attacker leaves it (links, FIFOs, forged objects)."""

from __future__ import annotations

import hashlib
import os
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from agentbox.git import read as gitread
from agentbox.git.read import GitReadError, IndexEntry, ObjectReader
from tests.gitrepo import commit_all, git, init
from tests.helpers import returns_within, write

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)

FORMATS = ["sha1", "sha256"]


def raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except GitReadError as err:
        return err
    return None


def out(repo: Path, *args: str) -> str:
    return git(repo, *args).stdout.decode().strip()


def all_objects(repo: Path) -> dict[str, tuple[str, bytes]]:
    """Every object of the repository, as git itself reads it."""
    data = git(repo, "cat-file", "--batch-all-objects", "--batch").stdout
    found: dict[str, tuple[str, bytes]] = {}
    pos = 0
    while pos < len(data):
        header_end = data.index(b"\n", pos)
        oid, kind, size = data[pos:header_end].decode().split()
        start = header_end + 1
        found[oid] = (kind, data[start:start + int(size)])
        pos = start + int(size) + 1
    return found


def history(path: Path, fmt: str = "sha1", commits: int = 12) -> Path:
    """A repository with files that change a little in every commit (so repack makes deltas), a folder
    tree, a symlink and an annotated tag."""
    repo = init(path, f"--object-format={fmt}")
    lines = [f"line {n} of a file that changes slowly over time\n" for n in range(400)]
    for number in range(commits):
        lines[number * 7] = f"changed in commit {number}\n"
        write(repo / "big.txt", "".join(lines))
        write(repo / "src" / "deep" / "er" / f"f{number % 3}.py", f"print({number})\n" * 50)
        (repo / "bin.dat").write_bytes(bytes(range(256)) * (number + 1))
        if number == 2:
            os.symlink("big.txt", repo / "link")
        commit_all(repo, f"commit {number}")
    git(repo, "tag", "-a", "v1", "-m", "a tag")
    return repo


def assert_reads_like_git(repo: Path, fmt: str) -> int:
    objects = all_objects(repo)
    assert objects
    with ObjectReader(repo / ".git", fmt) as reader:
        for oid, expected in objects.items():
            assert reader.read(oid) == expected, oid
    return len(objects)


def pack_files(repo: Path, ext: str) -> list[Path]:
    return sorted((repo / ".git" / "objects" / "pack").glob(f"*.{ext}"))


# --- objects --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_loose_objects_read_as_git_reads_them(tmp_path: Path, fmt: str) -> None:
    repo = history(tmp_path / "r", fmt, commits=4)
    assert not pack_files(repo, "pack")
    assert gitread.object_format(repo / ".git") == fmt
    assert assert_reads_like_git(repo, fmt) > 20


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("repack", [
    ["gc", "-q"],
    ["repack", "-adf", "--depth=50"],
    ["-c", "pack.threads=1", "repack", "-adf", "--depth=250", "--window=250"],
    ["-c", "repack.useDeltaBaseOffset=false", "repack", "-adf"],  # REF_DELTA instead of OFS_DELTA
])
def test_packed_objects_and_deltas_read_as_git_reads_them(tmp_path: Path, fmt: str, repack: list[str]) -> None:
    repo = history(tmp_path / "r", fmt)
    git(repo, *repack)
    [idx] = pack_files(repo, "idx")
    chains = out(repo, "verify-pack", "-v", str(idx))
    assert "chain length = " in chains  # deltas are there to be applied
    assert not list((repo / ".git" / "objects").glob("[0-9a-f][0-9a-f]/*"))
    assert assert_reads_like_git(repo, fmt) > 40


def deep_chains(path: Path) -> tuple[Path, int]:
    """A repository whose pack has delta chains at least 20 deep; and the deepest."""
    repo = init(path)
    text = [f"{n}\n" for n in range(3000)]
    for number in range(60):
        text[number * 11] = f"edit {number}\n"
        write(repo / "f.txt", "".join(text))
        commit_all(repo)
    git(repo, "-c", "pack.threads=1", "repack", "-adf", "--depth=100", "--window=100")
    [idx] = pack_files(repo, "idx")
    depths = [int(line.split("=")[1].split(":")[0]) for line in out(repo, "verify-pack", "-v", str(idx)).splitlines()
              if line.startswith("chain length = ")]
    return repo, max(depths)


def test_deep_delta_chains_and_the_base_cache(tmp_path: Path) -> None:
    repo, deepest = deep_chains(tmp_path / "r")
    assert deepest >= 20
    started = time.perf_counter()
    assert_reads_like_git(repo, "sha1")
    assert time.perf_counter() - started < 10


def test_a_delta_chain_deeper_than_the_cap_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, deepest = deep_chains(tmp_path / "r")
    monkeypatch.setattr(gitread, "MAX_DELTA_DEPTH", deepest)
    assert_reads_like_git(repo, "sha1")  # control: at the cap every object reads
    monkeypatch.setattr(gitread, "MAX_DELTA_DEPTH", 5)
    errors = []
    with ObjectReader(repo / ".git", "sha1") as reader:
        for oid in all_objects(repo):
            err = raised(lambda oid=oid: reader.read(oid))
            if err is not None:
                errors.append(str(err))
    assert errors and all("a delta chain is deeper than 5" in e for e in errors)


def test_deltas_of_a_large_file_copy_whole_64k_blocks(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    content = bytearray(b"".join(hashlib.sha256(str(n).encode()).digest() for n in range(10_000)))  # 320 KB
    for number in range(3):
        content[-100 - number] ^= 0xFF
        (repo / "big.bin").write_bytes(bytes(content))
        commit_all(repo)
    git(repo, "repack", "-adf")
    assert "chain length = " in out(repo, "verify-pack", "-v", str(pack_files(repo, "idx")[0]))
    assert_reads_like_git(repo, "sha1")


def test_large_offsets_in_the_pack_index(tmp_path: Path) -> None:
    repo = history(tmp_path / "r", commits=5)
    git(repo, "repack", "-adf")
    [pack] = pack_files(repo, "pack")
    idx = pack.with_suffix(".idx")
    plain_size = idx.stat().st_size
    idx.unlink()
    git(repo, "index-pack", "--index-version=2,0x40", str(pack))  # every object past 0x40 gets a 64-bit offset
    assert idx.stat().st_size > plain_size
    assert assert_reads_like_git(repo, "sha1") > 20


def test_objects_only_in_alternates_are_not_read(tmp_path: Path) -> None:
    source = history(tmp_path / "source", commits=2)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--shared", str(source), str(clone))
    assert (clone / ".git" / "objects" / "info" / "alternates").exists()
    tip = out(clone, "rev-parse", "HEAD")
    with ObjectReader(clone / ".git", "sha1") as reader:
        err = raised(lambda: reader.read(tip))
    assert err is not None and f"object {tip} is not in " in str(err)
    with ObjectReader(source / ".git", "sha1") as reader:  # control: the same object where it really is
        assert reader.read(tip)[0] == "commit"


@pytest.mark.parametrize("fmt", FORMATS)
def test_trees_read_recursively_as_git_lists_them(tmp_path: Path, fmt: str) -> None:
    repo = history(tmp_path / "r", fmt, commits=4)
    blob = out(repo, "hash-object", "-w", "--stdin")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{out(repo, 'rev-parse', 'HEAD')},sub")
    del blob
    git(repo, "commit", "-q", "-m", "a gitlink")
    git(repo, "gc", "-q")
    expected = {}
    for line in git(repo, "ls-tree", "-r", "-z", "HEAD").stdout.split(b"\0"):
        if line:
            meta, path = line.split(b"\t", 1)
            mode, _kind, oid = meta.decode().split()
            expected[os.fsdecode(path)] = (mode, oid)
    with ObjectReader(repo / ".git", fmt) as reader:
        kind, commit = reader.read(gitread.head(repo / ".git", repo / ".git") or "")
        assert kind == "commit"
        tree = gitread.commit_tree(commit)
        assert tree == out(repo, "rev-parse", "HEAD^{tree}")
        found = gitread.read_tree_recursive(reader, tree, fmt)
    assert found == expected
    assert found["link"][0] == "120000" and found["sub"][0] == "160000"
    assert found["src/deep/er/f0.py"][0] == "100644"


def test_tree_entries_parse_and_refuse_names_git_refuses() -> None:
    oid = bytes(range(20))
    good = b"100644 a.txt\0" + oid + b"40000 dir\0" + oid
    assert gitread.tree_entries(good, "sha1") == [("100644", "a.txt", oid.hex()), ("40000", "dir", oid.hex())]
    for name in (b"..", b".", b".GIT"):
        with pytest.raises(GitReadError, match="which git refuses"):
            gitread.tree_entries(b"100644 " + name + b"\0" + oid, "sha1")
    for name in (b"a/b", b""):
        with pytest.raises(GitReadError, match="malformed"):
            gitread.tree_entries(b"100644 " + name + b"\0" + oid, "sha1")
    with pytest.raises(GitReadError, match="malformed"):
        gitread.tree_entries(good[:-3], "sha1")
    with pytest.raises(GitReadError, match="malformed"):
        gitread.tree_entries(b"100644 a\0" + oid + b"junk" + b"100644 b\0" + oid, "sha1")
    with pytest.raises(GitReadError, match="unknown mode"):
        gitread.tree_entries(b"100777 x\0" + oid, "sha1")
    with pytest.raises(GitReadError, match="does not start with its tree"):
        gitread.commit_tree(b"parent " + b"0" * 40 + b"\n")


def test_a_tree_bomb_is_cut_off(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    leaf = out(repo, "hash-object", "-w", "--stdin")
    tree = git(repo, "mktree", input=b"".join(f"100644 blob {leaf}\tf{n}\n".encode() for n in range(30))).stdout
    for _ in range(4):  # each level names the one below 30 times: 30**5 paths from a handful of objects
        listing = b"".join(b"040000 tree " + tree.strip() + f"\td{n}\n".encode() for n in range(30))
        tree = git(repo, "mktree", input=listing).stdout
    with ObjectReader(repo / ".git", "sha1") as reader:
        err = raised(lambda: gitread.read_tree_recursive(reader, tree.decode().strip(), "sha1", max_entries=100_000))
    assert err is not None and "more than 100000 entries" in str(err)


# --- forged and hostile objects -------------------------------------------------------------------------


def loose_path(repo: Path, oid: str) -> Path:
    return repo / ".git" / "objects" / oid[:2] / oid[2:]


def test_an_altered_loose_object_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "f", "the real content\n")
    commit_all(repo)
    oid = out(repo, "rev-parse", "HEAD:f")
    with ObjectReader(repo / ".git", "sha1") as reader:
        assert reader.read(oid) == ("blob", b"the real content\n")  # control
    path = loose_path(repo, oid)
    os.chmod(path, 0o644)
    path.write_bytes(zlib.compress(b"blob 8\0backdoor"))
    with ObjectReader(repo / ".git", "sha1") as reader:
        err = raised(lambda: reader.read(oid))
    assert err is not None
    assert str(err) == (f"{path} does not hold what its id says: object {oid} hashes to something else "
                        "(altered or forged)")


def test_an_altered_packed_object_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "f", "stored uncompressed-ish " * 4)
    commit_all(repo)
    oid = out(repo, "rev-parse", "HEAD:f")
    git(repo, "-c", "pack.compression=0", "gc", "-q")
    [pack] = pack_files(repo, "pack")
    data = pack.read_bytes()
    at = data.index(b"stored uncompressed-ish")
    os.chmod(pack, 0o644)
    pack.write_bytes(data[:at] + b"S" + data[at + 1:])  # a stored zlib block: its adler32 no longer matches
    with ObjectReader(repo / ".git", "sha1") as reader:
        err = raised(lambda: reader.read(oid))
    assert err is not None and str(pack) in str(err)


def test_a_loose_object_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "f", "content\n")
    commit_all(repo)
    oid = out(repo, "rev-parse", "HEAD:f")
    path = loose_path(repo, oid)
    outside = tmp_path / "outside"
    outside.write_bytes(path.read_bytes())
    path.unlink()
    os.symlink(outside, path)
    with ObjectReader(repo / ".git", "sha1") as reader:
        err = raised(lambda: reader.read(oid))
        assert err is not None
        assert str(err).startswith(f"{path} is a symbolic link, not a regular file: agentbox reads the workspace's "
                                   "git folder without following links")
        path.unlink()
        path.write_bytes(outside.read_bytes())  # control: the same bytes as a plain file read
        assert reader.read(oid) == ("blob", b"content\n")


def test_an_objects_folder_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "f", "content\n")
    commit_all(repo)
    oid = out(repo, "rev-parse", "HEAD:f")
    folder = loose_path(repo, oid).parent
    os.rename(folder, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", folder)
    with ObjectReader(repo / ".git", "sha1") as reader:
        err = raised(lambda: reader.read(oid))
    assert err is not None and str(err).startswith(f"{folder} is a symbolic link, not a folder")


def test_an_oversize_object_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "big", "x" * 5000)
    write(repo / "small", "y" * 50)
    commit_all(repo)
    big, small = out(repo, "rev-parse", "HEAD:big"), out(repo, "rev-parse", "HEAD:small")
    for packed in (False, True):
        if packed:
            git(repo, "gc", "-q")
        with ObjectReader(repo / ".git", "sha1", max_size=1000) as reader:
            assert reader.read(small) == ("blob", b"y" * 50)  # control
            err = raised(lambda: reader.read(big))
        assert err is not None and "is 5000 bytes, more than the 1000 agentbox reads" in str(err)


def test_an_object_id_that_is_not_hex_is_refused_before_any_file_is_opened(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    with ObjectReader(repo / ".git", "sha1") as reader:
        for bad in ("../../../../etc/passwd", "A" * 40, "0" * 64):
            err = raised(lambda bad=bad: reader.read(bad))
            assert err is not None and "is not a sha1 object id" in str(err)


# --- FIFOs: an error, at once ---------------------------------------------------------------------------


def fifo_in_place_of(path: Path) -> Path:
    if path.exists():
        os.chmod(path, 0o644)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def refused_fast(path: Path, call: Callable[[], object]) -> str:
    def unblock() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    err = returns_within(5, lambda: raised(call), unblock)
    assert err is not None
    return str(err)


def test_fifos_in_the_git_folder_are_errors_not_hangs(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "f", "content\n")
    tip = commit_all(repo)
    git_dir = repo / ".git"
    oid = out(repo, "rev-parse", "HEAD:f")
    assert gitread.head(git_dir, git_dir) == tip  # control
    git(repo, "pack-refs", "--all")  # git itself would block on the FIFOs below: it runs first
    os.rename(git_dir / "packed-refs", tmp_path / "packed-refs")

    fifo_in_place_of(loose_path(repo, oid))
    reader = ObjectReader(git_dir, "sha1")
    assert "is a FIFO (named pipe), not a regular file" in refused_fast(loose_path(repo, oid), lambda: reader.read(oid))

    fifo_in_place_of(git_dir / "index")
    message = refused_fast(git_dir / "index", lambda: gitread.read_index(git_dir / "index", 1 << 20))
    assert message.startswith(f"{git_dir / 'index'} is a FIFO (named pipe)")

    fifo_in_place_of(git_dir / "config")
    assert "FIFO" in refused_fast(git_dir / "config", lambda: gitread.object_format(git_dir))

    fifo_in_place_of(git_dir / "packed-refs")
    assert "FIFO" in refused_fast(git_dir / "packed-refs", lambda: gitread.head(git_dir, git_dir))

    fifo_in_place_of(git_dir / "HEAD")
    assert "FIFO" in refused_fast(git_dir / "HEAD", lambda: gitread.head(git_dir, git_dir))


# --- refs -----------------------------------------------------------------------------------------------


def test_head_on_a_branch_detached_and_unborn(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    git_dir = repo / ".git"
    assert gitread.head(git_dir, git_dir) is None  # unborn
    first = commit_all(repo, "one")
    second = commit_all(repo, "two")
    assert gitread.head(git_dir, git_dir) == second
    assert gitread.ref(git_dir, git_dir, "refs/heads/main") == second
    git(repo, "checkout", "-q", "--detach", first)
    assert (git_dir / "HEAD").read_text().strip() == first
    assert gitread.head(git_dir, git_dir) == first
    git(repo, "checkout", "-q", "--orphan", "fresh")
    assert gitread.head(git_dir, git_dir) is None
    assert gitread.ref(git_dir, git_dir, "refs/heads/nothing") is None


def test_packed_refs_only_with_peeled_tags(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    tip = commit_all(repo)
    git(repo, "tag", "-a", "v1", "-m", "tag")
    git(repo, "branch", "feature/x")
    git(repo, "pack-refs", "--all", "--prune")
    git_dir = repo / ".git"
    assert not (git_dir / "refs" / "heads" / "main").exists()
    assert "^" in (git_dir / "packed-refs").read_text()  # a peeled line follows the tag
    assert gitread.head(git_dir, git_dir) == tip
    assert gitread.ref(git_dir, git_dir, "refs/heads/feature/x") == tip
    assert gitread.ref(git_dir, git_dir, "refs/tags/v1") == out(repo, "rev-parse", "refs/tags/v1")
    newer = commit_all(repo)  # a loose ref wins over its packed copy
    assert gitread.head(git_dir, git_dir) == newer


def test_a_linked_worktree_has_its_own_head(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    commit_all(repo)
    linked = tmp_path / "linked"
    git(repo, "worktree", "add", "-q", "-b", "side", str(linked))
    side = commit_all(linked, "on the side")
    common = repo / ".git"
    linked_git_dir = common / "worktrees" / "linked"
    assert (linked / ".git").read_text().strip() == f"gitdir: {linked_git_dir}"
    assert gitread.head(linked_git_dir, common) == side == out(linked, "rev-parse", "HEAD")
    assert gitread.head(common, common) == out(repo, "rev-parse", "HEAD") != side
    git(linked, "bisect", "start")
    git(linked, "bisect", "bad", "HEAD")  # refs/bisect/ is per worktree: it lives in the worktree's git dir
    assert (linked_git_dir / "refs" / "bisect" / "bad").exists()
    assert gitread.ref(linked_git_dir, common, "refs/bisect/bad") == side
    assert gitread.ref(common, common, "refs/bisect/bad") is None


def test_refs_that_escape_or_loop_are_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    tip = commit_all(repo)
    git_dir = repo / ".git"
    (tmp_path / "secret").write_text(tip + "\n")
    (git_dir / "HEAD").write_text("ref: refs/../../secret\n")
    err = raised(lambda: gitread.head(git_dir, git_dir))
    assert err is not None and "refs/../../secret is not a ref name agentbox reads" in str(err)
    (git_dir / "HEAD").write_text("ref: refs/heads/a..b\n")
    err = raised(lambda: gitread.head(git_dir, git_dir))
    assert err is not None and "refs/heads/a..b is not a ref name agentbox reads" in str(err)
    for n in range(7):
        (git_dir / "refs" / "heads" / f"s{n}").write_text(f"ref: refs/heads/s{n + 1}\n")
    (git_dir / "HEAD").write_text("ref: refs/heads/s0\n")
    err = raised(lambda: gitread.head(git_dir, git_dir))
    assert err is not None and "symbolic refs nest more than 5 deep" in str(err)
    (git_dir / "HEAD").write_text("ref: refs/heads/s3\n")  # control: within the depth it resolves
    (git_dir / "refs" / "heads" / "s7").write_text(tip + "\n")
    assert gitread.head(git_dir, git_dir) == tip
    (git_dir / "refs" / "heads" / "s7").write_text("not an id\n")
    err = raised(lambda: gitread.head(git_dir, git_dir))
    assert err is not None and "holds not an id, not an object id" in str(err)


def test_a_ref_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    tip = commit_all(repo)
    git_dir = repo / ".git"
    main = git_dir / "refs" / "heads" / "main"
    (tmp_path / "outside").write_text(tip + "\n")
    main.unlink()
    os.symlink(tmp_path / "outside", main)
    err = raised(lambda: gitread.head(git_dir, git_dir))
    assert err is not None and str(err).startswith(f"{main} is a symbolic link, not a regular file")


# --- config ---------------------------------------------------------------------------------------------


CONFIG = """\
# a comment
[core]
\trepositoryformatversion = 0
\tIgnoreCase = true ; trailing comment
\tbare
[Remote "Origin"]
\turl = "https://example.com/a b"  # comment
\tfetch = +refs/heads/*:refs/remotes/origin/*
[weird]  key = on the header line
\tspaced =   inner   spaces   kept   ; trailing white space goes
\tquoted = " lead and trail " after
\tescapes = tab\\there \\"q\\" back\\\\slash
\tcontinued = one \\
two
\tlast = first
\tlast = second
[section.Legacy]
\tvalue = v
"""


@pytest.mark.parametrize(("section", "key"), [
    ("core", "ignorecase"), ("CORE", "IGNORECASE"), ("core", "bare"), ("core", "repositoryformatversion"),
    ("remote.Origin", "url"), ("REMOTE.Origin", "fetch"), ("weird", "key"), ("weird", "spaced"),
    ("weird", "quoted"), ("weird", "continued"), ("weird", "last"), ("section.legacy", "value"),
    ("remote.origin", "url"), ("core", "absent"),
])
def test_config_values_match_git(tmp_path: Path, section: str, key: str) -> None:
    (tmp_path / "config").write_text(CONFIG)
    result = git(tmp_path, "config", "--file", str(tmp_path / "config"), "--get", f"{section}.{key}", check=False)
    expected = result.stdout.decode()[:-1] if result.returncode == 0 else None
    found = gitread.config_value(tmp_path, section, key)
    assert found == ("true" if expected == "" and key == "bare" else expected)


def test_config_escapes_match_git(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("[weird]\n\tescapes = tab\\there \\\"q\\\" back\\\\slash\n")
    expected = out(tmp_path, "config", "--file", str(tmp_path / "config"), "--get", "weird.escapes")
    assert gitread.config_value(tmp_path, "weird", "escapes") == expected == 'tab\there "q" back\\slash'


def test_a_config_line_git_refuses_is_an_error(tmp_path: Path) -> None:
    for text in ("[core\n", "[core]\n= x\n", "[core]\nk = \"open\n", "[core]\nk = a\\q\n"):
        (tmp_path / "config").write_text(text)
        err = raised(lambda: gitread.config_value(tmp_path, "core", "k"))
        assert err is not None and str(err).startswith(f"{tmp_path / 'config'}, line ")
        assert git(tmp_path, "config", "--file", str(tmp_path / "config"), "--get", "core.k",
                   check=False).returncode not in (0, 1)  # git refuses it too


def test_object_format_and_reftable(tmp_path: Path) -> None:
    assert gitread.object_format(tmp_path) == "sha1"  # no config at all
    sha256 = init(tmp_path / "s", "--object-format=sha256")
    assert gitread.object_format(sha256 / ".git") == "sha256"
    (tmp_path / "config").write_text("[core]\n\trepositoryformatversion = 1\n[extensions]\n\trefStorage = reftable\n")
    err = raised(lambda: gitread.object_format(tmp_path))
    assert err is not None and "(extensions.refstorage), which agentbox cannot read" in str(err)
    (tmp_path / "config").write_text("[extensions]\n\tobjectformat = md5\n")
    err = raised(lambda: gitread.object_format(tmp_path))
    assert err is not None and "unknown object format md5" in str(err)


# --- the index ------------------------------------------------------------------------------------------


def ls_files(repo: Path) -> list[IndexEntry]:
    entries = []
    for record in git(repo, "ls-files", "-s", "-z").stdout.split(b"\0"):
        if record:
            meta, path = record.split(b"\t", 1)
            mode, oid, stage = meta.decode().split()
            entries.append(IndexEntry(os.fsdecode(path), int(mode, 8), oid, int(stage)))
    return entries


def index_repo(path: Path, fmt: str = "sha1") -> Path:
    repo = history(path, fmt, commits=3)
    write(repo / "a" / "b" / "c" / "long-shared-prefix-1.txt", "1")
    write(repo / "a" / "b" / "c" / "long-shared-prefix-2.txt", "2")
    (repo / os.fsdecode(b"not-utf8-\xff\xfe")).write_text("odd name")
    write(repo / ("d" * 200) / "x", "a long folder: a v4 path strips more than 127 bytes of the one before")
    write(repo / "e", "after it")
    commit_all(repo)
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{out(repo, 'rev-parse', 'HEAD')},gitlink")
    return repo


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("version", [2, 3, 4])
def test_index_versions_read_as_git_lists_them(tmp_path: Path, fmt: str, version: int) -> None:
    repo = index_repo(tmp_path / "r", fmt)
    if version == 3:
        git(repo, "update-index", "--skip-worktree", "big.txt")
        write(repo / "new.txt", "intent")
        git(repo, "add", "-N", "new.txt")
    git(repo, "update-index", "--index-version", str(version))
    data = (repo / ".git" / "index").read_bytes()
    assert struct.unpack_from(">I", data, 4)[0] == version
    entries = gitread.read_index(repo / ".git" / "index", 1 << 20, fmt)
    assert entries == ls_files(repo)
    modes = {entry.path: entry.mode for entry in entries}
    assert modes["link"] == 0o120000 and modes["gitlink"] == 0o160000
    assert os.fsencode(next(e.path for e in entries if e.path.startswith("not-utf8"))) == b"not-utf8-\xff\xfe"
    if version == 3:
        assert "new.txt" in modes


def test_index_conflict_stages(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "f", "base\n")
    commit_all(repo)
    git(repo, "checkout", "-q", "-b", "other")
    write(repo / "f", "other\n")
    commit_all(repo)
    git(repo, "checkout", "-q", "main")
    write(repo / "f", "main\n")
    commit_all(repo)
    assert git(repo, "merge", "other", check=False).returncode != 0
    entries = gitread.read_index(repo / ".git" / "index", 1 << 20)
    assert entries == ls_files(repo)
    assert sorted(entry.stage for entry in entries) == [1, 2, 3]


def test_a_damaged_index_is_refused(tmp_path: Path) -> None:
    repo = index_repo(tmp_path / "r")
    index = repo / ".git" / "index"
    assert gitread.read_index(index, 1 << 20)  # control
    err = raised(lambda: gitread.read_index(index, 100))
    assert err is not None and "more than the 100 agentbox reads" in str(err)
    err = raised(lambda: gitread.read_index(index, 1 << 20, "sha256"))
    assert err is not None and "its sha256 checksum does not match" in str(err)
    data = bytearray(index.read_bytes())
    data[100] ^= 1
    index.write_bytes(bytes(data))
    err = raised(lambda: gitread.read_index(index, 1 << 20))
    assert err is not None and str(err) == (f"{index} is not a git index agentbox can read: its sha1 checksum "
                                            "does not match its content")


def test_an_index_with_a_path_git_refuses_is_refused(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    write(repo / "ok", "x")
    git(repo, "add", "ok")
    index = repo / ".git" / "index"
    assert [e.path for e in gitread.read_index(index, 1 << 20)] == ["ok"]  # control
    data = index.read_bytes()[:-20].replace(b"ok\0", b"..\0")
    index.write_bytes(data + hashlib.sha1(data).digest())
    err = raised(lambda: gitread.read_index(index, 1 << 20))
    assert err is not None and "has the path .., which git refuses" in str(err)


def test_split_and_sparse_indexes_are_refused_for_the_caller_to_fall_back(tmp_path: Path) -> None:
    repo = index_repo(tmp_path / "r")
    git(repo, "update-index", "--split-index")
    err = raised(lambda: gitread.read_index(repo / ".git" / "index", 1 << 20))
    assert err is not None and "split index" in str(err)
    git(repo, "update-index", "--no-split-index")
    assert gitread.read_index(repo / ".git" / "index", 1 << 20) == ls_files(repo)  # control
    git(repo, "sparse-checkout", "init", "--cone", "--sparse-index")
    git(repo, "sparse-checkout", "set", "a")
    data = (repo / ".git" / "index").read_bytes()
    assert b"sdir" in data
    err = raised(lambda: gitread.read_index(repo / ".git" / "index", 1 << 20))
    assert err is not None and "sparse index" in str(err) and "split index" in str(err)


def test_a_50000_entry_index_reads_fast(tmp_path: Path) -> None:
    repo = init(tmp_path / "r")
    blob = out(repo, "hash-object", "-w", "--stdin")
    listing = "".join(f"100644 {blob}\tsrc/module{n // 100:04d}/file{n:05d}.py\n" for n in range(50_000))
    git(repo, "update-index", "--index-info", input=listing.encode())
    index = repo / ".git" / "index"
    best = min(_timed(lambda: gitread.read_index(index, 64 << 20)) for _ in range(3))
    entries = gitread.read_index(index, 64 << 20)
    assert len(entries) == 50_000 and entries[0] == IndexEntry("src/module0000/file00000.py", 0o100644, blob, 0)
    print(f"50,000-entry index v2: {best * 1000:.1f} ms")
    assert best < 0.25  # well under 0.1 s on an idle machine; the margin is for a loaded CI


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started
