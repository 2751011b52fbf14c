"""A tripwire on workspace files the host runs without asking.

The agent can write anything in the workspace, and some of it the host later executes on its own:
git hooks and .git/config (core.fsmonitor, core.hooksPath, filters and aliases run on the next
`git status`), .envrc (direnv), editor tasks, husky and pre-commit hooks, package.json scripts,
Makefiles, CI workflows, and the project files the host's own coding agents run or start programs from
(Claude Code's settings and .mcp.json, Gemini CLI's, Cursor's, VS Code's, Kiro's, opencode's and Codex's
settings, MCP server lists, hook scripts and plugins: HOST_AGENT_FILES, HOST_AGENT_DIRS). In the git folders
that host git reads, wherever they lie (a linked worktree's common dir too): config, config.worktree,
info/attributes, commondir and hooks/ of the common dir and of each submodule's folder under modules/, and each
linked worktree's commondir, gitdir and config.worktree (its submodules' folders too). agentbox fingerprints
exactly these paths (no tree walk: only hooks/, modules/, worktrees/ and the few watched folders are listed, one
level, so it stays fast on any repository) before a session and compares after it, naming every change loudly.

A change stays reported until the user accepts it. One record per workspace (every agent's VM of
that workspace shares it), in agentbox's state folder outside the workspace, keeps:

- `pending`: every change not yet acknowledged, as (earliest before, latest after) per file;
- `reference`: the accepted state of every other file, as the last session found it when it
  started (or as the last acknowledgement did).

Each launch first adds what changed since the reference (something still running in the VM after
the session ended, or the user on the host: agentbox cannot tell them apart) to the pending changes
and reminds the user of them; each session end adds its own changes; `agentbox audit` shows them
all with diffs and `agentbox audit --ack` accepts them. A file that is back as it was before every
pending change has nothing left to accept. Everything agent-written is escaped before printing.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple, Protocol, TextIO

from agentbox import livemarkers, paths
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.fsutil import atomic_write, locked, pid_alive, private_dir
from agentbox.git import dirs
from agentbox.safetext import visible

WATCHED_FILES = (
    ".git",  # a `gitdir:` file there decides which git folder (config, hooks) host git uses
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
    "agentbox.yml",  # agentbox's own config: a change can weaken review (checkpoints) or ask for trust next time
)
WATCHED_DIRS = (".husky", ".github/workflows")
# Since list 3: what the host's own coding agents run or start from a project when the user opens it there (each
# agent's record names its own: AgentSpec.host_run_files; each tool's documented project files): hooks and
# status-line commands, MCP servers they start, plugins they load; a folder's scripts are the ones those settings
# conventionally name (a hook's command is a path in the project, so rewriting the script is enough). Beside the
# agents', the editors' that run agents on the host: Cursor's (it also loads Claude Code's hooks) and VS Code's.
EDITOR_FILES = (".cursor/mcp.json", ".cursor/hooks.json", ".vscode/mcp.json", ".cursor/hooks/")
HOST_AGENT_FILES = tuple(dict.fromkeys(
    entry.rstrip("/") for spec in BUILTIN_AGENTS.values() for entry in spec.host_run_files + EDITOR_FILES
    if not entry.endswith("/")))
HOST_AGENT_DIRS = tuple(dict.fromkeys(
    entry.rstrip("/") for spec in BUILTIN_AGENTS.values() for entry in spec.host_run_files + EDITOR_FILES
    if entry.endswith("/")))
# In a git folder (the common dir, and each submodule's under its modules/): `commondir` redirects git
# to another folder's config and hooks; hooks/ is watched whole.
GIT_FILES = ("config", "config.worktree", "info/attributes", "commondir")
# In each `worktrees/<id>` of the common dir: where that checkout's host git finds its common dir and
# its work tree, and (with extensions.worktreeConfig) its own config; its submodules are under modules/.
WORKTREE_FILES = ("commondir", "gitdir", "config.worktree")
MAX_LISTED = 1000  # entries of a modules/ or worktrees/ folder looked at: bounded however it grows
# The list's version, kept in each record. 2 added the modules/ and worktrees/ files, 3 the host agents' files: a
# record of an older list takes the files only the newer list watches as they are (nobody was asked about them).
WATCH_LIST = 3
MAX_TEXT = 64 * 1024
MAX_DIFF_LINES = 40
MAX_NAMES = 10
BAR = "!" * 78
AFTER_SESSION = "changed after the last session started"
CHANGED_AGAIN = "changed again after agentbox last looked"
AGENTBOX_WORKTREES = ".agentbox/worktrees"  # agentbox.session.worktrees.FOLDER
ACK_HINT = "run `agentbox audit` to see the diffs, `agentbox audit --ack` to accept them"


class Busy(Protocol):
    """What else of the project ran: given by the session layer, which knows tasks and the VMs."""

    def __call__(self, since: float) -> bool:
        """Whether a task or a session of the project ran at any time since `since` (or runs now)."""

    def vm_busy(self, vm_name: str) -> bool:
        """Whether a session or task runs in that VM now."""


class Entry(NamedTuple):
    digest: str  # "file:<mode>:<sha256>", "link:<target>", or "other:<kind>"
    text: str | None  # small text files, kept for a diff


class Change(NamedTuple):
    label: str
    before: Entry | None
    after: Entry | None
    note: str = ""  # how it came about, when not simply in a finished session

    @property
    def kind(self) -> str:
        if self.before is None:
            return "added"
        return "removed" if self.after is None else "modified"


Pending = dict[str, tuple[Entry | None, Entry | None]]


class Record(NamedTuple):
    workspace: Path
    reference: dict[str, Entry]
    pending: Pending
    watching: int = WATCH_LIST
    looked: float | None = None  # when a session's end (or an acknowledgement) last compared the files
    live: Mapping[str, int] = MappingProxyType({})  # session -> pid, between its start and end check
    kept: Mapping[str, float] = MappingProxyType({})  # VM a kept session went on in -> when


# -- what is watched ---------------------------------------------------------------------------


def watched_paths(workspace: Path) -> dict[str, Path]:
    """Label (as shown to the user) -> path. Only fixed paths and a few small folders are listed.

    The git folders come from gitdirs.locate: a `.git` file pointing somewhere it did not validate
    is not followed (the `.git` file itself is watched).
    """
    return _watched(workspace)[0]


def host_exec_matcher(workspace: Path) -> Callable[[str], bool]:
    """Whether a repository-relative path (as a patch names it) is one the tripwire watches, or lies
    in a folder whose every file it watches (.husky, .github/workflows, the hooks of a git folder
    kept in the workspace). Names are compared as a case-insensitive file system sees them."""
    # deferred: start-up (review.patchcheck: tests/test_own_time.py keeps it off the launch)
    from agentbox.review import patchcheck  # a launch's tripwire never reads a patch: imported by those that do

    root = Path(os.path.realpath(workspace))
    watched, folders = _watched(workspace)
    names = {patchcheck.fold(label) for label in watched if not os.path.isabs(label)}
    inside = [_label(root, folder) for folder in folders]
    prefixes = tuple(patchcheck.fold(label) + "/" for label in inside if not os.path.isabs(label))

    def runs_on_host(path: str) -> bool:
        folded = patchcheck.fold(path)
        return folded in names or folded.startswith(prefixes)

    return runs_on_host


def _watched(workspace: Path, version: int = WATCH_LIST) -> tuple[dict[str, Path], list[Path]]:
    """(watched_paths, the folders whose every entry is watched), as list `version` had them."""
    workspace = Path(os.path.realpath(workspace))
    found: dict[str, Path] = {}
    folders: list[Path] = []
    for name in WATCHED_FILES + (HOST_AGENT_FILES if version >= 3 else ()):
        for parent in reversed(Path(name).parents[:-1]):  # .vscode for .vscode/tasks.json: a link there redirects
            found[str(parent)] = workspace / parent
        found[name] = workspace / name
    for folder in WATCHED_DIRS + (HOST_AGENT_DIRS if version >= 3 else ()):
        for parent in reversed(Path(folder).parents[:-1]):
            found[str(parent)] = workspace / parent
        folders.append(workspace / folder)
    git = dirs.locate(workspace)
    if git.common_dir is not None:
        _watch_git_folder(workspace, git.common_dir, found, folders)
    if git.common_dir is not None and version >= 2:
        for module in _subfolders(workspace, git.common_dir / "modules", found):
            _watch_git_folder(workspace, module, found, folders)
        for tree in _subfolders(workspace, git.common_dir / "worktrees", found):
            for name in WORKTREE_FILES:
                found[_label(workspace, tree / name)] = tree / name
            for module in _subfolders(workspace, tree / "modules", found):
                _watch_git_folder(workspace, module, found, folders)
    for listed in folders:
        found.update(_list_dir(workspace, listed))
    if git.git_dir is not None and git.git_dir != git.common_dir:
        for name in ("config.worktree", "commondir"):
            found[_label(workspace, git.git_dir / name)] = git.git_dir / name
    return found, folders


def _watch_git_folder(workspace: Path, folder: Path, found: dict[str, Path], folders: list[Path]) -> None:
    """GIT_FILES of a git folder, the folders they lie in (a link there is reported), and its hooks."""
    for name in GIT_FILES:
        path = folder / name
        found[_label(workspace, path.parent)] = path.parent
        found[_label(workspace, path)] = path
    folders.append(folder / "hooks")


def _subfolders(workspace: Path, folder: Path, found: dict[str, Path]) -> list[Path]:
    """The real folders in folder (a git folder's modules/ or worktrees/), at most MAX_LISTED entries in
    name order. The folder and every entry are watched themselves: a link in place of one is reported,
    never followed."""
    found[_label(workspace, folder)] = folder
    if not _reached_without_links(folder):
        return []
    try:
        names = sorted(os.listdir(folder))[:MAX_LISTED]
    except OSError:
        return []
    real: list[Path] = []
    for name in names:
        path = folder / name
        found[_label(workspace, path)] = path
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                real.append(path)
        except OSError:
            continue
    return real


def fingerprint(workspace: Path) -> dict[str, Entry]:
    result = {}
    real_parents: dict[Path, bool] = {}
    for label, path in watched_paths(workspace).items():
        parent = path.parent
        if parent not in real_parents:
            real_parents[parent] = _reached_without_links(parent)
        if not real_parents[parent]:
            continue  # reached through a link: that link is watched itself, what it points to is not
        entry = _entry(path)
        if entry is not None:
            result[label] = entry
    return result


def changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[tuple[str, str]]:
    """(label, "added" | "removed" | "modified"), sorted by label."""
    return [(change.label, change.kind) for change in _compare(before, after)]


# -- the per-workspace record ------------------------------------------------------------------


def record_file(workspace: Path) -> Path:
    return paths.state_dir() / "tripwire" / f"{paths.workspace_key(workspace)}.json"


def load(workspace: Path) -> Record | None:
    try:
        data = json.loads(record_file(workspace).read_text())
        return Record(
            Path(data["workspace"]),
            {label: Entry(*value) for label, value in data["reference"].items()},
            {label: (_entry_or_none(pair[0]), _entry_or_none(pair[1])) for label, pair in data["pending"].items()},
            int(data.get("watching", 1)),
            float(data["looked"]) if data.get("looked") is not None else None,
            {str(key): int(value) for key, value in data.get("live", {}).items()},
            {str(key): float(value) for key, value in data.get("kept", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def begin_session(workspace: Path, busy: Busy | None = None,
                  session: str | None = None) -> tuple[dict[str, Entry], list[Change], list[Change]]:
    """At a launch, before the agent starts: the fingerprint to compare with afterwards, every unacknowledged
    change (what changed since the reference is added to them), and the changes taken as the user's own.

    A change since the last session's end is the user's when nothing of the project could have made it: no
    other launch between its checks, no kept session, and `busy(since)` (a task, a session in the VM) says no.
    `session` names this launch until end_session: a launch beside it cannot take a change for the user's."""
    with _locked(workspace):
        record = _load_for(workspace)
        current = fingerprint(workspace)
        pending: Pending = {}
        yours: list[Change] = []
        live: dict[str, int] = {}
        kept: dict[str, float] = {}
        looked = None
        if record is not None:
            pending, reference = _settle(record, current)
            since = [change for change in _compare(reference, current) if change.label not in pending]
            since = [change for change in since if not _agentbox_own(workspace, change)]
            quiet, live, kept = _nothing_else_ran(record, busy) if since else (False, dict(record.live),
                                                                              dict(record.kept))
            if quiet:
                yours = [change for change in since if _in_workspace(change)]
            for change in since:
                if change not in yours:
                    pending[change.label] = (change.before, change.after)
            looked = record.looked
        if session is not None:
            live[session] = os.getpid()
        # Every file not pending is as the user accepted it: the reference is the files as they are now.
        _save_if_changed(record, Record(workspace, current, pending, WATCH_LIST, looked, live, kept))
    return current, _pending_changes(pending, current), yours


def end_session(workspace: Path, before: dict[str, Entry], session: str | None = None,
                kept_in: str | None = None) -> tuple[list[Change], int]:
    """After the session: what it changed, and how many other changes are still unacknowledged.

    `kept_in`: the session goes on in that VM after this launch (detached): until it is seen ended, no change
    is taken for the user's own."""
    with _locked(workspace):
        record = _load_for(workspace) or Record(workspace, before, {})
        after = fingerprint(workspace)
        found = _compare(before, after)
        own = [change for change in found if _agentbox_own(workspace, change)]
        found = [change for change in found if change not in own]
        pending = dict(record.pending)
        for change in found:
            earliest = pending[change.label][0] if change.label in pending else change.before
            pending[change.label] = (earliest, change.after)
        pending, reference = _settle(record._replace(pending=pending), after)
        for change in own:  # agentbox's own write (a worktree it made): the reference takes it
            if change.after is None:
                reference.pop(change.label, None)
            else:
                reference[change.label] = change.after
        live = {key: pid for key, pid in record.live.items() if key != session}
        kept = {**record.kept, **({kept_in: time.time()} if kept_in else {})}
        _save_if_changed(record, Record(workspace, reference, pending, WATCH_LIST, time.time(), live, kept))
    session_labels = {change.label for change in found}
    return found, len([label for label in pending if label not in session_labels])


def audit(workspace: Path, busy: Busy | None = None) -> list[Change] | None:
    """Every unacknowledged change, as the files are now; None when no session was ever recorded. With `busy`,
    the changes since the last session's end that nothing of the project could have made are left out
    (yours() lists them)."""
    found = _audit(workspace, busy)
    return None if found is None else found[0]


def yours(workspace: Path, busy: Busy) -> list[Change]:
    """The changes since the last session's end that nothing of the project could have made: the user's."""
    found = _audit(workspace, busy)
    return [] if found is None else found[1]


def _audit(workspace: Path, busy: Busy | None) -> tuple[list[Change], list[Change]] | None:
    record = _load_for(workspace)
    if record is None:
        return None
    current = fingerprint(workspace)
    pending, reference = _settle(record, current)
    later = [c._replace(note=AFTER_SESSION) for c in _compare(reference, current)
             if c.label not in pending and not _agentbox_own(workspace, c)]
    if later and busy is not None and _nothing_else_ran(record, busy)[0]:
        outside = [change for change in later if not _in_workspace(change)]
        return (sorted(_pending_changes(pending, current) + outside, key=lambda change: change.label),
                [change._replace(note="") for change in later if _in_workspace(change)])
    return sorted(_pending_changes(pending, current) + later, key=lambda change: change.label), []


def acknowledge(workspace: Path) -> int:
    """Accept every change: the files as they are now become the reference. Returns how many there were."""
    with _locked(workspace):
        record = _load_for(workspace)
        found = audit(workspace) or []
        live = dict(record.live) if record is not None else {}
        kept = dict(record.kept) if record is not None else {}
        _save(Record(workspace, fingerprint(workspace), {}, WATCH_LIST, time.time(), live, kept))
    return len(found)


def acknowledge_file(workspace: Path, path: Path) -> bool:
    """Accept one watched file as it is now (`agentbox trust` of the agentbox.yml it trusts); whether it was
    pending or changed since the reference. Nothing is recorded for a workspace no session has looked at."""
    label = _label(Path(os.path.realpath(workspace)), Path(os.path.realpath(path.parent)) / path.name)
    if label not in watched_paths(workspace):
        return False
    with _locked(workspace):
        record = _load_for(workspace)
        if record is None:
            return False
        entry = fingerprint(workspace).get(label)
        changed = label in record.pending or _digest(record.reference.get(label)) != _digest(entry)
        reference = {key: value for key, value in record.reference.items() if key != label}
        if entry is not None:
            reference[label] = entry
        pending = {key: value for key, value in record.pending.items() if key != label}
        _save_if_changed(record, record._replace(reference=reference, pending=pending))
    return changed


def nothing_else_ran(looked: float | None, live: Mapping[str, int], kept: Mapping[str, float],
                     busy: Busy | None) -> tuple[bool, dict[str, int], dict[str, float]]:
    """The rule by which a change is the user's own edit (the tripwire's, and the instruction files' quarantine):
    (whether nothing of the project could have changed the files since `looked`, the last check after a session,
    the launches still live, the kept sessions still to watch). `live` are the launches between their start and end
    check (session -> pid), `kept` the VMs a kept session went on in (-> when). A launch whose process is gone ended
    unchecked; a kept session counts until its VM shows no live one and it is older than the markers' staleness."""
    still = {key: pid for key, pid in live.items() if pid_alive(pid)}
    watched = {vm: when for vm, when in kept.items()
               if busy is None or time.time() - when < livemarkers.STALE_SEC or busy.vm_busy(vm)}
    quiet = busy is not None and looked is not None and not live and not kept and not busy(looked)
    return quiet, still, watched


def _nothing_else_ran(record: Record, busy: Busy | None) -> tuple[bool, dict[str, int], dict[str, float]]:
    return nothing_else_ran(record.looked, record.live, record.kept, busy)


def _in_workspace(change: Change) -> bool:
    """A watched file inside the workspace (its label is relative). One outside it (the common git folder of a
    worktree) is shared with other checkouts' VMs: what this project did or did not run says nothing of it."""
    return not os.path.isabs(change.label)


def _agentbox_own(workspace: Path, change: Change) -> bool:
    """A change that is exactly what `git worktree add` writes for a worktree agentbox makes
    (`.agentbox/worktrees/NAME`): its note in the common dir's worktrees/, whoever ran it."""
    return all(entry is None or _own_worktree_entry(workspace, change.label, entry)
               for entry in (change.before, change.after)) and (change.before or change.after) is not None


def _own_worktree_entry(workspace: Path, label: str, entry: Entry) -> bool:
    parts = label.split("/")
    if len(parts) != 4 or parts[:2] != [".git", "worktrees"] or not entry.digest.startswith("file:-:"):
        return False
    text = (entry.text or "").rstrip("\n")
    if parts[3] == "commondir":
        return text == "../.."
    if parts[3] != "gitdir":
        return False
    note = Path(os.path.realpath(workspace)) / ".git" / "worktrees" / parts[2]
    target = Path(os.path.normpath(note / text))  # absolute, or relative to the note (worktree.useRelativePaths)
    folder = Path(os.path.realpath(workspace)) / AGENTBOX_WORKTREES
    return target.name == ".git" and target.parent.parent == folder and "\n" not in text


def _load_for(workspace: Path) -> Record | None:
    record = load(workspace)
    if record is None or record.workspace != workspace:
        return None
    if record.watching < WATCH_LIST:
        # Newly watched files are taken as they are; a file the old list watched keeps being compared.
        newly = set(_watched(workspace)[0]) - set(_watched(workspace, record.watching)[0])
        current = fingerprint(workspace)
        taken = {label: current[label] for label in newly if label in current and label not in record.reference}
        record = record._replace(reference={**record.reference, **taken})
    return record


def _settle(record: Record, current: dict[str, Entry]) -> tuple[Pending, dict[str, Entry]]:
    """(pending, reference) without the files that are back as they were before every pending
    change: nothing is left to accept there, and the reference takes them as they are."""
    pending: Pending = {}
    reference = dict(record.reference)
    for label, (before, after) in record.pending.items():
        if _digest(before) != _digest(current.get(label)):
            pending[label] = (before, after)
        elif before is None:
            reference.pop(label, None)
        else:
            reference[label] = before
    return pending, reference


def _pending_changes(pending: Pending, current: dict[str, Entry]) -> list[Change]:
    """Each settled pending change, from its earliest before to the file as it is now."""
    found: list[Change] = []
    for label, (before, after) in sorted(pending.items()):
        now = current.get(label)
        found.append(Change(label, before, now, CHANGED_AGAIN if _digest(now) != _digest(after) else ""))
    return found


def _save_if_changed(old: Record | None, new: Record) -> None:
    if old is None or old != new:
        _save(new)


def _save(record: Record) -> None:
    private_dir(record_file(record.workspace).parent)
    data = {
        "workspace": str(record.workspace),
        "watching": WATCH_LIST,
        "reference": {label: list(entry) for label, entry in record.reference.items()},
        "pending": {label: [_as_list(before), _as_list(after)] for label, (before, after) in record.pending.items()},
        "looked": record.looked,
        "live": dict(record.live),
        "kept": dict(record.kept),
    }
    atomic_write(record_file(record.workspace), json.dumps(data), mode=0o600)


@contextmanager
def _locked(workspace: Path) -> Iterator[None]:
    """Two agents' sessions of one workspace can end at once; each read-modify-write is serialized."""
    lock = record_file(workspace).with_suffix(".lock")
    private_dir(lock.parent)
    with locked(lock):
        yield


# -- printing ----------------------------------------------------------------------------------


def report_session(found: list[Change], others: int, stream: TextIO | None = None) -> bool:
    """The loud warning after a session: each change with its diff, then the summary, last."""
    if not found:
        return False
    summary = [f"agentbox: WARNING: the session changed {_count(len(found))} that your host runs without asking: "
               f"{_names(found)}.",
               "Review them before you run git, direnv, make, npm or your editor on the host."]
    if others:
        summary.append(f"{_count(others)} changed earlier {'is' if others == 1 else 'are'} not acknowledged either.")
    summary.append(f"They are listed at every launch until you accept them: {ACK_HINT}.")
    _print_report("agentbox: files your host runs, as the session left them:", found, summary, stream)
    return True


def report_audit(found: list[Change], workspace: Path, stream: TextIO | None = None) -> None:
    summary = [f"agentbox: WARNING: {_count(len(found))} that your host runs without asking "
               f"changed and {'is' if len(found) == 1 else 'are'} not acknowledged: {_names(found)}.",
               "Review them before you run git, direnv, make, npm or your editor on the host; "
               "`agentbox audit --ack` accepts them as they are now."]
    _print_report(f"agentbox: unacknowledged changes in {visible(str(workspace))}:", found, summary, stream)


def remind(found: list[Change], stream: TextIO | None = None) -> None:
    """The compact reminder at a launch, before the agent starts."""
    if found:
        print(f"agentbox: {summary(found)}; {ACK_HINT}", file=stream or sys.stderr, flush=True)


def report_yours(found: list[Change], stream: TextIO | None = None) -> None:
    """One plain line at a launch: watched files changed while nothing of the project ran, taken as the user's."""
    if found:
        print(f"agentbox: {_count(len(found))} changed while no session or task of this project ran, taken as "
              f"your own edits: {_names(found)}", file=stream or sys.stderr, flush=True)


def summary(found: list[Change]) -> str:
    """One line: how many unacknowledged changes, and to which files (names escaped)."""
    verb = "is" if len(found) == 1 else "are"
    return f"{_count(len(found))} that your host runs changed and {verb} not acknowledged: {_names(found)}"


def _print_report(title: str, found: list[Change], summary: list[str], stream: TextIO | None) -> None:
    # deferred: start-up (difflib: only a change's diff, never a quiet launch)
    import difflib

    lines = [BAR, title]
    for change in found:
        note = f"  ({change.note})" if change.note else ""
        lines.append(f"  {change.kind:9} {visible(change.label)}{note}")
        old, new = change.before, change.after
        diff = list(difflib.unified_diff(
            _lines(old),
            _lines(new),
            fromfile=f"{change.label} (before)",
            tofile=f"{change.label} (now)",
            lineterm="",
        ))
        for line in diff[:MAX_DIFF_LINES]:
            lines.append(f"      {visible(line, keep_tab=True)}")
        if len(diff) > MAX_DIFF_LINES:
            lines.append(f"      ... {len(diff) - MAX_DIFF_LINES} more lines")
        if (old is not None and old.text is None) or (new is not None and new.text is None):
            lines.append(f"      (before: {_describe(old)}; now: {_describe(new)}; no diff shown)")
    lines += [BAR, *summary, BAR]
    print("\n".join(lines), file=stream or sys.stderr, flush=True)


def _lines(entry: Entry | None) -> list[str]:
    """Split at newlines only: a carriage return or other break inside a line is shown, escaped."""
    if entry is None or not entry.text:
        return []
    return entry.text.removesuffix("\n").split("\n")


def _count(n: int) -> str:
    return f"{n} watched file{'s' if n != 1 else ''}"


def _names(found: list[Change]) -> str:
    names = [visible(change.label) for change in found[:MAX_NAMES]]
    if len(found) > MAX_NAMES:
        names.append(f"and {len(found) - MAX_NAMES} more")
    return ", ".join(names)


# -- fingerprints of single paths --------------------------------------------------------------


def _compare(before: dict[str, Entry], after: dict[str, Entry]) -> list[Change]:
    return [
        Change(label, before.get(label), after.get(label))
        for label in sorted(set(before) | set(after))
        if _digest(before.get(label)) != _digest(after.get(label))
    ]


def _digest(entry: Entry | None) -> str | None:
    return entry.digest if entry is not None else None


def _as_list(entry: Entry | None) -> list[str | None] | None:
    return list(entry) if entry is not None else None


def _entry_or_none(value: list[str | None] | None) -> Entry | None:
    return Entry(str(value[0]), value[1]) if value is not None else None


def _entry(path: Path) -> Entry | None:
    """Never follows a link and never opens anything but a regular file (a FIFO would block).

    A real folder is no entry (what matters is in it); a link or other file in its place is.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            return Entry("link:?", None)
        return Entry(f"link:{target}", f"symlink -> {target}")
    if not stat.S_ISREG(st.st_mode):
        return Entry(f"other:{stat.S_IFMT(st.st_mode)}", None)
    digest = hashlib.sha256()
    head = b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                if len(head) <= MAX_TEXT:
                    head += chunk[: MAX_TEXT + 1 - len(head)]
    except OSError:
        return Entry("file:unreadable", None)
    mode = "x" if st.st_mode & 0o111 else "-"
    text = head.decode("utf-8", "replace") if len(head) <= MAX_TEXT and b"\0" not in head else None
    return Entry(f"file:{mode}:{digest.hexdigest()}", text)


def _describe(entry: Entry | None) -> str:
    if entry is None:
        return "absent"
    if entry.digest.startswith("other:"):
        return "not a regular file"
    if entry.digest.startswith("link:"):
        return "a symbolic link"
    return "a binary or large file"


def _list_dir(workspace: Path, folder: Path) -> dict[str, Path]:
    """The folder itself (an entry only when a link or file replaced it) and, when it is a real
    folder reached through no link, everything in it."""
    found = {_label(workspace, folder): folder}
    if not _reached_without_links(folder):
        return found
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    found.update({_label(workspace, folder / name): folder / name for name in names})
    return found


def _reached_without_links(folder: Path) -> bool:
    """Whether folder is a real folder and no part of its path is a link (its parts are all resolved)."""
    return os.path.realpath(folder) == str(folder)


def _label(workspace: Path, path: Path) -> str:
    try:
        return str(path.relative_to(workspace))
    except ValueError:
        return str(path)


def audit_records(found: list[Change]) -> list[dict[str, object]]:
    """`agentbox audit --json`: each change as the text report shows it (file, kind, note, the unified diff)."""
    # deferred: start-up (difflib: only a change's diff, never a quiet launch)
    import difflib

    records: list[dict[str, object]] = []
    for change in found:
        diff = list(difflib.unified_diff(_lines(change.before), _lines(change.after),
                                         fromfile=f"{change.label} (before)", tofile=f"{change.label} (now)",
                                         lineterm=""))
        records.append({"file": change.label, "change": change.kind, "note": change.note or None,
                        "before": _kind_of(change.before), "now": _kind_of(change.after), "diff": diff})
    return records


def _kind_of(entry: Entry | None) -> str:
    """absent, text, or what _describe says it is (a symbolic link, a binary or large file, ...)."""
    return "text" if entry is not None and entry.text is not None else _describe(entry)
