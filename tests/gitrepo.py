"""Real git repositories for tests: plain ones, and a hostile one whose config, hooks and attributes
try to run a program on the host (each leaves a marker file when it runs)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tests.helpers import write

IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def git(cwd: Path, *args: str, input: bytes | None = None, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The test's own git, as a user runs it (the repository's config applies)."""
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "protocol.file.allow=always", *args],
                          cwd=cwd, input=input, capture_output=True, check=check,
                          env={**os.environ, **IDENTITY, **(env or {})})


def init(path: Path, *extra: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", *extra)
    return path


def commit_all(path: Path, message: str = "commit") -> str:
    git(path, "add", "-A")
    git(path, "commit", "-q", "--allow-empty", "-m", message)
    return git(path, "rev-parse", "HEAD").stdout.decode().strip()


def user_state(repo: Path) -> dict[str, str]:
    """Digests of what a checkpoint must leave alone: the index, HEAD, every ref, log and stash, and
    every working tree file (name, mode and content)."""
    found: dict[str, str] = {}
    git_dir = repo / ".git"
    for name in ("index", "HEAD", "packed-refs", "ORIG_HEAD", "FETCH_HEAD"):
        if (git_dir / name).exists():
            found[f".git/{name}"] = _digest((git_dir / name).read_bytes())
    for folder in ("refs", "logs"):
        for path in sorted((git_dir / folder).rglob("*")):
            if path.is_file() and "agentbox" not in path.parts:
                found[str(path.relative_to(repo))] = _digest(path.read_bytes())
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            path = Path(root, name)
            st = os.lstat(path)
            content = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            found[str(path.relative_to(repo))] = f"{st.st_mode:o} {_digest(content)} {st.st_mtime_ns}"
    return found


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- a repository that tries to run things ---------------------------------------------------------

HOSTILE_NAMES = ("fsmonitor", "hook", "clean", "smudge", "textconv", "external", "pager", "alias")


def hostile(repo: Path, markers: Path) -> None:
    """Give repo a config, hooks and .gitattributes that run a script (leaving markers/<name>) if git
    obeys them: core.fsmonitor, core.hooksPath with every hook, a filter, a textconv, diff.external,
    core.pager and an alias."""
    markers.mkdir(parents=True, exist_ok=True)
    scripts = repo.parent / f"{repo.name}-scripts"
    hooks = scripts / "hooks"
    for name in HOSTILE_NAMES:
        write(scripts / name, f"#!/bin/sh\ntouch '{markers}/{name}'\ncat >/dev/null 2>&1 || true\n", mode=0o755)
    for hook in ("reference-transaction", "post-index-change", "pre-commit", "post-commit", "post-checkout"):
        write(hooks / hook, f"#!/bin/sh\ntouch '{markers}/hook'\n", mode=0o755)
        write(repo / ".git" / "hooks" / hook, f"#!/bin/sh\ntouch '{markers}/hook'\n", mode=0o755)
    config = repo / ".git" / "config"
    config.write_text(config.read_text() + (
        f"[core]\n\tfsmonitor = {scripts}/fsmonitor\n\thooksPath = {hooks}\n\tpager = {scripts}/pager\n"
                f'[filter "x"]\n\tclean = {scripts}/clean\n\tsmudge = {scripts}/smudge\n\trequired = true\n'
        f'[diff "x"]\n\ttextconv = {scripts}/textconv\n'
        f"[diff]\n\texternal = {scripts}/external\n"
        f"[alias]\n\tst = !{scripts}/alias\n"
    ))
    write(repo / ".gitattributes", "* filter=x diff=x\n")


def fired(markers: Path) -> list[str]:
    return sorted(path.name for path in markers.iterdir()) if markers.exists() else []


def git_folder_state(repo: Path) -> dict[str, str]:
    """Every entry under a repository's git folder, never followed: kind, mode, content (or link target) and
    mtime. agentbox's host side must leave all of it byte for byte as it was."""
    found: dict[str, str] = {}
    for root, dirs, files in os.walk(repo / ".git"):
        for name in [*dirs, *files]:
            path = Path(root, name)
            st = os.lstat(path)
            if path.is_symlink():
                content = os.readlink(path).encode()
            elif path.is_file():
                content = path.read_bytes()
            else:
                content = b""
            found[str(path.relative_to(repo))] = f"{st.st_mode:o} {_digest(content)} {st.st_mtime_ns}"
    return found
