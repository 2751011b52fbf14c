"""Credential write-back: a login the agent refreshed (or made) in the VM becomes the host's too.

Claude Code and Codex rotate their refresh token at every refresh, so whichever side refreshes last
logs the other out. With `credentials.writeBack` on (the default), each session ends like this:

1. Before it (`begin`), agentbox makes a fresh folder in the VM's outbox, `outbox/creds/SESSION`,
   and tells launch.sh which login files to hand back: those of the formats agentbox knows
   (agentbox.agents.logins) among the launch's credential files, plus their companions (Claude Code's
   ~/.claude.json names its account).
2. launch.sh runs the program as its child and, when it exits, copies each of those files that
   differs from what it last installed from the host into that folder (no limactl call).
3. After the shell returns (`finish`), agentbox reads the copies as attacker-written input (no
   symlink followed, regular files only, size caps) and writes one back to the host file when:
   - it parses as a login of its format;
   - the host file is unchanged since this launch staged it (same bytes; absent then, absent now):
     a login made on the host meanwhile is never overwritten;
   - it is the same account as the host's (the ids the formats name; when neither names one, the
     same kind of tokens) — `agentbox AGENT login` may replace the host's login with another account;
   - it is newer: a later expiry or refresh time where the format has one, else a later mtime
     (a host file that did not exist counts as older than any login).
   The write happens under one lock for every VM, atomically, keeping the host file's mode, with
   the previous file kept as FILE.agentbox-backup. Two sessions ending at once: the second finds the
   host file changed (by the first) and leaves it.

With the credential broker, the logins it keeps (agentbox.credentials.broker.brokered) are never written back: the
broker saves a refresh or a login made through it on the host itself, and the VM's file holds placeholders. Such a
file is still handed back, only to say so when it holds tokens that did not come through the broker.

Why a file was not written back is said once per copy (the VM's state remembers what was said).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from agentbox import fsutil, paths, staginglayout, vmread
from agentbox.agents.logins import FORMATS, MAX_COMPANION, MAX_FILE, Format, Unusable, same_account, with_companion
from agentbox.credentials import loginfiles
from agentbox.credentials.hostfile import BACKUP_SUFFIX
from agentbox.fsutil import atomic_write, private_dir
from agentbox.progress import note
from agentbox.safetext import visible
from agentbox.vm import statefile

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config

LOCK_FILE = "credentials.lock"
_SAID = "writeBackSaid"  # the VM state's record of what was said about which copy


class Target(NamedTuple):
    fmt: Format
    host_path: Path  # the host file a login is written back to
    staged: loginfiles.Staged | None  # what this launch staged from it; None: the host had none
    brokered: bool = False  # the credential broker keeps this login: never written back, only told about


class Plan(NamedTuple):
    vm_name: str
    returns: staginglayout.CredentialReturn
    targets: tuple[Target, ...]
    staged: dict[str, loginfiles.Staged]  # every file this launch staged, by guest path
    staging_folder: Path
    login: bool  # `agentbox AGENT login`: the user asked for this login, another account included


class Verdict(NamedTuple):
    write: bool
    reason: str = ""  # why not, said once; "" when there is nothing to say
    switched: tuple[str, str] | None = None  # (new, old) account when a login replaces another's


class Returned(NamedTuple):
    """What a session may hand back: the login files it staged, whether it is the agent's own login (`agentbox AGENT
    login`), and which host files' logins the credential broker keeps instead (brokered.Prepared.replaces)."""

    staged: Sequence[loginfiles.Staged]
    login: bool = False
    brokered: Callable[[Path], bool] | None = None


def begin(config: Config, vm_name: str, agent: AgentConfig | None, returned: Returned,
          expected: dict[str, Any] | None) -> Plan | None:
    """This session's write-back, or None when there is none (turned off, no known login file, an old VM)."""
    staged_now, login, brokered = returned
    settings = config.credentials
    staged = {item.guest_path: item for item in staged_now}
    targets: dict[str, Target] = {}
    for spec in loginfiles.launch_files(config, agent):
        guest = loginfiles.guest_path_for(spec)
        relative = guest[2:] if guest.startswith("~/") else ""
        if relative in FORMATS and relative not in targets:
            item = staged.get(relative)
            host = item.host_path if item is not None else Path(os.path.expanduser(spec))
            if brokered is not None and brokered(host):
                targets[relative] = Target(FORMATS[relative], host, None, brokered=True)
            else:
                targets[relative] = Target(FORMATS[relative], host, item)
    if not (settings.enabled and settings.write_back):
        if login and not all(target.brokered for target in targets.values()):
            note("credentials.writeBack is off, so the login stays in the VM (the host's files are not changed)")
        return None
    if not targets:
        return None
    if not has_outbox(expected, vm_name):
        if all(target.brokered for target in targets.values()):
            return None  # nothing would be written back anyway
        note(
            f"credential write-back is off for {vm_name}: it was created before agentbox gave VMs an outbox, "
            "so a login refreshed in it stays there; `agentbox start --recreate` applies it"
        )
        return None
    files = list(targets)
    for target in targets.values():
        if target.fmt.companion and target.fmt.companion not in files:
            files.append(target.fmt.companion)
    folder = _new_session_folder(vm_name)
    return Plan(vm_name, staginglayout.CredentialReturn(folder, tuple(files)), tuple(targets.values()), staged,
                paths.staging_dir(vm_name), login)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """What a verified launch plan keeps of this write-back (agentbox.session.plan); the folder is each session's."""
    def staged(item: loginfiles.Staged | None) -> list[Any] | None:
        return None if item is None else [item.guest_path, str(item.host_path), item.digest, item.mtime_ns]

    return {"vm": plan.vm_name, "files": list(plan.returns.files), "stagingFolder": str(plan.staging_folder),
            "targets": [[target.fmt.path, str(target.host_path), staged(target.staged), target.brokered]
                        for target in plan.targets],
            "staged": [staged(item) for item in plan.staged.values()], "login": plan.login}


def plan_from_json(data: dict[str, Any], folder: Path) -> Plan:
    """plan_to_json's write-back again, handed back in `folder` (this session's)."""
    def staged(item: list[Any] | None) -> loginfiles.Staged | None:
        return None if item is None else loginfiles.Staged(item[0], Path(item[1]), item[2], item[3])

    items = [found for found in map(staged, data["staged"]) if found is not None]
    targets = tuple(Target(FORMATS[fmt], Path(host), staged(item), brokered)
                    for fmt, host, item, brokered in data["targets"])
    return Plan(data["vm"], staginglayout.CredentialReturn(folder, tuple(data["files"])), targets,
                {item.guest_path: item for item in items}, Path(data["stagingFolder"]), data["login"])


def has_outbox(expected: dict[str, Any] | None, vm_name: str) -> bool:
    """Whether the VM was created with the outbox mount (from what agentbox rendered for it)."""
    if not expected:
        return False
    outbox = str(paths.vm_outbox(vm_name))
    return [outbox, outbox, True] in [list(mount) for mount in expected.get("mounts", [])]


def discard(plan: Plan) -> None:
    """The session did not run after all (a warm launch that fell back): its folder goes, nothing is read."""
    _remove(plan.returns.folder)


def finish(plan: Plan) -> None:
    """After the session: write back what the VM handed back and may be written, say why not otherwise."""
    folder = plan.returns.folder
    try:
        returned = _read_returned(folder, plan.returns.files)
    finally:
        _remove(folder)
    said: dict[str, str] = {}
    for target in plan.targets:
        copy = returned.get(target.fmt.path)
        if copy is None:
            continue
        if isinstance(copy, str):
            verdict = Verdict(False, f"the VM's copy {copy}")
            guest_key = copy
        elif target.brokered:
            guest_key = hashlib.sha256(copy[0]).hexdigest()
            verdict = _brokered(plan, target, copy[0])
        else:
            guest_bytes, guest_mtime = copy
            guest_key = hashlib.sha256(guest_bytes).hexdigest()
            verdict = judge(plan, target, guest_bytes, guest_mtime, returned)
            if verdict.write:
                try:
                    with _locked():
                        verdict = _write(target, guest_bytes, verdict)
                except OSError as exc:
                    verdict = Verdict(False, f"writing it failed ({exc.strerror or exc}); the host's file is unchanged")
        if verdict.reason:
            said[target.fmt.path] = hashlib.sha256(f"{guest_key}\0{verdict.reason}".encode()).hexdigest()
            if _newly_said(plan.vm_name, target.fmt.path, said[target.fmt.path]):
                note(f"~/{target.fmt.path} from the VM was not copied back to {home_relative(target.host_path)}: "
                     f"{verdict.reason}")
        elif verdict.write:
            _report(plan, target, verdict)
    _remember_said(plan.vm_name, said, [target.fmt.path for target in plan.targets if target.fmt.path in returned])


def judge(plan: Plan, target: Target, guest_bytes: bytes, guest_mtime: float,
          returned: dict[str, tuple[bytes, float] | str]) -> Verdict:
    """Whether the VM's copy may replace the host file as it was staged (the host's current state is checked
    again under the lock)."""
    fmt = target.fmt
    try:
        guest = fmt.parse(guest_bytes)
    except Unusable as exc:
        return Verdict(False, f"it is not a {fmt.agent} login ({exc}); the host's file is unchanged")
    guest = with_companion(fmt, guest, _guest_companion(plan, fmt, returned))
    if target.staged is None:
        return Verdict(True)  # the host had no login file: the VM's login is the only one
    staged_bytes = _staged_copy(plan, target.staged)
    if staged_bytes is None:
        return Verdict(False, _HOST_CHANGED)  # a later launch staged another host file meanwhile
    if staged_bytes == guest_bytes:
        return Verdict(False)
    try:
        host = with_companion(fmt, fmt.parse(staged_bytes), _host_companion(target, fmt))
    except Unusable:
        if plan.login:
            return Verdict(True, switched=(account_in_words(guest.shown), "a file agentbox could not read"))
        return Verdict(False, f"the host's file is not a {fmt.agent} login agentbox can compare it with; "
                              f"`agentbox {fmt.command} login` replaces it")
    same = same_account(guest, host)
    if same is None:
        same = guest.shape == host.shape
        if not same and not plan.login:
            return Verdict(False, "agentbox cannot tell whether it is the host's account (neither file names "
                                  "one, and their tokens are of different kinds)")
    if not same:
        if not plan.login:
            return Verdict(False, f"it is logged in as {account_in_words(guest.shown)}, the host's file as "
                                  f"{account_in_words(host.shown)}; `agentbox {fmt.command} login` makes a VM login "
                                  "the host's too, `credentials: {writeBack: false}` keeps them apart")
        return Verdict(True, switched=(account_in_words(guest.shown), account_in_words(host.shown)))
    if guest.fresh_until is not None and host.fresh_until is not None:
        newer = guest.fresh_until > host.fresh_until
    else:
        newer = guest_mtime * 1e9 > target.staged.mtime_ns
    return Verdict(True) if newer else Verdict(False)


def _brokered(plan: Plan, target: Target, guest_bytes: bytes) -> Verdict:
    """A login the broker keeps is never written back; the VM's copy is worth a word only when it holds tokens that
    did not come through the broker (placeholders are what the broker gave it)."""
    # deferred: start-up (credentials.broker.brokered: a launch with the broker off never loads it)
    from agentbox.credentials.broker import brokered

    if not brokered.foreign_tokens(plan.vm_name, target.fmt.command, target.host_path, guest_bytes):
        return Verdict(False)
    fmt = target.fmt
    return Verdict(False, f"it holds tokens that did not come through the credential broker, which keeps the host's "
                          f"{fmt.agent} login on the host and never copies the VM's file back; "
                          f"`agentbox {fmt.command} login` logs the host in through the broker")


_HOST_CHANGED = ("the host's file changed during the session (a login there, or another session's write-back), "
                 "so the host's is kept and reaches the VM at its next launch")


def _write(target: Target, data: bytes, verdict: Verdict) -> Verdict:
    """Under the lock: write data to the host file when it is still as staged; the verdict as it turned out."""
    host = target.host_path
    try:
        st = os.lstat(host)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        return Verdict(False, "the host's file is a symlink, which agentbox does not replace")
    if st is not None and not stat.S_ISREG(st.st_mode):
        return Verdict(False, "the host's file is not a regular file")
    current = _read_host(host) if st is not None else None
    if target.staged is None:
        unchanged = st is None  # the host had no such file when the session began, and still has none
    else:
        unchanged = current is not None and hashlib.sha256(current).hexdigest() == target.staged.digest
    if not unchanged:
        return Verdict(False, "" if current == data else _HOST_CHANGED)
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o600
    if current is not None:
        atomic_write(_backup(host), current, mode=0o600)
    else:
        _private_parents(host.parent)
    atomic_write(host, data, mode=mode)
    return verdict


def _report(plan: Plan, target: Target, verdict: Verdict) -> None:
    host = home_relative(target.host_path)
    if verdict.switched is not None:
        new, old = verdict.switched
        note(f"{host}: the host is now logged in to {target.fmt.agent} as {new} (was {old}); the previous file is "
             f"{home_relative(_backup(target.host_path))}")
    elif target.staged is None:
        note(f"{host}: the {target.fmt.agent} login made in the VM is now the host's too")
    else:
        note(f"{host}: the {target.fmt.agent} login refreshed in the VM is now the host's too (the previous file is "
             f"{home_relative(_backup(target.host_path))})")


def _backup(host: Path) -> Path:
    return host.with_name(host.name + BACKUP_SUFFIX)


def account_in_words(shown: str | None) -> str:
    """A login's account as a message names it (escaped)."""
    return visible(shown) if shown else "an account the file does not name"


def home_relative(path: Path) -> str:
    """A host path as a message names it: `~/...` under the home (escaped)."""
    home = str(paths.home())
    text = str(path)
    return visible("~" + text[len(home):] if text.startswith(home + os.sep) else text)


# -- the companions (the files that name the account) ---------------------------------------------


def _guest_companion(plan: Plan, fmt: Format, returned: dict[str, tuple[bytes, float] | str]) -> bytes | None:
    """The VM's companion: the copy it handed back, else (unchanged in the VM) the one staged."""
    if fmt.companion is None:
        return None
    copy = returned.get(fmt.companion)
    if isinstance(copy, tuple):
        return copy[0]
    item = plan.staged.get(fmt.companion)
    return _staged_copy(plan, item) if item is not None and copy is None else None


def _host_companion(target: Target, fmt: Format) -> bytes | None:
    if fmt.companion is None:
        return None
    return _read_host(paths.home() / fmt.companion, MAX_COMPANION)


def _staged_copy(plan: Plan, item: loginfiles.Staged) -> bytes | None:
    """The staged copy of a file, if it still holds what this launch staged."""
    data = _read_host(plan.staging_folder / staginglayout.CREDS_HOME / item.guest_path, MAX_COMPANION)
    return data if data is not None and hashlib.sha256(data).hexdigest() == item.digest else None


def _read_host(path: Path, limit: int = MAX_FILE) -> bytes | None:
    """A host file agentbox reads (no FIFO can block it); None when absent, unreadable or over the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


def _private_parents(folder: Path) -> None:
    """A missing folder for a new login file (~/.codex): created 0700, like the agents do."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        private_dir(path)


# -- the outbox (written by the VM) ----------------------------------------------------------------


def _new_session_folder(vm_name: str) -> Path:
    """outbox/creds/s-RANDOM, a fresh name, made without following anything the VM put there."""
    return vmread.fresh_folder(paths.vm_outbox(vm_name), staginglayout.OUTBOX_CREDS, prefix="s")


def _read_returned(folder: Path, files: Sequence[str]) -> dict[str, tuple[bytes, float] | str]:
    """What launch.sh handed back, by guest path: (bytes, mtime), or why a copy was not read."""
    found: dict[str, tuple[bytes, float] | str] = {}
    try:
        with vmread.folder(folder.parent.parent, staginglayout.OUTBOX_CREDS, folder.name) as session:
            for index, relative in enumerate(files):
                limit = MAX_FILE if relative in FORMATS else MAX_COMPANION
                try:
                    data, st = vmread.read_checked(session, str(index), limit)
                except vmread.Refused as refused:
                    if refused.why != vmread.MISSING:
                        found[relative] = refused.reason
                    continue
                found[relative] = (data, st.st_mtime)
    except OSError:
        return {}  # the VM removed or replaced the folder: nothing was handed back
    return found


def _remove(folder: Path) -> None:
    """Remove a session folder and whatever the VM put in it, never following a link out of it."""
    vmread.remove_folder(folder.parent.parent, folder)


# -- the lock and what was said -----------------------------------------------------------------------


@contextmanager
def _locked() -> Iterator[None]:
    """One write-back at a time, for every VM: they may write the same host file."""
    with fsutil.locked(private_dir(paths.state_dir()) / LOCK_FILE):
        yield


def _newly_said(vm_name: str, path: str, key: str) -> bool:
    said = statefile.read(vm_name).get(_SAID)
    return not isinstance(said, dict) or said.get(path) != key


def _remember_said(vm_name: str, said: dict[str, str], considered: list[str]) -> None:
    """Record what was said for each copy considered; a copy with nothing to say clears its entry."""
    with _locked():
        recorded = statefile.read(vm_name)
        before = recorded.get(_SAID, {}) if isinstance(recorded.get(_SAID), dict) else {}
        after = {path: key for path, key in before.items() if path not in considered}
        after.update(said)
        if after != before:
            statefile.update(vm_name, {_SAID: after})
