"""The contract between the host and provision/launch.sh: the staging folder's layout, launch.sh's options and
the records of one launch's options. Both sides are checked against each other (tests/test_staging.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

LAUNCH_SCRIPT = "launch.sh"
LAUNCH_PARTS = "launch"  # provision/launch/*.sh, which launch.sh sources from staging/launch/
TASK_RUNNER = "task-runner.sh"
MEMORY_SCRIPT = "agent-memory.sh"
SESSION_SCRIPT = "session.sh"
TMUX_CONF = "tmux.conf"
NETWORK_RULES = "network.nft"
ATTENTION_SCRIPT = "attention.sh"
CLAUDE_HOOKS = "claude-hooks.json"
OUTBOX_SESSIONS = "sessions"
GUARDS = "guards"
GUARD_FILES = ("git", "gh", "pre-push", "hook-dispatch")
# In the guest home: the ref prefix scoped pushes may go to (--guards push-scoped), read by the git wrapper and the
# pre-push hook; absent otherwise (provision/launch/guards.sh).
PUSH_SCOPE_FILE = ".config/agentbox/push-namespace"
BOOTSTRAP = "bootstrap"
ENV_FILE = "env"
CREDS = "creds"
CREDS_HOME = "creds/home"
CREDS_MANIFEST = "creds/manifest"
CREDS_STAMPS = "creds/stamps.json"
GIT_IDENTITY = "creds/gitconfig"
GIT_IDENTITY_STAMP = "creds/gitconfig.stamp"
OPEN_URL = "open-url"
OUTBOX_CREDS = "creds"
CONTEXT = "context"
CONTEXT_FILE = "context/context.json"
MEMORY_BLOCK = "context/memory.md"
CONTEXT_TOOLS = "context/tools"
CONTEXT_DIGESTS = "context/digests"
BROKER = "broker"
BROKER_CA = "broker/ca.crt"
BROKER_CA_DIGEST = "broker/ca.sha256"

GUEST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
GUEST_BROKER_CA = "/usr/local/share/ca-certificates/agentbox-broker.crt"  # provision/launch/broker.sh installs it there
# launch.sh's exit status when the broker's CA could not be installed in the guest's trust store (it says why first).
BROKER_CA_FAILED = 122
CANARIES = "canaries"  # staging/canaries/ID: a session's canary secrets (launch.sh --canaries ID)
GO_MARKERS = "go"  # staging/go/TOKEN: the host recorded this launch's start checkpoint (launch.sh --go TOKEN)
# launch.sh's exit status when the host did not say within GO_LIMIT seconds that the start checkpoint is recorded.
GO_TIMED_OUT = 121
GO_LIMIT = 60  # the host gives a checkpoint 30 s (agentbox.session.checkpointing.TIME_LIMIT); launch/checkpoint.sh


class LaunchOption(NamedTuple):
    name: str
    value: str | None  # what the value is, None for a flag
    meaning: str
    repeated: bool = False


# launch.sh's options, the order the host sends them in. tests/test_staging.py checks launch.sh's parser against it.
LAUNCH_OPTIONS = (
    LaunchOption("--wait", "SECONDS", "how long to wait for boot scripts an interrupted start left running "
                 "(vm.startupWaitSec; launch.sh's default 30)"),
    LaunchOption("--workspace", "DIR", "the workspace: bootstrap scripts run there and Gemini CLI trusts it "
                 "(launch.sh's default: its working folder)"),
    LaunchOption("--guards", "on|off|push-scoped", "install (on) or remove (off) the readonly-remote guards "
                 "(sync.remoteWrite); push-scoped: install them letting `git push` through to the pre-push hook, which "
                 "refuses every ref outside --push-namespace and every delete (git.allowPush: session)"),
    LaunchOption("--push-namespace", "REF", "with --guards push-scoped: the only refs pushes may go to "
                 "(refs/heads/agentbox/VM/, agentbox.net.pushes.namespace), written to PUSH_SCOPE_FILE"),
    LaunchOption("--timing", None, "print how long launch.sh's setup took (agentbox --timings)"),
    LaunchOption("--binary", "NAME", "the agent's program, installed with --install when it is missing"),
    LaunchOption("--install", "COMMAND", "the bash command that installs --binary ('' for none)"),
    LaunchOption("--on-create", "SCRIPT", "a staged onCreateScript, run once in the VM's life", repeated=True),
    LaunchOption("--on-start", "SCRIPT", "a staged onStartScript, run once per boot", repeated=True),
    LaunchOption("--isolated-from", "DIR", "isolated mode: the VM's read-only view of the host workspace; the "
                 "program runs on a copy of it at --workspace, made from it when missing or of another --base"),
    LaunchOption("--base", "COMMIT", "isolated mode: the host's checkpoint commit the copy starts from"),
    LaunchOption("--outbox", "DIR", "isolated mode: this session's folder in the writable outbox, where the "
                 "copy's changes go when the program exits (agentbox.review.isolation)"),
    LaunchOption("--chdir", "DIR", "isolated mode: the folder the program starts in, inside the copy "
                 "(the workspace when the copy lacks it)"),
    LaunchOption("--copy-aside", None, "isolated mode in a VM created live: the copy goes under the guest's "
                 "~/.agentbox/copies/, not at --workspace (the user's files, mounted there)"),
    LaunchOption("--sync", "AGENT", "apply sync/AGENT: the agent's own setup (sync.agentConfig); "
                 "memory-files: every agent's memory file", repeated=True),
    LaunchOption("--creds-outbox", "DIR", "credential write-back: this session's folder in the writable outbox; "
                 "launch.sh then runs the program as its child and, when it exits, copies each --creds-return "
                 "file there"),
    LaunchOption("--creds-return", "PATH", "a file under the guest home (a login file) to copy to --creds-outbox "
                 "as its position (0, 1, ...) when it differs from what launch.sh last installed", repeated=True),
    LaunchOption("--memory-file", "PATH", "an agent's memory file, relative to the guest home, that keeps "
                 "context/memory.md's block (agents.py memory_file)", repeated=True),
    LaunchOption("--worktree", "DIR", "run the program in this git worktree of the workspace, made when missing "
                 "(`git worktree add`, on --worktree-branch from --worktree-base; agentbox.session.worktrees)"),
    LaunchOption("--worktree-branch", "BRANCH", "the worktree's branch (taken when it exists, else made)"),
    LaunchOption("--worktree-base", "COMMIT", "the commit a new worktree branch starts from"),
    LaunchOption("--task", "DIR", "a background task (agentbox.tasks.records): instead of running the program, start "
                 "task-runner.sh with it, detached, on this task's folder in the outbox; return once it runs"),
    LaunchOption("--isolated-task", None, "with --task: an isolated task (`agentbox run --on`): the runner makes "
                 "the task's copy from the staged bundles its spec names (agentbox.tasks.bundles), runs the program "
                 "there, and leaves changes.patch (and summary.md) in the task's folder; the workspace is not used"),
    LaunchOption("--notify", "on|off", "install (on) or remove (off) the attention hooks: Claude Code's "
                 "Notification and Stop hooks, which ring the terminal and tell the host (notify)"),
    LaunchOption("--session", "NAME", "run the program in a tmux session named NAME (or NAME-2, ...) that "
                 "outlives this shell (session.sh start); never with --isolated-from or --creds-outbox"),
    LaunchOption("--session-attach", None, "attach to that session at once (session.keepAlive) instead of "
                 "leaving it detached (--detach)"),
    LaunchOption("--session-reply", "DIR", "this launch's folder in the outbox, where session.sh writes the "
                 "session's name (and, after an attach, how it ended)"),
    LaunchOption("--session-events", "DIR", "the outbox folder for the session's attention events (notify)"),
    LaunchOption("--session-live", "DIR", "the outbox folder where the session keeps a marker fresh while it runs "
                 "(the host's watcher and network proxy stay while one is)"),
    LaunchOption("--go", "TOKEN", "start the program only once the staging folder has go/TOKEN, which the host "
                 "writes when it recorded the start checkpoint (its first line: the checkpoint's id, exported as "
                 "AGENTBOX_CHECKPOINT); after GO_LIMIT seconds without it, stop with GO_TIMED_OUT"),
    LaunchOption("--canaries", "ID", "place this session's canary secrets, staging/canaries/ID (KIND=VALUE lines, "
                 "agentbox.session.canaries): ~/.aws/credentials and ~/.env (unless the user keeps their own there) "
                 "and the program's environment"),
    LaunchOption("--setup-digest", "DIGEST", "the host's digest of everything the setup applies "
                 "(agentbox.session.setupdigest): when it and the VM's boot are those of the last setup that "
                 "finished (~/.agentbox/setup.applied), launch.sh skips the setup and runs no process before the "
                 "program; absent (isolated mode): the setup runs"),
    LaunchOption("--setup-only", None, "stop after the setup, running no program and installing no missing "
                 "--binary (`agentbox start`: the first launch then finds its setup done)"),
)

OptionValue = str | bool | Sequence[str] | None


class IsolatedLaunch(NamedTuple):
    """launch.sh's isolated-mode options for one session."""

    source: str  # --isolated-from
    base: str  # --base
    outbox: Path  # --outbox
    chdir: str  # --chdir
    aside: bool = False  # --copy-aside: a VM created live, whose workspace path is the user's files


class SessionLaunch(NamedTuple):
    """launch.sh's session options: the program runs in a tmux session that outlives the shell
    (agentbox.session.detached)."""

    name: str  # --session: the name it starts from
    attach: bool  # --session-attach
    reply: Path  # --session-reply
    events: Path | None  # --session-events (None: notify is off)
    live: Path | None = None  # --session-live


class CredentialReturn(NamedTuple):
    """What launch.sh hands back after the program: copies of `files` (guest paths) in `folder`."""

    folder: Path
    files: Sequence[str]


def launch_options(values: Mapping[str, OptionValue]) -> list[str]:
    """launch.sh's options from {name: value} (a flag: True; a repeated option: a list), in LAUNCH_OPTIONS order."""
    unknown = set(values) - {option.name for option in LAUNCH_OPTIONS}
    if unknown:
        raise ValueError(f"launch.sh has no option {', '.join(sorted(unknown))} (see contract.LAUNCH_OPTIONS)")
    argv: list[str] = []
    for option in LAUNCH_OPTIONS:
        value = values.get(option.name)
        if value is None or value is False:
            continue
        if option.value is None and value is True:
            argv.append(option.name)
        elif option.value is not None and not option.repeated and isinstance(value, str):
            argv += [option.name, value]
        elif option.repeated and isinstance(value, Sequence) and not isinstance(value, str):
            for item in value:
                argv += [option.name, item]
        else:
            raise ValueError(f"launch.sh option {option.name} does not take {value!r}")
    return argv
