"""The staging folder: everything one launch hands to the VM, and the contract provision/launch.sh reads.

The host folder `folder(VM)` (`<state dir>/vms/VM/staging`) is mounted read-only in the VM at the
same path. Before every launch the host rewrites it (`refresh`), touching only files whose bytes or
mode changed; the VM only reads it. Every folder in it is 0700, every file is written atomically.
launch.sh finds the folder as the one it runs from.

    path                   mode  content                                   read in the VM by
    launch.sh              0700  provision/launch.sh                       `limactl shell`: bash launch.sh OPTIONS
    launch/PART.sh         0600  provision/launch/PART.sh: launch.sh's      launch.sh: sourced, each of them, from
                                 steps (every *.sh there, no other file)     its own folder
    guards/git, guards/gh  0700  wrappers/git, wrappers/gh                 launch.sh: install -m 755 in ~/.local/bin
    guards/pre-push,       0700  wrappers/pre-push, wrappers/hook-dispatch launch.sh: install -m 755 in
      guards/hook-dispatch                                                   ~/.config/agentbox/hooks (core.hooksPath)
    bootstrap/SHA-NAME     0600  a bootstrap script as it was checked,     launch.sh (--on-create, --on-start):
                                 SHA = 16 hex digits of its sha256           bash -euo pipefail FILE, in the workspace
    env                    0600  NAME=value records, each ended by a NUL;  launch.sh: exports each record
                                 absent when there is nothing to set
    network.nft            0600  the VM's firewall (agentbox.net.policy)    launch.sh: sudo nft -f, when it differs
                                                                             from /run/agentbox/network.nft
    creds/home/PATH        0600  a host login file at PATH, its path       launch.sh: install -m 600 as ~/PATH when its
                                 relative to the guest home (folders 0700)   digest is not the one it last applied
    creds/manifest         0600  "SHA256 PATH" records, each ended by a    launch.sh: which creds/home files to apply
                                 NUL, one per staged file                    (skips a PATH that is absolute or has ..)
    creds/gitconfig        0600  the safe part of the host's ~/.gitconfig  git, through include.path in ~/.gitconfig
                                 (credentials.git_identity); absent if off
    creds/stamps.json      0600  host only: each staged file's stat signature and digest (credentials.stage_files)
    creds/gitconfig.stamp  0600  host only: ~/.gitconfig's stat when creds/gitconfig was last made
    sync/AGENT/home/PATH   0600  a file of the agent's own setup as the VM   launch.sh (--sync AGENT): copied to ~/PATH
                          (0700 gets it (sync.agentsetup), PATH            when the host's copy changed since the last
                           if exec) relative to the guest home              sync, unless changed in the VM since then
    sync/AGENT/manifest    0600  "SHA256 MODE PATH" records, each ended by  launch.sh: which sync/AGENT/home files
                                 a NUL (MODE 600 or 700)                     to apply (never an absolute PATH or ..)
    sync/AGENT/stamps.json 0600  host only: each file's stat signature, digest, and why it was left out, if it was
    sync/memory-files/     0700  as sync/AGENT/, for every agent's memory    launch.sh (--sync memory-files, first);
                                 file (CLAUDE.md, AGENTS.md, GEMINI.md)      an agent's own sync leaves them alone
    sync/defaults          0600  "SHA256 PATH" records, NUL-ended: the       launch.sh: a VM copy with that digest is
                                 settings a new VM gets (provisioning)       agentbox's, not the user's edit
    open-url               0700  provision/open-url.sh: prints an address  launch.sh: install -m 755 as
                                 for the user to open on the host            ~/.agentbox/bin/open-url, exported as
                                                                             BROWSER unless env sets one
    context/context.json   0600  the sandbox described for the agent       launch.sh: adds each tool's `command -v`
                                 (agentbox.session.context; names, never values)     (jq), installs it as root's 0644
                                                                             /run/agentbox/context.json, exports
                                                                             AGENTBOX_CONTEXT_FILE
    context/memory.md      0600  the BEGIN/END AGENTBOX block derived      agent-memory.sh, for each --memory-file
                                 from it (context.memory_block)
    context/tools          0600  the tools context.json lists, one name    launch.sh: looks each up (bash's hash)
                                 a line
    context/digests        0600  sha256 of context.json, then of           launch.sh: nothing changed since the last
                                 memory.md, one a line                       launch (~/.agentbox/context.key,
                                                                             memory.key): installs and edits nothing
    broker/ca.crt          0600  the credential broker's CA certificate    launch.sh: installs it as root's 0644
                                 (net.certauthority; never its key); absent  /usr/local/share/ca-certificates/
                                 when the VM's credentials are not           agentbox-broker.crt, runs
                                 brokered                                    update-ca-certificates, exports
                                                                             NODE_EXTRA_CA_CERTS, SSL_CERT_FILE,
                                                                             REQUESTS_CA_BUNDLE; with no broker/,
                                                                             removes the one it installed
    broker/ca.sha256       0600  sha256 of ca.crt                          launch.sh: the same as ~/.agentbox/
                                                                             broker-ca.sha256: installs nothing
    agent-memory.sh        0700  provision/agent-memory.sh                 launch.sh: bash agent-memory.sh put
                                                                             context/memory.md ~/MEMORY-FILE...
    task-runner.sh         0700  provision/task-runner.sh                  launch.sh --task: started detached, runs
                                                                             one background task (tasks.records)
    session.sh             0700  provision/session.sh: detachable sessions launch.sh (--session): start; tmux: run
                                 (session.detached)                          (the host sends the same script inline
                                                                             for `sessions` and `attach`)
    tmux.conf              0600  provision/tmux.conf: agentbox's tmux      session.sh: the settings of its server
                                 server's settings                           (`tmux -L agentbox -f`)
    attention.sh           0700  provision/attention.sh: bell, title and   launch.sh (--notify on): install -m 755
                                 the host's notification event             as ~/.agentbox/bin/attention
    claude-hooks.json      0600  provision/claude-hooks.json: Claude       launch.sh (--notify on): installed as
                                 Code's Notification and Stop hooks          /etc/claude-code/managed-settings.json
    go/TOKEN               0600  per launch: the start checkpoint's id     launch.sh (--go TOKEN): runs the program
                                 (session.checkpointing), written            once it is there; exports the id as
                                 when it is recorded                         AGENTBOX_CHECKPOINT
    proof/NONCE            0600  per launch, empty: the nonce of a launch  the stub before launch.sh (agentbox.session
                                 that made no `limactl list`                 .warm): this VM mounts this staging folder
    canaries/ID            0600  per launch: the session's canary secrets  launch.sh (--canaries ID): ~/.aws/
                                 (agentbox.session.canaries), removed        credentials, ~/.env, the program's
                                 after the shell                             environment (launch/canary.sh)

The per-launch files and the digests above are left out of the setup's digest (agentbox.session.setupdigest).
The outbox `outbox(VM)` (`<state dir>/vms/VM/outbox`) is the one folder of agentbox's the VM may write:
mounted writable at the same path, read by the host after the session, everything in it treated as
written by an attacker (size caps, no symlinks followed, regular files only; agentbox.credentials.writeback,
agentbox.review.proposals).

    path                   written by                                  read by
    creds/SESSION/         the host, before the session (a fresh       launch.sh: --creds-outbox
                           random name, 0700)
    creds/SESSION/N        launch.sh, after the program exits: the     the host (credentials.writeback), which then
                           guest's copy of the Nth --creds-return        removes SESSION/
                           file, when it differs from the copy last
                           installed from the host (through N.partial)
    SESSION/               the host, before an isolated session (a     launch.sh: --outbox
                           fresh random id, 0700)
    SESSION/changes.patch  launch.sh, when the program exits: the      the host (agentbox.review.proposals), which makes
    (base, summary.md...)  copy's changes (agentbox.review.isolation)          it a proposal and removes SESSION/
    tasks/ID/spec, prompt  the host, before `agentbox run`'s shell     task-runner.sh (its settings, the prompt)
    tasks/ID/state,        task-runner.sh: its state (replaced whole),  the host (agentbox.tasks.records), which moves
      stdout, stderr,        the program's output, a heartbeat           stdout and stderr into the task's record
      heartbeat                                                            when it ended, then removes ID/
    tasks/ID/cancel        the host (`agentbox cancel`)                 task-runner.sh: stop the task
    sessions/reply-ID/     the host, before a session's start or an    session.sh: `result` (key=value lines) and,
                           attach (a fresh random name, 0700)            for an ended session, `last-output`; the
                                                                         host reads them, then removes reply-ID/
    sessions/events/       session.sh and attention.sh: NAME.event     the host's watcher (agentbox.session.attention):
                           (kind, session, agent, message lines) when  a desktop notification, then removes it
                           a session no one is attached to needs you
    sessions/events/live/  session.sh: one empty file per session      the watcher: it ends when none is left
                           that runs

launch.sh records what it applied in ~/.agentbox/setup.applied ("DIGEST BOOT-ID", --setup-digest's digest of
every file above that the setup applies: agentbox.session.setupdigest), after a setup that finished; a launch with
the same digest in the same boot runs no setup (provision/launch/current.sh).

launch.sh's command line is LAUNCH_OPTIONS below, in that order, then `--` and the program with its
arguments (none: a login shell). launch.sh refuses an option it does not know (exit 2), so a staged
script and a host that disagree stop instead of running an option as the program. Its own state
stays in the guest (~/.agentbox: applied credential digests, bootstrap and provisioning markers,
and sync/AGENT/: what the last sync applied, what it announced as waiting).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import paths, resources, timing
from agentbox.credentials import loginfiles
from agentbox.fsutil import atomic_write, private_dir, write_if_changed
from agentbox.net import hold, policy, pushes
from agentbox.progress import warn
from agentbox.session import context, guestenv, setupdigest
from agentbox.staginglayout import (
    ATTENTION_SCRIPT,
    BOOTSTRAP,
    BROKER,
    BROKER_CA,
    BROKER_CA_DIGEST,
    CLAUDE_HOOKS,
    CREDS,
    CREDS_HOME,
    CREDS_MANIFEST,
    CREDS_STAMPS,
    ENV_FILE,
    GIT_IDENTITY,
    GIT_IDENTITY_STAMP,
    GUARD_FILES,
    GUARDS,
    LAUNCH_PARTS,
    LAUNCH_SCRIPT,
    MEMORY_SCRIPT,
    NETWORK_RULES,
    OPEN_URL,
    SESSION_SCRIPT,
    TASK_RUNNER,
    TMUX_CONF,
    CredentialReturn,
    IsolatedLaunch,
    OptionValue,
    SessionLaunch,
    launch_options,
)
from agentbox.sync import agentsetup

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.credentials.broker.brokered import Prepared
    from agentbox.net.certauthority import BrokerCA
    from agentbox.session.bootstrap import Plan
    from agentbox.session.prepare import Launch
    from agentbox.session.worktrees import Worktree
    from agentbox.vm.lima import Instance

class Refreshed(NamedTuple):
    folder: Path
    credentials: list[loginfiles.Staged]  # the login files this launch staged
    env_keys: tuple[str, ...] = ()  # the names of the session's env (staging/env)


class LaunchOptions(NamedTuple):
    """What one launch adds to launch.sh's command line beyond the launch record (agentbox.session.prepare)."""

    isolated: IsolatedLaunch | None = None  # an isolated session's copy
    returns: CredentialReturn | None = None  # where the VM hands the session's logins back
    task: Path | None = None  # a background task's folder in the outbox: launch.sh starts its runner
    isolated_task: bool = False  # that task works on a copy made from the staged bundles
    session: SessionLaunch | None = None  # a kept session
    worktree: Worktree | None = None
    setup_only: bool = False  # the setup alone, no program (agentbox.session.presetup)


def launch_command(launch: Launch, staging: Path, options: LaunchOptions) -> list[str]:
    """The argv `limactl shell` runs: launch.sh from the staging folder with this launch's options. Scoped pushes
    (git.allowPush: session) may go to the own branches of the VM as the broker knows it (launch.folders)."""
    config, scripts, agent, vm_name = launch.config, launch.scripts, launch.agent, launch.folders
    isolated, returns, task, worktree, session = (options.isolated, options.returns, options.task, options.worktree,
                                                  options.session)
    values: dict[str, OptionValue] = {
        "--wait": str(config.startup_wait_sec),
        "--workspace": str(launch.workspace),
        "--guards": guards_mode(config),
        "--push-namespace": pushes.namespace(vm_name) if config.scoped_pushes else None,
        "--timing": timing.enabled(),
        "--on-create": scripts.on_create,
        "--on-start": scripts.on_start,
        # The memory files first: an agent's own records may still name its memory file (launch/sync.sh).
        "--sync": [agentsetup.MEMORY] * config.sync_agent_config + [a.name for a in synced_agents(config, agent)],
        "--memory-file": [path[2:] for path in context.memory_files()],
        "--notify": "on" if config.notify else "off",
    }
    if agent is not None:
        values["--binary"] = agent.binary
        values["--install"] = agent.install or ""
    if isolated is not None:
        values["--isolated-from"] = isolated.source
        values["--base"] = isolated.base
        values["--outbox"] = str(isolated.outbox)
        values["--chdir"] = isolated.chdir
        values["--copy-aside"] = isolated.aside
    if returns is not None:
        values["--creds-outbox"] = str(returns.folder)
        values["--creds-return"] = list(returns.files)
    if worktree is not None:
        values["--worktree"] = worktree.path
        values["--worktree-branch"] = worktree.branch
        values["--worktree-base"] = worktree.base
    if task is not None:
        values["--task"] = str(task)
        values["--isolated-task"] = options.isolated_task
    if session is not None:
        values["--session"] = session.name
        values["--session-attach"] = session.attach
        values["--session-reply"] = str(session.reply)
        values["--session-events"] = str(session.events) if session.events is not None else None
        values["--session-live"] = str(session.live) if session.live is not None else None
    values["--setup-only"] = options.setup_only
    if isolated is None:  # isolated mode's copy is prepared at each launch, under the setup's lock
        values["--setup-digest"] = setupdigest.setup_digest(staging, values)
    return ["/bin/bash", str(staging / LAUNCH_SCRIPT), *launch_options(values)]


def guards_mode(config: Config) -> str:
    """launch.sh's --guards: off with sync.remoteWrite, push-scoped with git.allowPush: session, else on."""
    if config.remote_write:
        return "off"
    return "push-scoped" if config.scoped_pushes else "on"


def synced_agents(config: Config, agent: AgentConfig | None) -> list[AgentConfig]:
    """The agents whose own setup this launch brings: the launched one, every one for a shell."""
    if not config.sync_agent_config:
        return []
    candidates = [agent] if agent is not None else list(config.agents.values())
    return [a for a in candidates if agentsetup.spec_of(a) is not None]


def refresh(launch: Launch, instance: Instance | None = None, proxy_port: int | None = None) -> Refreshed:
    """Bring the VM's staging folder (launch.folders') up to date for one launch (of its agent, or a shell).

    `instance` is the VM's row of the launch's `limactl list`: host paths in the agents' settings are
    rewritten to its user's home. The credential broker's placeholder logins (launch.brokering) are staged instead
    of the host's (agentbox.credentials.broker.brokered), with its CA, which launch.sh installs in the guest's trust
    store (no CA removes one a launch installed before). `proxy_port`: where the VM reaches its proxy (this
    machine's port, or a remote host's forward of it); the proxy variables carry the proxy secret of `launch.folders`
    (agentbox.net.guard). The sandbox's description is staged later (stage_context), once the session's mode and
    start checkpoint are known.
    """
    config, name, agent, scripts = launch.config, launch.folders, launch.agent, launch.scripts
    prepared = launch.brokering.prepared if launch.brokering is not None else None
    broker_ca = launch.brokering.authority if launch.brokering is not None else None
    staging = private_dir(paths.staging_dir(name))
    guest_home = agentsetup.guest_home_of(instance)
    write_if_changed(staging / LAUNCH_SCRIPT, resources.text("provision", "launch.sh").encode(), 0o700)
    stage_launch_parts(staging)
    write_if_changed(staging / OPEN_URL, resources.path("provision", "open-url.sh").read_bytes(), 0o700)
    write_if_changed(staging / MEMORY_SCRIPT, resources.text("provision", MEMORY_SCRIPT).encode(), 0o700)
    write_if_changed(staging / TASK_RUNNER, resources.text("provision", TASK_RUNNER).encode(), 0o700)
    write_if_changed(staging / SESSION_SCRIPT, resources.text("provision", SESSION_SCRIPT).encode(), 0o700)
    write_if_changed(staging / TMUX_CONF, resources.text("provision", TMUX_CONF).encode(), 0o600)
    write_if_changed(staging / ATTENTION_SCRIPT, resources.text("provision", ATTENTION_SCRIPT).encode(), 0o700)
    write_if_changed(staging / CLAUDE_HOOKS, resources.text("provision", CLAUDE_HOOKS).encode(), 0o600)
    guards = private_dir(staging / GUARDS)
    for wrapper in GUARD_FILES:
        write_if_changed(guards / wrapper, resources.path("wrappers", wrapper).read_bytes(), 0o700)
    stage_bootstrap(scripts, staging)
    settings = config.credentials
    transforms = agentsetup.login_transforms(config, guest_home, staging)
    host_files = loginfiles.launch_files(config, agent)
    if prepared is not None:
        host_files, transforms = brokered_logins(host_files, transforms, prepared)
    staged, warnings = stage_credentials(
        staging, host_files, include_git_identity=settings.enabled and settings.git, transforms=transforms,
    )
    warnings += agentsetup.stage(staging, config, synced_agents(config, agent), guest_home)
    for warning in warnings:
        warn(warning)
    held, said = hold.launch_note(name, config.network, config.vm_type)
    if said:
        warn(said)
    write_if_changed(staging / NETWORK_RULES, policy.ruleset(config.network, proxy_port, held).encode(), 0o600)
    proxy = None
    if proxy_port is not None:
        # deferred: start-up (net.guard: a launch with neither proxy nor broker never loads it)
        from agentbox.net import guard

        proxy = policy.ProxyAccess(proxy_port, guard.secret(name))
    env = guestenv.of(config, proxy, prepared.env if prepared is not None else None)
    write_env(staging, env)
    stage_broker_ca(staging, broker_ca)
    return Refreshed(staging, staged, tuple(env))


def brokered_logins(host_files: list[str], transforms: loginfiles.Transforms, prepared: Prepared
                    ) -> tuple[list[str], dict[str, tuple[str, Callable[[bytes], bytes]]]]:
    """The login files a brokered launch stages: the placeholder versions the broker made (through the file's own
    transform, ~/.claude.json's MCP filter), never the host's; a brokered login the host lacks, not at all."""
    kept = [spec for spec in host_files
            if spec not in prepared.replaced or loginfiles.guest_path_for(spec)[2:] in prepared.files]
    changed = dict(transforms)
    for relative, data in prepared.files.items():
        inner = transforms.get(relative)
        key = "broker:" + hashlib.sha256(data).hexdigest()[:16] + (f":{inner[0]}" if inner else "")

        def placeholder_version(_host_bytes: bytes, data: bytes = data,
                                inner: tuple[str, Callable[[bytes], bytes]] | None = inner) -> bytes:
            return inner[1](data) if inner is not None else data

        changed[relative] = (key, placeholder_version)
    return kept, changed


def stage_broker_ca(staging: Path, broker_ca: BrokerCA | None) -> None:
    """staging/broker: the broker CA's certificate and its digest (launch.sh installs it when the digest is not the
    one it last installed), or no folder when there is no CA. Only the public certificate: its key stays put."""
    folder = staging / BROKER
    if broker_ca is None:
        for path in (staging / BROKER_CA_DIGEST, staging / BROKER_CA):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
        return
    pem = broker_ca.cert_pem().encode()
    private_dir(folder)
    write_if_changed(staging / BROKER_CA, pem, 0o600)
    write_if_changed(staging / BROKER_CA_DIGEST, f"{hashlib.sha256(pem).hexdigest()}\n".encode(), 0o600)


def stage_context(launch: Launch, refreshed: Refreshed, instance: Instance | None, checkpoint: int | None) -> None:
    """Stage the sandbox's description for this launch (agentbox.session.context): what refresh staged, what Lima
    reported of the VM, the session's mode and its start checkpoint."""
    seen = context.Seen([item.guest_path for item in refreshed.credentials], refreshed.env_keys,
                        (refreshed.folder / GIT_IDENTITY).exists(),
                        context.vm_facts(instance) if instance is not None else None,
                        context.effective_mounts(instance) if instance is not None else None)
    document = context.build(launch.config, launch.folders, launch.agent, seen, launch.mode, checkpoint)
    context.stage(refreshed.folder, document)


def write_env(staging: Path, env: dict[str, str]) -> None:
    """staging/env: NAME=value records ended by NUL bytes (any value arrives intact); no file when env is empty."""
    env_file = staging / ENV_FILE
    if env:
        payload = b"".join(f"{key}={value}".encode() + b"\0" for key, value in env.items())
        write_if_changed(env_file, payload, 0o600)
    elif env_file.exists():
        env_file.unlink()


def stage_launch_parts(staging: Path) -> None:
    """staging/launch: every provision/launch/*.sh, which launch.sh sources; a part no longer shipped goes."""
    parts = private_dir(staging / LAUNCH_PARTS)
    shipped = {part.name: part for part in resources.path("provision", LAUNCH_PARTS).glob("*.sh")}
    for name, part in shipped.items():
        write_if_changed(parts / name, part.read_bytes(), 0o600)
    for leftover in parts.iterdir():
        # A dot file is another launch's atomic write under way (two launches at once stage the same parts).
        if leftover.name not in shipped and not leftover.name.startswith("."):
            leftover.unlink(missing_ok=True)


def stage_bootstrap(plan: Plan, staging: Path) -> None:
    """staging/bootstrap: the checked copies (named by content, so an existing one is right); stale ones go."""
    copies = private_dir(staging / BOOTSTRAP)
    for name, data in plan.staged.items():
        if not (copies / name).is_file():
            atomic_write(copies / name, data, mode=0o600)
    for leftover in copies.iterdir():
        if leftover.name not in plan.staged:
            leftover.unlink()




def stage_credentials(
    staging: Path, host_files: list[str], include_git_identity: bool, transforms: loginfiles.Transforms | None = None
) -> tuple[list[loginfiles.Staged], list[str]]:
    """staging/creds: host_files under creds/home, their manifest, the git identity. Returns (staged, warnings)."""
    private_dir(staging / CREDS)
    staged, warnings = loginfiles.stage_files(staging / CREDS_HOME, staging / CREDS_STAMPS, host_files, transforms)
    write_if_changed(staging / CREDS_MANIFEST, manifest(staged))
    loginfiles.refresh_git_identity(staging / GIT_IDENTITY, staging / GIT_IDENTITY_STAMP, include_git_identity)
    return staged, warnings


def manifest(staged: list[loginfiles.Staged]) -> bytes:
    return "".join(f"{item.digest} {item.guest_path}\0" for item in staged).encode()
