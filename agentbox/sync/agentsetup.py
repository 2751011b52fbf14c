"""The agents' own setup, brought from the host into the VM at each launch: skills, settings, MCP servers, ...

What comes, per agent (its record in agentbox/agents/: `folder`, `sync_items`): Claude Code's CLAUDE.md, settings.json,
skills/, agents/, commands/, output-styles/ and plugins/ of ~/.claude (its user-scope MCP servers
travel in ~/.claude.json, a login file: credentials.stage_files filters them with
synctransform.claude_json); Codex's config.toml, AGENTS.md, prompts/ and skills/ of ~/.codex;
Gemini CLI's settings.json, GEMINI.md, commands/ and extensions/ of ~/.gemini; Kiro's steering/,
agents/, prompts/ and settings/mcp.json of ~/.kiro. `agents.<name>.sync.include` adds paths in the
agent's folder (never credentials, history, sessions, caches, logs or databases), `exclude` leaves
paths out, `sync.agentConfig: false` brings nothing. Files are transformed on the way
(synctransform.py), never copied blindly.

Links: a named entry (`skills/`, `settings.json`, an include) that is a symlink is followed, wherever
it points (you put it there). Inside a folder, a symlink is followed only when it resolves inside the
agent's folder or inside that entry's own target; one pointing elsewhere is not followed (and
`agentbox sync --show` says so). FIFOs, sockets and devices are skipped; files larger than
MAX_FILE, more than MAX_FILES files or more than MAX_TOTAL bytes per agent are left out.

Host side, every launch (agentbox.session.staging owns the folder's layout): `stage` walks the entries,
stats each file, and re-reads (and re-transforms) only a file whose size, times or inode changed
since it was staged (the same rule as credentials.stage_files, racy-clean second included), or when
what the transforms depend on changed (the VM's home, mounts, settings). An unchanged 50 MB plugin
folder costs one stat per file. Guest side, provision/launch.sh applies sync/AGENT/manifest: a file
is copied into the guest home only when the host's copy changed, and a file changed in the VM since
the last sync is kept (the launch says, once, which host version waits). The memory files (CLAUDE.md,
AGENTS.md, GEMINI.md) travel apart, in sync/memory-files, at every launch whichever agent it is: every launch
writes agentbox's block into each of them, and launch.sh does not count that block as an edit made in the VM.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import paths
from agentbox.agents.builtin import BUILTIN_AGENTS, NEVER_SYNC, AgentSpec
from agentbox.config.pins import RACY_NS
from agentbox.fsutil import private_dir, private_parents, read_capped, remove_unlisted, write_if_changed
from agentbox.safetext import visible
from agentbox.sync import transform as synctransform
from agentbox.vm import provisioning

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.vm.lima import Instance

MiB = 1024 * 1024
MAX_FILE = 64 * MiB
MAX_TOTAL = 512 * MiB
MAX_FILES = 10_000
_CHUNK = MiB

# The staging folder's sync/ part (agentbox.session.staging's docstring lists it).
SYNC = "sync"
DEFAULTS = "defaults"
MANIFEST = "manifest"
STAMPS = "stamps.json"
HOME = "home"
# The memory files of every agent, applied by launch.sh like an agent's own (`--sync memory-files`, after the
# launched agent's). No agent is named so: spec_of names only built-in agents.
MEMORY = "memory-files"


class Item(NamedTuple):
    relative: str  # relative to the home, on the host and in the VM: ".claude/skills/a/SKILL.md"
    inner: str  # relative to the agent's folder: "skills/a/SKILL.md"
    source: str  # the host file read (a followed link's target)
    st: os.stat_result  # of source


class Dropped(NamedTuple):
    shown: str  # "~/.claude/skills/evil"
    why: str


class Collected(NamedTuple):
    agent: str
    folder: str  # "~/.claude"
    items: list[Item]
    dropped: list[Dropped]


class FileView(NamedTuple):
    """One file as `agentbox sync --show` describes it."""

    item: Item
    size: int  # what the VM gets
    notes: list[synctransform.Note]
    problem: str | None


# -- what an agent brings ---------------------------------------------------------------------------


def spec_of(agent: AgentConfig) -> AgentSpec | None:
    """The built-in description of what to sync, for an agent that has a folder of its own."""
    spec = BUILTIN_AGENTS.get(agent.name)
    return spec if spec is not None and spec.folder else None


def collect(agent: AgentConfig, spec: AgentSpec, home: Path, only: tuple[str, ...] | None = None) -> Collected:
    """The files to bring for one agent (nothing read yet, only listed and stat'ed) and what was left out;
    `only`: these entries of its folder instead of all it brings."""
    assert spec.folder is not None
    shown_root = f"~/{spec.folder}"
    collected = Collected(agent.name, shown_root, [], [])
    root = os.path.join(home, spec.folder)
    if not os.path.isdir(root):
        return collected
    walker = _Walker(agent, spec, root, shown_root, collected)
    for entry in _entries(agent, spec, root, collected) if only is None else only:
        walker.entry(entry)
    return collected


def memory_entry(spec: AgentSpec) -> str | None:
    """The agent's memory file (CLAUDE.md, AGENTS.md, GEMINI.md) relative to its folder, when it is one of the
    entries it brings: it travels in the MEMORY group at every launch, whichever agent is launched, because
    every launch writes agentbox's block into all of them (provision/launch/context.sh)."""
    prefix = f"~/{spec.folder}/"
    if spec.folder and spec.memory_file and spec.memory_file.startswith(prefix):
        inner = spec.memory_file[len(prefix):]
        return inner if inner in spec.sync_items else None
    return None


def _entries(agent: AgentConfig, spec: AgentSpec, root: str, collected: Collected) -> list[str]:
    """Built-in entries, then sync.include (globs expanded in the agent's folder), without duplicates."""
    entries = [item.rstrip("/") for item in spec.sync_items]
    never = (*NEVER_SYNC, *spec.never_sync)
    credentials = {os.path.normpath(os.path.expanduser(path)) for path in agent.credentials}
    for pattern in agent.sync.include:
        pattern = pattern.strip("/")
        found = _expanded(pattern, root)
        for inner in found:
            shown = visible(f"{collected.folder}/{inner}")
            if any(fnmatch.fnmatchcase(part, rule) for part in inner.split("/") for rule in never) or (
                os.path.normpath(os.path.join(root, inner)) in credentials
            ):
                collected.dropped.append(Dropped(shown, "credentials, history, sessions, caches, logs and databases "
                                                 "stay on the host (sync.include cannot bring them)"))
            elif inner not in entries:
                entries.append(inner)
    return entries


class _Walker:
    def __init__(self, agent: AgentConfig, spec: AgentSpec, root: str, shown_root: str, collected: Collected) -> None:
        self.agent = agent
        self.spec = spec
        self.root = root
        self.root_real = os.path.realpath(root)
        self.shown_root = shown_root
        self.out = collected
        self.total = 0
        self.full = False
        self.visited: set[str] = set()
        self.listed: set[str] = set()

    def shown(self, inner: str) -> str:
        return visible(f"{self.shown_root}/{inner}")

    def drop(self, inner: str, why: str) -> None:
        self.out.dropped.append(Dropped(self.shown(inner), why))

    def excluded(self, inner: str) -> bool:
        if not self.agent.sync.exclude:
            return False
        parts = inner.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        for pattern in self.agent.sync.exclude:
            pattern = pattern.strip("/")
            if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
                return True
        return False

    def entry(self, inner: str) -> None:
        """A named entry: followed when it is a symlink, wherever it points."""
        if self.excluded(inner):
            self.drop(inner, "left out by sync.exclude")
            return
        path = os.path.join(self.root, inner)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            self.drop(inner, f"cannot read it: {exc.strerror}")
            return
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(path)
            try:
                st = os.stat(target)
            except OSError:
                self.drop(inner, f"a symlink to {target}, which does not exist")
                return
            path = target
        if stat.S_ISDIR(st.st_mode):
            self.walk(path, inner, (self.root_real, os.path.realpath(path)))
        elif stat.S_ISREG(st.st_mode):
            self.file(inner, path, st)
        else:
            self.drop(inner, "not a regular file (a FIFO, socket or device)")

    def walk(self, directory: str, prefix: str, allowed: tuple[str, ...]) -> None:
        real = os.path.realpath(directory)
        if real in self.visited:
            return  # a link back to a folder already walked
        self.visited.add(real)
        try:
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            self.drop(prefix, f"cannot read the folder: {exc.strerror}")
            return
        for entry in entries:
            inner = f"{prefix}/{entry.name}"
            if not entry.name.isprintable():  # control characters, or bytes that are not UTF-8 (surrogates)
                self.drop(inner, "its name has control characters or is not UTF-8")
                continue
            if self.excluded(inner):
                self.drop(inner, "left out by sync.exclude")
                continue
            try:
                if entry.is_symlink():
                    self.link(entry.path, inner, allowed)
                elif entry.is_dir(follow_symlinks=False):
                    self.walk(entry.path, inner, allowed)
                elif entry.is_file(follow_symlinks=False):
                    self.file(inner, entry.path, entry.stat(follow_symlinks=False))
                else:
                    self.drop(inner, "not a regular file (a FIFO, socket or device)")
            except OSError as exc:
                self.drop(inner, f"cannot read it: {exc.strerror}")

    def link(self, path: str, inner: str, allowed: tuple[str, ...]) -> None:
        target = os.path.realpath(path)
        if not any(target == folder or target.startswith(folder.rstrip("/") + "/") for folder in allowed):
            self.drop(inner, f"a symlink to {target}, outside {self.shown_root}: not followed")
            return
        try:
            st = os.stat(target)
        except OSError:
            self.drop(inner, f"a symlink to {target}, which does not exist")
            return
        if stat.S_ISDIR(st.st_mode):
            self.walk(target, inner, allowed)
        elif stat.S_ISREG(st.st_mode):
            self.file(inner, target, st)
        else:
            self.drop(inner, "a symlink to something that is not a regular file")

    def file(self, inner: str, source: str, st: os.stat_result) -> None:
        if self.full or inner in self.listed:  # an include inside a folder that is brought anyway
            return
        if len(self.out.items) >= MAX_FILES or self.total + st.st_size > MAX_TOTAL:
            self.full = True
            self.drop(inner, f"this and the files after it are left out: more than {MAX_FILES:,} files or "
                      f"{MAX_TOTAL // MiB} MiB for one agent (sync.exclude can leave out what the VM needs least)")
            return
        if st.st_size > MAX_FILE:
            self.drop(inner, f"larger than {MAX_FILE // MiB} MiB")
            return
        self.total += st.st_size
        self.listed.add(inner)
        self.out.items.append(Item(f"{self.spec.folder}/{inner}", inner, source, st))


# -- what the transforms need -----------------------------------------------------------------------


def _expanded(pattern: str, root: str) -> list[str]:
    """A sync.include entry in the agent's folder: what it matches when it has wildcards, else itself."""
    # deferred: start-up (glob: only a sync.include entry, which few configs have)
    import glob

    return sorted(glob.glob(pattern, root_dir=root, recursive=True)) if glob.has_magic(pattern) else [pattern]


def guest_home_of(instance: Instance | None) -> str:
    """The VM user's home as Lima reports it; before the VM exists, Lima's default (/home/USER.guest)."""
    home = ((instance.config if instance else {}).get("user") or {}).get("home")
    if isinstance(home, str) and home.startswith("/"):
        return home
    # deferred: start-up (getpass and termios: only before the VM exists)
    import getpass

    return f"/home/{getpass.getuser()}.guest"


def context_for(config: Config, agent: AgentConfig, guest_home: str, staging_folder: Path) -> synctransform.Context:
    spec = spec_of(agent)
    home = str(paths.home())
    mounts = [(str(config.workspace), str(config.workspace)), (str(staging_folder), str(staging_folder))]
    mounts += [(str(mount.location), mount.mount_point) for mount in config.mounts]
    synced = tuple(f"{home}/{spec.folder}/{entry.rstrip('/')}" for entry in spec.sync_items) if spec else ()
    return synctransform.Context(
        agent=agent.name,
        host_home=home,
        guest_home=guest_home,
        mounts=tuple(sorted(mounts, key=lambda mount: len(mount[0]), reverse=True)),
        synced=synced,
        mcp_secrets=agent.sync.mcp_secrets,
        workspace=str(config.workspace),
    )


def login_transforms(
    config: Config, guest_home: str, staging_folder: Path
) -> dict[str, tuple[str, Callable[[bytes], bytes]]]:
    """{path relative to the home: (key, transform)} for the login files the credentials stage through a
    transform (AgentSpec.login_transforms; ~/.claude.json: MCP servers filtered, or all left out)."""
    found = {}
    for name, spec in BUILTIN_AGENTS.items():
        for relative, transform in spec.login_transforms:
            found[relative] = _login_transform(config, config.agents[name], transform, guest_home, staging_folder)
    return found


def _login_transform(
    config: Config, agent: AgentConfig, name: str, guest_home: str, staging_folder: Path
) -> tuple[str, Callable[[bytes], bytes]]:
    context = context_for(config, agent, guest_home, staging_folder)
    bring = config.sync_agent_config
    function = synctransform.LOGIN_TRANSFORMS[name]

    def transform(data: bytes) -> bytes:
        return function(data, context, [], bring)

    return f"{context.key()}:{int(bring)}", transform


# -- staging ------------------------------------------------------------------------------------------


def stage(staging: Path, config: Config, agents: list[AgentConfig], guest_home: str) -> list[str]:
    """Bring staging/sync up to date for these agents; returns warnings (files left out, and why)."""
    root = staging / SYNC
    if not config.sync_agent_config:
        if root.exists():
            shutil.rmtree(root)
        return []
    warnings: list[str] = []
    private_dir(root)
    write_if_changed(root / DEFAULTS, defaults_manifest())
    for agent in agents:
        spec = spec_of(agent)
        if spec is None:
            continue
        context = context_for(config, agent, guest_home, staging)
        collected = collect(agent, spec, paths.home())
        memory = memory_entry(spec)
        collected.items[:] = [item for item in collected.items if item.inner != memory]
        warnings += _stage_agent(root / agent.name, [(collected, context)])
    memories = []
    for agent in config.agents.values():
        spec = spec_of(agent)
        memory = memory_entry(spec) if spec is not None else None
        if spec is not None and memory is not None:
            memories.append((collect(agent, spec, paths.home(), (memory,)),
                             context_for(config, agent, guest_home, staging)))
    warnings += _stage_agent(root / MEMORY, memories)
    return warnings


def defaults_manifest() -> bytes:
    """"SHA256 PATH" records of the settings a new VM gets (provisioning.home_files): the VM's copy is
    agentbox's, not the user's edit, while it still has that digest."""
    files = provisioning.home_files()
    return "".join(f"{hashlib.sha256(text.encode()).hexdigest()} {path}\0" for path, text in files.items()).encode()


def _stage_agent(agent_dir: Path, parts: list[tuple[Collected, synctransform.Context]]) -> list[str]:
    private_dir(agent_dir)
    files = agent_dir / HOME
    previous = _load_stamps(agent_dir / STAMPS)
    stamps: dict[str, Any] = {}
    records: list[str] = []
    warnings: list[str] = []
    made: set[str] = set()
    for collected, context in parts:
        key = context.key()
        for item in collected.items:
            stamp = _stage_file(item, files, previous.get(item.relative), key, context, made)
            stamps[item.relative] = stamp
            if stamp["problem"]:
                warnings.append(f"{_shown(item)}: {visible(stamp['problem'])}; it was not brought into the VM")
                continue
            records.append(f"{stamp['digest']} {stamp['mode']:o} {item.relative}\0")
    staged = {relative for relative, stamp in stamps.items() if not stamp["problem"]}
    before = {relative for relative, stamp in previous.items() if isinstance(stamp, dict) and not stamp.get("problem")}
    if staged != before:
        remove_unlisted(files, staged)  # only a path staged before and not now can have left a copy behind
    write_if_changed(agent_dir / MANIFEST, "".join(records).encode())
    write_if_changed(agent_dir / STAMPS, json.dumps(stamps, sort_keys=True).encode())
    return warnings


def _shown(item: Item) -> str:
    return visible(f"~/{item.relative}")


def _stage_file(item: Item, files: Path, previous: Any, key: str, context: synctransform.Context,
                made: set[str]) -> dict[str, Any]:
    """Stage one file unless its stamp shows it unchanged; its new stamp. made: the staged folders known to
    exist, private (a first sync of a skills folder checks each once, not once per file)."""
    st = item.st
    signature = [item.source, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    target_path = f"{files}/{item.relative}"  # a string: this runs for every file at every launch
    mode = 0o700 if st.st_mode & stat.S_IXUSR else 0o600
    if (
        isinstance(previous, dict)
        and previous.get("sig") == signature
        and previous.get("key") == key
        and isinstance(previous.get("at"), int)
        and previous["at"] - st.st_ctime_ns > RACY_NS
        and (previous.get("problem") or _staged_size(target_path, previous.get("mode")) == previous.get("size"))
    ):
        return dict(previous)  # not opened at all
    stamp: dict[str, Any] = {"sig": signature, "key": key, "at": time.time_ns(), "mode": mode, "digest": None,
                             "size": None, "problem": None}
    old = previous if isinstance(previous, dict) else {}
    transform = synctransform.transform_for(context.agent, item.inner)
    try:
        fd = _open(item.source)
        with os.fdopen(fd, "rb") as handle:
            if transform is synctransform.text and st.st_size > synctransform.MAX_REWRITTEN:
                digest, size = _copy_streamed(handle, Path(target_path), files, mode, old.get("digest"))
            else:
                data = _read_small(fd)
                data = transform(data, context, [])
                digest, size = hashlib.sha256(data).hexdigest(), len(data)
                if not (old.get("digest") == digest and _staged_size(target_path, mode) == size):
                    parent, _, name = target_path.rpartition("/")
                    if parent not in made:
                        private_parents(files, Path(parent))
                        made.add(parent)
                    _replace(parent, name, data, mode)
    except synctransform.Unusable as exc:
        stamp["problem"] = str(exc)
        return stamp
    except OSError as exc:
        stamp["problem"] = f"cannot read it: {exc.strerror}"
        return stamp
    stamp.update(digest=digest, size=size)
    return stamp


def _replace(parent: str, name: str, data: bytes, mode: int) -> None:
    """atomic_write without its fsync: a staged copy is made anew whenever it is missing or wrong, and hundreds
    of fsyncs would make a first sync of a skills folder take seconds."""
    target = f"{parent}/{name}"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _read_small(fd: int) -> bytes:
    """A file read whole (at most MAX_FILE bytes) into a buffer of its own size."""
    data = read_capped(fd, MAX_FILE)
    if len(data) > MAX_FILE:
        raise OSError(0, f"it grew past {MAX_FILE // MiB} MiB while it was read")
    return data


def _open(source: str) -> int:
    """The file, never through a link swapped in since it was listed, never blocking on a FIFO."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(0, "it is not a regular file")
    return fd


def _copy_streamed(handle: Any, target: Path, files: Path, mode: int, old_digest: str | None) -> tuple[str, int]:
    """A large file copied as it is, hashed on the way; the staged copy is replaced only when it differs."""
    private_parents(files, target.parent)
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
                if size > MAX_FILE:
                    raise OSError(0, f"it grew past {MAX_FILE // MiB} MiB while it was read")
        hexdigest = digest.hexdigest()
        if old_digest == hexdigest and _staged_size(target, mode) == size:
            os.unlink(tmp)
        else:
            os.chmod(tmp, mode)
            os.replace(tmp, target)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return hexdigest, size


def _staged_size(target: Path | str, mode: Any) -> int | None:
    try:
        st = os.lstat(target)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode else None


def _load_stamps(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


# -- describing it ------------------------------------------------------------------------------------


def describe(config: Config, agent: AgentConfig, guest_home: str, staging_folder: Path) -> list[FileView]:
    """Every file the agent would bring, read and transformed as a launch would, with what changed in it."""
    spec = spec_of(agent)
    if spec is None:
        return []
    context = context_for(config, agent, guest_home, staging_folder)
    views = []
    for item in collect(agent, spec, paths.home()).items:
        views.append(view_of(item, context))
    return views


def view_of(item: Item, context: synctransform.Context) -> FileView:
    notes: list[synctransform.Note] = []
    transform = synctransform.transform_for(context.agent, item.inner)
    if transform is synctransform.text and item.st.st_size > synctransform.MAX_REWRITTEN:
        return FileView(item, item.st.st_size, notes, None)
    try:
        fd = _open(item.source)
        try:
            data = transform(_read_small(fd), context, notes)
        finally:
            os.close(fd)
    except synctransform.Unusable as exc:
        return FileView(item, 0, notes, str(exc))
    except OSError as exc:
        return FileView(item, 0, notes, f"cannot read it: {exc.strerror}")
    return FileView(item, len(data), notes, None)
