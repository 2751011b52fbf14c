"""Host logins for the VM: which files, copied only when they changed, and the safe part of ~/.gitconfig.

Host side (here, called by agentbox.session.staging, which owns the folder's layout): on each launch, copy
exactly the configured files (0600 files in 0700 folders, never a whole home directory) into the
staging folder. A file whose size, mtime, ctime and inode are those recorded when it was staged is
not read again. Guest side (launch.sh): copy a file into the guest home only when its digest
differs from the one it last applied, so a token the agent refreshed in the VM survives until the
host's copy changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import hosttools, paths
from agentbox.agents.builtin import guest_paths
from agentbox.config.pins import RACY_NS
from agentbox.fsutil import atomic_write, private_parents, remove_unlisted, write_if_changed

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config

GH_FILES = ("~/.config/gh/hosts.yml", "~/.config/gh/config.yml")
NETRC = "~/.netrc"
# A stamps file holds, by guest path: [host path, size, mtime_ns, ctime_ns, inode, device, sha256, hashed at (ns)],
# and for a file staged through a transform, a ninth element: {"transform": its key, "size": the staged size}.
_DIGEST = 6
_HASHED_AT = 7
_TRANSFORMED = 8
# A file staged as a transform makes it (guest path -> (key, transform)): the key names what the result depends
# on besides the file, so a change of it re-makes the copy. A transform raises ValueError for a file it cannot use.
Transforms = Mapping[str, tuple[str, Callable[[bytes], bytes]]]
# Host paths that live elsewhere in the Linux guest (the agents' records: AgentSpec.guest_paths).
_GUEST_PATH = guest_paths()
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
    mtime_ns: int = 0  # the host file's, when it was staged


def guest_path_for(host_path: str) -> str:
    for prefix, replacement in _GUEST_PATH.items():
        if host_path.startswith(prefix):
            return replacement + host_path[len(prefix):]
    return host_path


def stage_files(
    files_root: Path, stamps_file: Path, host_files: list[str], transforms: Transforms | None = None
) -> tuple[list[Staged], list[str]]:
    """Copy host_files (`~/...` paths) under files_root at their guest paths; return what was staged and warnings.

    Files no longer listed are removed. Several host paths may land on one guest path (Kiro's macOS
    and Linux locations): the first one that exists wins. A file whose stat signature is the one
    recorded in stamps_file when it was last staged is neither read nor hashed again (a Kiro
    database can be tens of MB, and this runs at every launch). A file named in `transforms` (by
    guest path) is staged as its transform makes it (~/.claude.json: its MCP servers filtered).
    """
    recorded = _load_stamps(stamps_file)
    stamps: dict[str, list[Any]] = {}
    staged: list[Staged] = []
    warnings: list[str] = []
    done: set[str] = set()
    for spec in host_files:
        guest = guest_path_for(spec)
        if not guest.startswith("~/") or guest in done:
            continue
        relative = guest[2:]
        host = Path(os.path.expanduser(spec))
        transform = (transforms or {}).get(relative)
        stamp = _stage(host, files_root, relative, recorded.get(relative), warnings, transform)
        if stamp is None:
            continue  # absent or unusable: a later host path for the same guest path may have it
        done.add(guest)
        stamps[relative] = stamp
        staged.append(Staged(relative, host, stamp[_DIGEST], stamp[2]))
    remove_unlisted(files_root, {s.guest_path for s in staged})
    write_if_changed(stamps_file, json.dumps(stamps, sort_keys=True).encode())
    return staged, warnings


def _stage(
    host: Path,
    files_root: Path,
    relative: str,
    previous: list[Any] | None,
    warnings: list[str],
    transform: tuple[str, Callable[[bytes], bytes]] | None = None,
) -> list[Any] | None:
    """Copy one host file to files_root/relative unless its stamp shows it unchanged; its new stamp, or None."""
    target = files_root / relative
    key = transform[0] if transform else None
    try:
        st = os.stat(host)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        warnings.append(f"cannot read credential file {host}: {exc.strerror}; skipped")
        return None
    if _unchanged(previous, _signature(host, st), target, key):
        return previous  # not opened at all
    if stat.S_ISDIR(st.st_mode):
        warnings.append(f"credential {host} is a folder, not a file; skipped")
        return None
    if not stat.S_ISREG(st.st_mode):
        warnings.append(f"credential {host} is not a regular file; skipped")
        return None
    try:
        # The signature is the one taken before reading, so a change made while reading leaves a stamp
        # that no longer matches and the next launch reads the file again. O_NONBLOCK: a FIFO put there
        # since the stat does not hang the launch.
        fd = os.open(host, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                warnings.append(f"credential {host} is not a regular file; skipped")
                return None
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.append(f"cannot read credential file {host}: {exc.strerror}; skipped")
        return None
    if transform is not None:
        try:
            data = transform[1](data)
        except ValueError as exc:
            warnings.append(f"{host}: {exc}; it was not brought into the VM")
            return None
    digest = hashlib.sha256(data).hexdigest()
    private_parents(files_root, target.parent)
    if not (isinstance(previous, list) and len(previous) in (8, 9) and previous[_DIGEST] == digest
            and _staged_size(target) == len(data)):
        atomic_write(target, data, mode=0o600)
    stamp = [*_signature(host, st), digest, time.time_ns()]
    return stamp if key is None else [*stamp, {"transform": key, "size": len(data)}]


def _signature(host: Path, st: os.stat_result) -> list[Any]:
    return [str(host), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _unchanged(previous: Any, signature: list[Any], target: Path, key: str | None = None) -> bool:
    """The same file with the same size, times and inode as when it was staged (through the same transform),
    and its copy still there.

    Like git's racy-clean rule (and agentbox.config.pins): a file hashed within a second of its last change
    may have changed again within the same timestamp tick, so that stamp is not trusted.
    """
    if not isinstance(previous, list) or len(previous) not in (8, 9):
        return False
    transformed = previous[_TRANSFORMED] if len(previous) == 9 else None
    if key is not None:
        if not isinstance(transformed, dict) or transformed.get("transform") != key:
            return False
        staged_size = transformed.get("size")
    elif transformed is not None:
        return False
    else:
        staged_size = signature[1]
    return (
        previous[:_DIGEST] == signature
        and isinstance(previous[_HASHED_AT], int)
        and previous[_HASHED_AT] - signature[3] > RACY_NS
        and _staged_size(target) == staged_size
    )


def _staged_size(target: Path) -> int | None:
    try:
        st = os.lstat(target)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 else None


def _load_stamps(stamps_file: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(stamps_file.read_bytes())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def refresh_git_identity(target: Path, stamp_file: Path, wanted: bool) -> None:
    """target: git_identity() when wanted (absent when empty), remade only when ~/.gitconfig changed
    since stamp_file was written (each check would otherwise run `git config`)."""
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
    git = hosttools.which("git")
    if not source.is_file() or git is None:
        return ""
    try:
        output = subprocess.run(
            [git, "config", "--file", str(source), "--includes", "--list", "-z"],
            capture_output=True, timeout=10, check=True, env=hosttools.environ(),
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
    gh = hosttools.which("gh")
    if gh is None or not hosts.is_file():
        return None
    try:
        if b"oauth_token" in hosts.read_bytes():
            return None
        result = subprocess.run([gh, "auth", "token"], capture_output=True, timeout=10, env=hosttools.environ())
    except (OSError, subprocess.SubprocessError):
        return None
    token = result.stdout.decode().strip()
    return token if result.returncode == 0 and token else None


def launch_files(config: Config, agent: AgentConfig | None) -> list[str]:
    """The host login files (`~/...`) this launch stages: the agent's (every agent's for a shell), gh's, .netrc."""
    settings = config.credentials
    if not settings.enabled:
        return []
    agents = [agent] if agent is not None else list(config.agents.values())
    files = [path for a in agents for path in a.credentials]
    if settings.gh:
        files += list(GH_FILES)
    if settings.netrc:
        files.append(NETRC)
    return files
