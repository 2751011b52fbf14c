"""Host logins for the VM: staged read-only, copied into the guest home only when the host's copy changed.

Host side (here): on each launch, refresh `staging/creds/` with exactly the configured files (0600
files in 0700 folders, never a whole home directory) and a manifest of their digests. Guest side
(launch.sh): copy a file into the guest home only when its digest differs from the one it last
applied, so a token the agent refreshed in the VM survives until the host's copy changes.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from agentbox import paths
from agentbox.fsutil import private_dir, write_if_changed

GH_FILES = ("~/.config/gh/hosts.yml", "~/.config/gh/config.yml")
NETRC = "~/.netrc"
# Host paths that live elsewhere in the Linux guest.
_GUEST_PATH = {"~/Library/Application Support/kiro-cli/": "~/.local/share/kiro-cli/"}
# git settings that mean the same in the VM and carry no secret or host-only program.
SAFE_GIT_KEYS = (
    "user.name",
    "user.email",
    "init.defaultbranch",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "merge.conflictstyle",
    "rebase.autosquash",
    "rebase.autostash",
    "fetch.prune",
    "diff.algorithm",
    "color.ui",
    "core.autocrlf",
)


class Staged(NamedTuple):
    guest_path: str  # relative to the guest home
    host_path: Path
    digest: str


def guest_path_for(host_path: str) -> str:
    for prefix, replacement in _GUEST_PATH.items():
        if host_path.startswith(prefix):
            return replacement + host_path[len(prefix):]
    return host_path


def refresh(staging: Path, host_files: list[str], include_git_identity: bool) -> tuple[list[Staged], list[str]]:
    """Stage host_files (`~/...` paths) under staging/creds; return what was staged and warnings."""
    creds = private_dir(staging / "creds")
    files_root = creds / "home"
    staged: list[Staged] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for spec in host_files:
        guest = guest_path_for(spec)
        if not guest.startswith("~/") or guest in seen:
            continue
        seen.add(guest)
        host = Path(os.path.expanduser(spec))
        try:
            data = host.read_bytes()
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            warnings.append(f"credential {host} is a folder, not a file; skipped")
            continue
        except OSError as exc:
            warnings.append(f"cannot read credential file {host}: {exc.strerror}; skipped")
            continue
        relative = guest[2:]
        target = files_root / relative
        _private_parents(files_root, target.parent)
        write_if_changed(target, data)
        staged.append(Staged(relative, host, hashlib.sha256(data).hexdigest()))
    _remove_unlisted(files_root, {s.guest_path for s in staged})
    manifest = "".join(f"{s.digest} {s.guest_path}\0" for s in staged).encode()
    write_if_changed(creds / "manifest", manifest)
    _refresh_git_identity(creds, include_git_identity)
    return staged, warnings


def _refresh_git_identity(creds: Path, wanted: bool) -> None:
    """Re-read ~/.gitconfig (a `git config` run) only when it changed since the last launch."""
    target, stamp_file = creds / "gitconfig", creds / "gitconfig.stamp"
    source = paths.home() / ".gitconfig"
    try:
        st = source.stat()
        stamp = f"{st.st_mtime_ns}:{st.st_size}:{st.st_ino}"
    except OSError:
        stamp = "absent"
    if not wanted:
        stamp = "off"
    try:
        if stamp_file.read_text() == stamp:
            return
    except OSError:
        pass
    gitconfig = git_identity() if wanted else ""
    if gitconfig:
        write_if_changed(target, gitconfig.encode())
    elif target.exists():
        target.unlink()
    write_if_changed(stamp_file, stamp.encode())


def git_identity() -> str:
    """The safe part of the host's ~/.gitconfig, as a gitconfig file ('' when there is none)."""
    source = paths.home() / ".gitconfig"
    git = shutil.which("git")
    if not source.is_file() or git is None:
        return ""
    try:
        output = subprocess.run(
            [git, "config", "--file", str(source), "--includes", "--list", "-z"],
            capture_output=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    sections: dict[str, list[str]] = {}
    for entry in output.split(b"\0"):
        if not entry:
            continue
        key, _, value = entry.decode("utf-8", "replace").partition("\n")
        if key.lower() not in SAFE_GIT_KEYS:
            continue
        section, name = key.lower().split(".", 1)
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        sections.setdefault(section, []).append(f'\t{name} = "{escaped}"')
    return "".join(f"[{section}]\n" + "\n".join(lines) + "\n" for section, lines in sections.items())


def gh_token_from_keychain() -> str | None:
    """macOS keeps gh's token in the Keychain: when hosts.yml has none, ask the host's gh for it."""
    hosts = Path(os.path.expanduser(GH_FILES[0]))
    gh = shutil.which("gh")
    if gh is None or not hosts.is_file():
        return None
    try:
        if b"oauth_token" in hosts.read_bytes():
            return None
        result = subprocess.run([gh, "auth", "token"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    token = result.stdout.decode().strip()
    return token if result.returncode == 0 and token else None


def _private_parents(root: Path, directory: Path) -> None:
    """directory and every folder from root down to it: 0700 (mkdir(parents=True) gives parents the umask's mode)."""
    current = private_dir(root)
    for part in directory.relative_to(root).parts:
        current = private_dir(current / part)


def _remove_unlisted(root: Path, keep: set[str]) -> None:
    if not root.exists():
        return
    for path in sorted(root.rglob("*"), reverse=True):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and relative not in keep:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def warn(messages: list[str]) -> None:
    for message in messages:
        print(f"agentbox: warning: {message}", file=sys.stderr)
