"""A warm launch in one limactl call: `limactl shell` first, proven in the guest, and the slow path when not.

Every launch's `limactl shell` runs launch.sh through a small stub (STUB, a bash -c script: builtins only, so
it costs no process). After a launch has listed the VM and checked it (the slow path), the stub keeps
agentbox's token, the guest's boot id and the workspace in ~/.agentbox/verified ("record"). The next launch
skips `limactl list` when agentbox still has that VM's row (agentbox.vm.verified) and makes the stub prove,
before anything runs, that
  - the VM mounts this VM's staging folder as it is now: the nonce agentbox wrote for this launch is there;
  - the VM is the one agentbox checked: the token and workspace match, and it has not rebooted since (boot id);
  - it mounts the outbox: the stub leaves the launch's started mark there, then runs launch.sh.
Otherwise the stub exits PROOF_FAILED without running anything, and with no started mark; agentbox then
takes the slow path (`list`, start or create as needed, the checks, and the shell again). So does Lima's own
answer that the VM is stopped or missing (agentbox.vm.shellwatch). Any other end, an ssh failure (255)
included, is the session's: never mistaken for either, and never run twice (a program that exits
PROOF_FAILED itself left the started mark before it ran).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import paths
from agentbox.fsutil import atomic_write, private_dir

if TYPE_CHECKING:
    from agentbox.config.load import Config
    from agentbox.vm import verified
    from agentbox.vm.lima import LimaSaid

PROOF_FAILED = 86
PROOF_DIR = "proof"  # in the staging folder: one empty file per launch, named by its nonce
STARTED_PREFIX = ".started-"  # in the outbox: the stub's mark that it ran launch.sh
STALE_SECONDS = 3600
PROVE = "prove"
RECORD = "record"

# $1 prove|record  $2 staging  $3 nonce  $4 token  $5 workspace  $6 workdir  $7 started mark; then launch.sh argv.
STUB = r"""set -u
m=$1 s=$2 n=$3 t=$4 w=$5 d=$6 o=$7
shift 7
if [ "$m" = prove ]; then
  [ -e "$s/proof/$n" ] || exit 86
  { read -r vt vb vw <"$HOME/.agentbox/verified" && read -r b </proc/sys/kernel/random/boot_id; } 2>/dev/null || exit 86
  [ "$vt" = "$t" ] && [ "$vb" = "$b" ] && [ "$vw" = "$w" ] || exit 86
  cd -- "$d" 2>/dev/null || exit 86
  { : >"$o"; } 2>/dev/null || exit 86
else
  if [ -n "$t" ] && { read -r b </proc/sys/kernel/random/boot_id; } 2>/dev/null; then
    { [ -d "$HOME/.agentbox" ] || mkdir -p "$HOME/.agentbox"; } 2>/dev/null
    { printf '%s %s %s\n' "$t" "$b" "$w" >"$HOME/.agentbox/verified"; } 2>/dev/null
  fi
  cd -- "$d" || exit 1
fi
exec "$@"
"""


class Attempt(NamedTuple):
    """One launch's use of the stub: PROVE (no `list` was made) or RECORD (the VM was just checked)."""

    mode: str
    name: str
    nonce: str
    token: str

    @property
    def proof(self) -> Path:
        return paths.staging_dir(self.name) / PROOF_DIR / self.nonce

    @property
    def started(self) -> Path:
        return paths.vm_outbox(self.name) / f"{STARTED_PREFIX}{self.nonce}"


def usable(config: Config, vm_name: str, workspace: Path) -> verified.Verified | None:
    """The VM as the last launch checked it, when this launch may use it without a `list`: the same VM of this
    workspace, live, with nothing agentbox would change or ask about before the session (the slow path says and
    does those), and an outbox for the started mark."""
    # deferred: start-up (the VM's records: a launch from a verified plan proves the VM without them)
    from agentbox.credentials import writeback
    from agentbox.vm import lifecycle, statefile, verified, workmode

    state = statefile.read(vm_name)
    found = verified.cached(vm_name, state)
    if found is None or lifecycle.workspace_of(found.instance) != str(workspace):
        return None
    expected = lifecycle.expected_config(vm_name, state)
    if workmode.ISOLATED in (config.session_mode, workmode.mode_of_vm(expected, workspace)):
        return None
    if "deferred" in state or not lifecycle.resources_as_recorded(config, state):
        return None
    if not writeback.has_outbox(expected, vm_name):
        return None
    return found


def prove(vm_name: str, token: str) -> Attempt:
    """A launch that has not listed the VM: its nonce is in the staging folder before the shell."""
    attempt = Attempt(PROVE, vm_name, secrets.token_hex(16), token)
    private_dir(attempt.proof.parent)
    atomic_write(attempt.proof, "", mode=0o600, durable=False)  # this launch's only: nothing to keep over a crash
    return attempt


def record(vm_name: str, token: str | None) -> Attempt:
    """A launch that has just listed and checked the VM; token None: nothing is kept for the next launch."""
    return Attempt(RECORD, vm_name, "", token or "")


def argv(attempt: Attempt, workspace: Path, workdir: str, command: list[str]) -> list[str]:
    """What `limactl shell` runs: the stub, which enters `workdir` and execs `command` (launch.sh ...)."""
    return ["/bin/bash", "-c", STUB, "agentbox-launch", attempt.mode, str(paths.staging_dir(attempt.name)),
            attempt.nonce, attempt.token, str(workspace), workdir, str(attempt.started), *command]


def fell_back(attempt: Attempt, code: int, lima_said: LimaSaid | None) -> bool:
    """After the shell: True when nothing ran in the VM and the slow path is to be taken; cleans up either way."""
    if attempt.mode != PROVE:
        return False
    started = _take(attempt.started)
    _take(attempt.proof)
    if started:
        if lima_said is not None:  # the program's own line after all
            # deferred: start-up (vm.shellwatch: only when the program's line looked like Lima's)
            from agentbox.vm.shellwatch import write_stderr

            write_stderr(lima_said.line)
        return False
    return lima_said is not None or code == PROOF_FAILED


def _take(path: Path) -> bool:
    """Remove `path` (never following a link: the outbox is the VM's); whether it was there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def sweep(vm_name: str, older_than: float = STALE_SECONDS) -> None:
    """Marks and nonces left by launches that ended without their cleanup (a crash, a kill); a launch in flight
    is younger than that."""
    limit = time.time() - older_than
    for folder, prefix in ((paths.staging_dir(vm_name) / PROOF_DIR, ""), (paths.vm_outbox(vm_name), STARTED_PREFIX)):
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if (entry.name.startswith(prefix) and not entry.is_dir(follow_symlinks=False)
                            and entry.stat(follow_symlinks=False).st_mtime < limit):
                        os.unlink(entry.path)
