"""agentbox.git.ignore against real git: the same trees, the same ignored and untracked files.

Each test builds a work tree in tmp_path, asks `git status --porcelain -uall --ignored -z` (git
running in a repository the test owns), and compares with a walk that uses Matcher the way
checkpoints do: read each folder's .gitignore, never descend into an ignored folder.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentbox.git.ignore import Matcher, Rules, parse_capped

# Quick tests (no VM): a minute each at most, not the suite's 300 s.
pytestmark = pytest.mark.timeout(60)

GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}


def make_tree(root: Path, files: dict[str, bytes]) -> None:
    """files: path -> content; a path ending in "/" is an empty folder."""
    for path, content in files.items():
        target = root / path
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def init_repository(root: Path, *, exclude: bytes | None = None, excludes_file: bytes | None = None,
                    ignore_case: bool = False) -> list[str]:
    """git init in root; returns the -c options status needs (core.excludesFile, core.ignoreCase)."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True, env={**os.environ, **GIT_ENV})
    if exclude is not None:
        (root / ".git" / "info").mkdir(exist_ok=True)
        (root / ".git" / "info" / "exclude").write_bytes(exclude)
    else:
        (root / ".git" / "info" / "exclude").unlink(missing_ok=True)
    options = ["-c", f"core.ignoreCase={'true' if ignore_case else 'false'}"]
    if excludes_file is not None:
        path = root.parent / f"{root.name}-excludes"
        path.write_bytes(excludes_file)
        options += ["-c", f"core.excludesFile={path}"]
    else:
        options += ["-c", f"core.excludesFile={root.parent / 'no-such-file'}"]
    return options


def git_status(root: Path, options: list[str]) -> tuple[set[str], set[str]]:
    out = subprocess.run(["git", *options, "status", "--porcelain", "-uall", "--ignored", "-z"], cwd=root,
                         check=True, capture_output=True, env={**os.environ, **GIT_ENV}).stdout
    ignored, untracked = set(), set()
    for entry in out.split(b"\0"):
        if not entry:
            continue
        code, path = entry[:2], os.fsdecode(entry[3:])
        assert code in (b"!!", b"??"), entry
        (ignored if code == b"!!" else untracked).add(path)
    return ignored, untracked


def walk(root: Path, global_rules: list[Rules], ignore_case: bool = False) -> tuple[set[str], set[str]]:
    """The checkpoint walk in small: which files Matcher says are ignored, and which untracked."""
    ignored: set[str] = set()
    untracked: set[str] = set()

    def below(folder: Path, rel: str, matcher: Matcher) -> None:
        for entry in os.scandir(folder):
            path = f"{rel}/{entry.name}"
            is_dir = entry.is_dir(follow_symlinks=False)
            assert matcher.is_ignored(path, is_dir), f"{path} is below an ignored folder"
            if is_dir:
                below(Path(entry.path), path, matcher)
            else:
                ignored.add(path)

    def visit(folder: Path, rel: str, matcher: Matcher) -> None:
        gitignore = folder / ".gitignore"
        if gitignore.is_file() and not gitignore.is_symlink():
            matcher = matcher.with_dir(rel, Rules.parse(gitignore.read_bytes(), rel, f"{rel}/.gitignore"))
        for entry in os.scandir(folder):
            if not rel and entry.name == ".git":
                continue
            path = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if matcher.is_ignored(path, is_dir):
                if is_dir:
                    below(Path(entry.path), path, matcher)
                else:
                    ignored.add(path)
            elif is_dir:
                visit(Path(entry.path), path, matcher)
            else:
                untracked.add(path)

    visit(root, "", Matcher(global_rules, ignore_case=ignore_case))
    return ignored, untracked


def compare(root: Path, options: list[str], global_rules: list[Rules], ignore_case: bool = False) -> None:
    want_ignored, want_untracked = git_status(root, options)
    got_ignored, got_untracked = walk(root, global_rules, ignore_case)
    problems = []
    for path in sorted(want_ignored - got_ignored):
        problems.append(f"git ignores {path!r}, Matcher does not")
    for path in sorted(got_ignored - want_ignored):
        problems.append(f"Matcher ignores {path!r}, git does not")
    assert not problems, "\n".join(problems)
    assert got_untracked == want_untracked
    assert want_ignored and want_untracked  # the comparison compared something


# (name, {folder in the case: .gitignore text}, paths). Every case lives in its own folder, so
# anchoring is relative to that folder's .gitignore.
CASES: list[tuple[str, dict[str, bytes], list[str]]] = [
    ("basename at any depth", {"": b"foo\n"}, ["foo", "a/foo", "a/b/foo", "foox", "xfoo", "d/foo/bar", "d/keep"]),
    ("blank lines and comments", {"": b"\n# comment\n  \n#\nfoo\n"},
     ["# comment", "comment", "  ", "#", "foo", "bar"]),
    ("escaped hash and bang", {"": b"\\#hash\n\\!bang\n!\\!neg\n"}, ["#hash", "!bang", "hash", "bang", "!neg"]),
    ("hash not at the start", {"": b" #sp\na#b\n"}, [" #sp", "#sp", "a#b", "ab"]),
    ("trailing spaces", {"": b"a \nb\\ \nc\\  \nd\\\\ \ne\t\n"},
     ["a", "a ", "b", "b ", "c ", "c  ", "d\\", "d\\ ", "e", "e\t"]),
    ("negation", {"": b"*.log\n!keep.log\n"}, ["x.log", "keep.log", "a/keep.log", "a/y.log", "log"]),
    ("no re-include below an excluded folder", {"": b"build/\n!build/keep\n!keep2\n"},
     ["build/keep", "build/x", "build/keep2", "a/build/keep", "c/keep"]),
    ("re-include with dir/*", {"": b"build/*\n!build/keep\n"}, ["build/keep", "build/x", "build/sub/y", "other"]),
    ("directories only", {"": b"out/\nlink/\n"}, ["out/x", "a/out/y", "b/out", "c", "link"]),
    ("anchored", {"": b"/root.txt\n/sub/deep\nmid/x\n"},
     ["root.txt", "a/root.txt", "sub/deep", "a/sub/deep", "mid/x", "a/mid/x", "sub/other"]),
    ("leading **/", {"": b"**/logs\n**/cache/tmp\n"},
     ["logs/x", "q/logs/x", "q/r/logs", "cache/tmp", "q/cache/tmp", "q/cache/x", "tmp"]),
    ("trailing /**", {"": b"lib/**\n!lib/keep\n"}, ["lib/a", "lib/b/c", "lib/keep", "libx", "q/lib/a"]),
    ("middle /**/", {"": b"docs/**/*.md\na/**/b\n"},
     ["docs/x.md", "docs/a/b/x.md", "docsx.md", "q/x.md", "docs/x.txt", "a/b", "a/x/b", "a/x/y/b", "x/a/b"]),
    ("other ** is *", {"": b"foo**\n**bar\nx/y**z\nm/**n\n"},
     ["foo", "fooa", "a/foob", "bar", "abar", "x/yz", "x/yaz", "x/ya/z", "m/n", "m/an", "m/a/n"]),
    ("** right after the literal part", {"": b"ab**/x\npre/lit**\n"},
     ["abx", "ab/x", "abc/x", "abc/d/x", "pre/lit/z", "pre/litx", "pre/lit/x/y", "pre/li"]),
    ("character classes", {"": b"[[:digit:]]*.txt\n[!a]b\n[a-c]x\n[]]y\n*.[oa]\n[[:upper:]]Z\n[[:space:]]s\n"
                           b"[[:punct:]]p\n[^q]w\n[[:alpha:][:digit:]]v\n"},
     ["1.txt", "a.txt", "ab", "bb", "ax", "bx", "cx", "dx", "]y", "y", "m.o", "m.a", "m.b", "AZ", "aZ", " s", "\ts", "\x0bs",
      "!p", "ap", "qw", "rw", "av", "5v", "-v"]),
    ("malformed classes match nothing", {"": b"[abc\n[[:foo:]]x\n[a-\nz[]\n"},
     ["[abc", "a", "[[:foo:]]x", "fx", "[a-", "z[]", "z"]),
    ("ranges and escapes in classes", {"": b"[\\]a]1\n[a\\-c]2\n[--0]3\n[z-a]4\n[\\!]5\n"},
     ["]1", "a1", "\\1", "-2", "b2", "c2", "-3", ".3", "04", "z4", "b4", "!5"]),
    ("escapes", {"": b"\\*star\n\\?q\nback\\\\slash\nbr\\[x]\nend\\\n"},
     ["*star", "astar", "?q", "aq", "back\\slash", "br[x]", "brx", "end\\", "end"]),
    ("question mark", {"": b"?.q\na?c/\n"}, ["a.q", "ab.q", ".q", "abc/x", "abc2"]),
    ("wildcards with a slash", {"": b"*/mid\na/*/c\n*.d/x\n"},
     ["q/mid", "mid", "q/r/mid", "a/b/c", "a/c", "a/b/e/c", "s.d/x", "s.d/y"]),
    ("CRLF, BOM, NUL", {"": b"\xef\xbb\xbfbom\ncrlf\r\nnul\0tail\nlast"},
     ["bom", "crlf", "crlf\r", "nul", "nultail", "last"]),
    ("empty patterns", {"": b"!\n/\n!/\n \n"}, ["a", "b/c"]),
    ("not ASCII", {"": "caf?\ncaf??x\n[é]y\nü*\n".encode()},
     ["café", "cafax", "caféx", "éy", "üb", "ü", "aü"]),
    ("nested .gitignore in a folder not named in ASCII", {"dé": b"/x\ny?/z\n"},
     ["dé/x", "dé/q/x", "x", "dé/yé/z", "dé/ya/z"]),
    ("dir/**/ and **/", {"": b"d/**/\n**/e/\n"}, ["d/x", "d/s/x", "q/e/x", "e/y", "e2"]),
    ("all at the top but one", {"": b"/*\n!/keep\n!sub/\n"}, ["a", "keep", "sub/x", "q/sub/x"]),
    ("nested .gitignore", {"": b"*.tmp\n/only-top\n", "sub": b"!keep.tmp\n/anch\nonly-top\n"},
     ["x.tmp", "keep.tmp", "sub/keep.tmp", "sub/x.tmp", "sub/d/keep.tmp", "other/keep.tmp", "only-top",
      "sub/only-top", "anch", "sub/anch", "sub/x/anch"]),
    ("deeper negation of a folder", {"": b"gen/\n", "a": b"!gen/\n"}, ["gen/x", "a/gen/x", "a/b/gen/x"]),
    ("a pattern naming its own .gitignore", {"": b"*\n!*/\n", "s": b"!y\n"}, ["x", "s/x", "s/y", "t/y"]),
    ("many stars", {"": b"*a*a*a*a*b\n**/x/**/y/**/z\n"},
     ["aaaab", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa", "xaxaxaxab", "x/y/z", "x/q/y/r/z", "q/x/y/z", "x/y/q"]),
    ("typical", {"": b"node_modules/\n__pycache__/\n*.py[cod]\n/target\n.env\n.env.*\n!.env.example\n"
                     b"npm-debug.log*\n*.egg-info/\n.DS_Store\n"},
     ["node_modules/a/b", "src/node_modules/x", "a/__pycache__/m.pyc", "m.pyc", "m.pyo", "m.py", "target/x",
      "src/target/x", ".env", ".env.local", ".env.example", "npm-debug.log.1", "p.egg-info/PKG", "p.egg-info2",
      "q/.DS_Store"]),
]


def _case_tree(root: Path) -> None:
    files: dict[str, bytes] = {}
    for index, (_, rules, paths) in enumerate(CASES):
        for path in paths:
            files[f"c{index}/{path}"] = b"x"
        for folder, text in rules.items():
            files[f"c{index}/{folder}/.gitignore" if folder else f"c{index}/.gitignore"] = text
    make_tree(root, files)


def test_pattern_table_matches_git(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    options = init_repository(root)
    _case_tree(root)
    compare(root, options, [])


def test_case_insensitive_matches_git(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    options = init_repository(root, ignore_case=True)
    make_tree(root, {
        "Sub/.gitignore": b"/Anch\n!KEEP.log\nd/E\n",
        ".gitignore": b"*.LOG\nBuild/\n[A-Z]x\n[a]Y\n\\Qq\n[[:upper:]]u\n[[:lower:]]l\n[A]k\n/Anch/sub\n\\az\n",
        **dict.fromkeys(["x.log", "X.Log", "y.LoG2", "build/f", "BUILD/g", "Ax", "ax", "aY", "AY", "Qq", "qq", "Uu", "uu", "Ll", "ll", "Ak", "ak", "anch/SUB", "ANCH/sub", "AZ", "Az", "keep", "café.LOG", "CAFÉ.log", "Sub/anch", "Sub/x/anch", "Sub/keep.LOG", "Sub/D/e", "Sub/d/x"], b"x"),
    })
    compare(root, options, [], ignore_case=True)


def test_precedence_of_files_matches_git(tmp_path: Path) -> None:
    """info/exclude over core.excludesFile, .gitignore over both, deeper over shallower."""
    root = tmp_path / "repo"
    exclude = b"*.a\n!*.b\nex-only\n/top-anchor\n"
    excludes_file = b"*.b\n!*.a\n*.c\nfile-only\n"
    options = init_repository(root, exclude=exclude, excludes_file=excludes_file)
    make_tree(root, {
        ".gitignore": b"!*.c\n*.d\n",
        "s/.gitignore": b"!*.d\n*.e\n",
        "s/t/.gitignore": b"!*.e\n",
        **dict.fromkeys(["1.a", "1.b", "1.c", "1.d", "1.e", "s/2.c", "s/2.d", "s/2.e", "s/t/3.d", "s/t/3.e", "ex-only", "s/ex-only", "file-only", "top-anchor", "s/top-anchor"], b"x"),
    })
    compare(root, options, [Rules.parse(exclude, "", "info/exclude"), Rules.parse(excludes_file, "", "excludes")])


_PIECES = ["a", "b", "ab", "*", "**", "***", "?", "[ab]", "[!a]", "[^b]", "[a-b]", "[]a]", "[a-]", "[-b]", "[a\\]]",
           "[[:alpha:]]", "[[:lower:]]", "[[:upper:]]", "[A-Z]", "[[:x:]]", "[[:]", "[", "]", "-", ".", "c", "a*", "*b",
           "\\", "\\a", "\\A", "\\*", "\\/", "/", "B", " ", "\\ "]
_NAMES = ["a", "b", "ab", "ba", "aa", "a.b", "c", "b.c", "A", "aB", "Ab", "[a]", "-", "]", "*", "\\", "a b", "a "]


def _random_pattern(rng: random.Random) -> str:
    segments = ["".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 2))) for _ in range(rng.randint(1, 3))]
    pattern = "/".join(segments)
    pattern = rng.choice(["", "", "/", "**/"]) + pattern + rng.choice(["", "", "/", "/**"])
    return rng.choice(["", "", "!"]) + pattern


def _random_case(rng: random.Random) -> tuple[dict[str, bytes], list[str]]:
    paths = sorted({"/".join(rng.choice(_NAMES) for _ in range(rng.randint(1, 3))) for _ in range(25)})
    folders = {path.rsplit("/", 1)[0] for path in paths if "/" in path}
    folders |= {folder.rsplit("/", 1)[0] for folder in folders if "/" in folder}
    paths = [path for path in paths if path not in folders]
    rules = {"": "\n".join(_random_pattern(rng) for _ in range(rng.randint(1, 4))).encode()}
    if folders and rng.random() < 0.5:
        rules[rng.choice(sorted(folders))] = "\n".join(_random_pattern(rng) for _ in range(rng.randint(1, 3))).encode()
    return rules, paths


@pytest.mark.parametrize("ignore_case", [False, True])
def test_random_patterns_match_git(tmp_path: Path, ignore_case: bool) -> None:
    rng = random.Random(2305 + ignore_case)
    for round_ in range(3):
        root = tmp_path / f"repo{round_}"
        options = init_repository(root, ignore_case=ignore_case)
        files: dict[str, bytes] = {}
        for index in range(60):
            rules, paths = _random_case(rng)
            for path in paths:
                files[f"c{index}/{path}"] = b"x"
            for folder, text in rules.items():
                files[f"c{index}/{folder}/.gitignore" if folder else f"c{index}/.gitignore"] = text
        make_tree(root, files)
        compare(root, options, [], ignore_case=ignore_case)


def test_below_an_ignored_folder_is_ignored() -> None:
    matcher = Matcher([]).with_dir("", Rules.parse(b"build/\n!build/keep\n!build/sub/\n", "", ".gitignore"))
    assert matcher.is_ignored("build", True)
    assert matcher.is_ignored("build/keep", False)
    assert matcher.is_ignored("build/sub/x", False)
    assert not matcher.is_ignored("keep/build", False)  # the control: a file named build is not a folder
    child = matcher.with_dir("build", Rules.parse(b"!*\n", "build", "build/.gitignore"))
    assert child.is_ignored("build/keep", False)


def test_rules_from_another_folder_do_not_apply() -> None:
    matcher = Matcher([]).with_dir("a", Rules.parse(b"x\n", "a", "a/.gitignore"))
    assert matcher.is_ignored("a/x", False)
    assert matcher.is_ignored("a/b/x", False)
    assert not matcher.is_ignored("x", False)
    assert not matcher.is_ignored("ab/x", False)


def test_parse_capped() -> None:
    assert parse_capped(None, "", ".gitignore").lines == ()
    big = parse_capped(b"x\n" * 10, "", ".gitignore", limit=8)
    assert big.lines == () and big.problem is not None and "20 bytes" in big.problem
    assert not Matcher([]).with_dir("", big).is_ignored("x", False)
    small = parse_capped(b"x\n" * 4, "", ".gitignore", limit=8)
    assert [text for _, text in small.patterns()] == ["x"] * 4
    assert Matcher([]).with_dir("", small).is_ignored("x", False)


TYPICAL = b"""\
# node
node_modules/
npm-debug.log*
yarn-debug.log*
yarn-error.log*
.pnpm-debug.log*
report.[0-9]*.[0-9]*.[0-9]*.[0-9]*.json
coverage/
*.lcov
.nyc_output
dist/
.cache
.parcel-cache
*.tsbuildinfo
.eslintcache
# python
__pycache__/
*.py[cod]
*$py.class
*.so
build/
*.egg-info/
.eggs/
.venv
venv/
.pytest_cache/
.mypy_cache/
.tox/
htmlcov/
.coverage
.coverage.*
# rust
/target
**/*.rs.bk
Cargo.lock
# editors and OS
.idea/
.vscode/*
!.vscode/settings.json
*.swp
*~
.DS_Store
.env
.env.*
!.env.example
"""


def test_fifty_thousand_calls_are_fast() -> None:
    """The checkpoint walk calls is_ignored for every untracked entry; measured, with a loose bound."""
    rng = random.Random(5)
    words = ["src", "lib", "app", "core", "util", "tests", "docs", "api", "models", "views", "x", "y"]
    folders = ["/".join(rng.choice(words) for _ in range(rng.randint(1, 4))) for _ in range(2500)]
    exts = [".py", ".ts", ".js", ".rs", ".md", ".json", ".pyc", ".txt", ".log", ".so", ""]
    paths = [f"{rng.choice(folders)}/{rng.choice(words)}{i}{rng.choice(exts)}" for i in range(50_000)]
    matcher = Matcher([]).with_dir("", Rules.parse(TYPICAL, "", ".gitignore"))
    start = time.perf_counter()
    for path in paths:
        matcher.is_ignored(path, False)
    elapsed = time.perf_counter() - start
    print(f"50,000 is_ignored calls: {elapsed * 1000:.1f} ms")
    assert elapsed < 1.0


def test_automaton_agrees_with_the_regular_expressions() -> None:
    """Patterns with many stars run on the automaton; it must answer as the compiled expressions do."""
    from agentbox.git import ignore as ignorerules

    rng = random.Random(11)
    texts = ["/".join(rng.choice(_NAMES + ["", "aab", "b/a"]) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    for _ in range(300):
        pattern = _random_pattern(rng).lstrip("!").rstrip("/") or "a"
        for fold in (False, True):
            tokens = ignorerules._tokens(pattern, fold, pathname=True)
            if any(token[0] == ignorerules._NEVER for token in tokens):
                continue
            expression = re.compile(ignorerules._regex(tokens), re.DOTALL)
            automaton = ignorerules._automaton(tokens)
            for text in texts:
                assert automaton(text) == (expression.fullmatch(text) is not None), (pattern, fold, text)


HOSTILE = """
import time
from agentbox.git.ignore import Matcher, Rules
star = b"*a" * 30 + b"b\\n"
globstar = b"**/a" * 20 + b"/b\\n"
klass = b"[" + b"a-z" * 20000 + b"]x\\n"
matcher = Matcher([]).with_dir("", Rules.parse(star + globstar + klass, "", ".gitignore"))
start = time.perf_counter()
assert not matcher.is_ignored("a" * 250, False)
assert not matcher.is_ignored("/".join(["a"] * 100) + "/c", False)
assert matcher.is_ignored("qx", False)
assert matcher.is_ignored("a" * 40 + "b", False)  # the control: the star pattern does match
print(f"{time.perf_counter() - start:.3f}")
"""


def test_hostile_patterns_stay_fast() -> None:
    """A .gitignore is written by the agent: patterns that make backtracking explode must not hang a walk.

    In a child process, so a regression fails at the timeout instead of hanging the suite.
    """
    done = subprocess.run([sys.executable, "-c", HOSTILE], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 2.0
