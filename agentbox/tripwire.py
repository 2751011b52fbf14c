"""A tripwire on workspace files the host runs without asking.

The agent can write anything in the workspace, and some of it the host later executes on its own:
git hooks and .git/config (core.fsmonitor, core.hooksPath, filters and aliases run on the next
`git status`), .envrc (direnv), editor tasks, husky and pre-commit hooks, package.json scripts,
Makefiles, CI workflows. agentbox fingerprints exactly these paths (no tree walk, so it stays fast on
any repository) before a session and compares after it, naming every change loudly.
"""

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import NamedTuple

from agentbox import gitdirs, paths
from agentbox.fsutil import atomic_write, private_dir

WATCHED_FILES = (
    ".envrc",
    ".vscode/tasks.json",
    ".vscode/settings.json",
    ".vscode/launch.json",
    ".pre-commit-config.yaml",
    "package.json",
    "Makefile",
    "makefile",
    "GNUmakefile",
    ".gitattributes",
    ".gitmodules",
    "lefthook.yml",
    ".lefthook.yml",
    ".gitlab-ci.yml",
    ".circleci/config.yml",
)
WATCHED_DIRS = (".husky", ".github/workflows")
GIT_FILES = ("config", "config.worktree", "info/attributes")
MAX_TEXT = 64 * 1024
MAX_DIFF_LINES = 40


class Entry(NamedTuple):
    digest: str  # "file:<sha256>", "link:<target>", or "other:<kind>"
    text: str | None  # small text files, kept for a diff


def record_file(vm_name: str) -> Path:
    return paths.vm_state_dir(vm_name) / "tripwire.json"


def watched_paths(workspace: Path) -> dict[str, Path]:
    """Label (as shown to the user) -> path. Only fixed paths and a few small folders are listed."""
    found: dict[str, Path] = {name: workspace / name for name in WATCHED_FILES}
    for folder in WATCHED_DIRS:
        found.update(_list_dir(workspace, workspace / folder))
    git_dir, common_dir = gitdirs.git_dirs(workspace)
    if common_dir is not None:
        for name in GIT_FILES:
            found[_label(workspace, common_dir / name)] = common_dir / name
        found.update(_list_dir(workspace, common_dir / "hooks"))
    if git_dir is not None and git_dir != common_dir:
        found[_label(workspace, git_dir / "config.worktree")] = git_dir / "config.worktree"
    return found


def fingerprint(workspace: Path) -> dict[str, Entry]:
    result = {}
    for label, path in watched_paths(workspace).items():
        entry = _entry(path)
        if entry is not None:
            result[label] = entry
    return result


def save(vm_name: str, workspace: Path, prints: dict[str, Entry]) -> None:
    private_dir(paths.vm_state_dir(vm_name))
    data = {"workspace": str(workspace), "files": {k: list(v) for k, v in prints.items()}}
    atomic_write(record_file(vm_name), json.dumps(data), mode=0o600)


def load(vm_name: str) -> tuple[Path, dict[str, Entry]] | None:
    try:
        data = json.loads(record_file(vm_name).read_text())
    except (OSError, ValueError):
        return None
    return Path(data["workspace"]), {k: Entry(*v) for k, v in data["files"].items()}


def changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[tuple[str, str]]:
    """(label, "added" | "removed" | "modified"), sorted by label."""
    found = []
    for label in sorted(set(before) | set(after)):
        if label not in before:
            found.append((label, "added"))
        elif label not in after:
            found.append((label, "removed"))
        elif before[label].digest != after[label].digest:
            found.append((label, "modified"))
    return found


def report(before: dict[str, Entry], after: dict[str, Entry], stream=None) -> bool:  # noqa: ANN001
    """Print a loud warning for every change; return whether there was any."""
    stream = stream or sys.stderr
    found = changes(before, after)
    if not found:
        return False
    import difflib

    bar = "!" * 78
    lines = [bar, "agentbox: WARNING: the session changed files that your host runs without asking:"]
    for label, kind in found:
        lines.append(f"  {kind:9} {label}")
        old = before.get(label)
        new = after.get(label)
        diff = difflib.unified_diff(
            (old.text if old and old.text is not None else "").splitlines(),
            (new.text if new and new.text is not None else "").splitlines(),
            fromfile=f"{label} (before the session)",
            tofile=f"{label} (now)",
            lineterm="",
        )
        shown = list(diff)
        for line in shown[:MAX_DIFF_LINES]:
            lines.append(f"      {line}")
        if len(shown) > MAX_DIFF_LINES:
            lines.append(f"      ... {len(shown) - MAX_DIFF_LINES} more lines")
        if (old and old.text is None) or (new and new.text is None):
            lines.append(f"      ({_describe(new or old)})")
    lines.append("Review them before you run git, direnv, make, npm or your editor on the host.")
    lines.append("`agentbox audit` shows this again; the next launch takes the files as they are then.")
    lines.append(bar)
    print("\n".join(lines), file=stream, flush=True)
    return True


def _entry(path: Path) -> Entry | None:
    """Never follows a link and never opens anything but a regular file (a FIFO would block)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return Entry(f"link:{os.readlink(path)}", f"symlink -> {os.readlink(path)}")
        except OSError:
            return Entry("link:?", None)
    if not stat.S_ISREG(st.st_mode):
        return Entry(f"other:{stat.S_IFMT(st.st_mode)}", None)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            data = handle.read()
    except OSError:
        return Entry("file:unreadable", None)
    mode = "x" if st.st_mode & 0o111 else "-"
    digest = f"file:{mode}:{hashlib.sha256(data).hexdigest()}"
    text = None
    if len(data) <= MAX_TEXT and b"\0" not in data:
        text = data.decode("utf-8", "replace")
    return Entry(digest, text)


def _describe(entry: Entry | None) -> str:
    if entry is None:
        return "gone"
    if entry.digest.startswith("other:"):
        return "not a regular file"
    return "binary or large file; no diff shown"


def _list_dir(workspace: Path, folder: Path) -> dict[str, Path]:
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    return {_label(workspace, folder / name): folder / name for name in names}


def _label(workspace: Path, path: Path) -> str:
    try:
        return str(path.relative_to(workspace))
    except ValueError:
        return str(path)
