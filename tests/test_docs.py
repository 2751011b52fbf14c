"""The README stays short, the docs/ tree's links and anchors resolve, and the configuration page's key
table is the one docs/gen_configuration.py generates from the key module."""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 420
INSTALL_COMMAND = "pipx install . && cd ~/work/my-project && agentbox claude"
TEST_COMMAND = "python3 -m pip install -e '.[test]' && python3 -m pytest"


def markdown_files(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", repo / "CONTRIBUTING.md", *sorted((repo / "docs").rglob("*.md"))]


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code spans blanked: a `](#x)` shown as code is no link."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"(`+)(?:(?!\1).)+?\1", "``", line))
    return "\n".join(lines)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(
        ch for ch in heading.strip().lower()
        if ch in " -" or unicodedata.category(ch)[0] in "LMN" or unicodedata.category(ch) == "Pc"
    )
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on the page, with GitHub's -1, -2 for repeated ones."""
    seen: dict[str, int] = {}
    result = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def broken_links(page: Path, repo: Path = REPO) -> list[str]:
    """Each relative link on the page whose file is missing, or whose #anchor is no heading there."""
    problems = []
    for match in LINK.finditer(without_code(page.read_text(encoding="utf-8"))):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(repo)}: ({target})"
        if not file.exists():
            problems.append(f"{where}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {file.relative_to(repo)}")
    return problems


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_configuration", REPO / "docs" / "gen_configuration.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move details to a page under docs/"


def test_the_readme_keeps_the_two_set_up_commands_and_ci_runs_the_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"```sh\n{INSTALL_COMMAND}\n```" in readme
    assert f"```sh\n{TEST_COMMAND}\n```" in readme
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in lines
    # After it only the real-Lima tier (docs/development.md), which the default run leaves out.
    after = [line for line in lines[lines.index(TEST_COMMAND) + 1:] if line.strip() and not line.startswith("#")]
    assert after == ["python3 -m pytest -n 0 -m reallima"]


def test_every_markdown_page_is_checked() -> None:
    names = {str(p.relative_to(REPO)) for p in markdown_files()}
    assert {"README.md", "CONTRIBUTING.md", "docs/README.md", "docs/configuration.md", "docs/security.md"} <= names


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A page\n\n## What changed: `agentbox diff`\n\n## Notes\n\n## Notes\n")
    good = "[x](a.md) [y](a.md#what-changed-agentbox-diff) [z](#b-page) [n](a.md#notes-1) [w](https://x.org/#q)"
    (docs / "b.md").write_text(f"# B page\n\n{good}\n\n```\n[code](nowhere.md)\n```\n")
    assert broken_links(docs / "b.md", tmp_path) == []
    (docs / "b.md").write_text("# B page\n\n[x](c.md) [y](a.md#nope) [z](#b) `[not](code.md)`\n\n[r]: gone.md\n")
    assert broken_links(docs / "b.md", tmp_path) == [
        f"docs/b.md: (c.md): no file {docs / 'c.md'}",
        "docs/b.md: (a.md#nope): no heading with the anchor #nope in docs/a.md",
        "docs/b.md: (#b): no heading with the anchor #b in docs/b.md",
        f"docs/b.md: (gone.md): no file {docs / 'gone.md'}",
    ]


def test_the_configuration_page_is_generated_from_the_key_table() -> None:
    gen = generator()
    page = gen.PAGE.read_text(encoding="utf-8")
    assert gen.render(page) == page, "run `python3 docs/gen_configuration.py` and commit docs/configuration.md"


def test_every_key_is_on_the_configuration_page() -> None:
    keys = generator().keys_module()
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [keys.dotted(path) for path, _ in keys.walk() if keys.dotted(path) not in page]
    assert missing == []
    undocumented = [keys.dotted(path) for path, key in keys.walk() if key.documented and f"`{keys.dotted(path)}`" not in page]
    assert undocumented == []
