"""`agentbox doctor`: one screen of checks of Lima, the config, the VM, credentials and guards.

Credentials are checked for the agents in use (named in a config file, or logged in on the host or
in the VM), not for every agent agentbox knows; the VM check includes settings changed since it was
created (agentbox.vm.drift), which only a new VM gets.

Every check becomes a Check (OK, WARN or FAIL); nothing here raises for a problem it finds. It
costs at most three limactl calls: `--version`, `list` and, when the VM runs, one `shell` that runs
provision/doctor-probe.sh.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from agentbox import hosttools, paths, resources, staginglayout
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.cli.verdicts import FAIL, OK, WARN, Check, version_tuple
from agentbox.config import cacerts, load, trust
from agentbox.credentials import brokerreport, loginfiles
from agentbox.errors import AgentboxError, ConfigError, LimaError
from agentbox.git import dirs
from agentbox.net import guard, hold
from agentbox.review import tripwire
from agentbox.safetext import visible
from agentbox.tasks.activity import ProjectActivity
from agentbox.vm import drift, forwards, golden, inplace, lifecycle, statefile
from agentbox.vm.lima import BROKEN, INSTALL_HINT, RUNNING, STOPPED, not_found_hint
from agentbox.vm.render import MINIMUM_LIMA_VERSION

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.vm.lima import Instance, Lima

VM_MISSING = "the VM does not exist yet"
# One `limactl shell` answers every in-VM question: provision/doctor-probe.sh, whose every line is
# "agentbox-doctor KIND VALUE [PATH]".
PROBE = "doctor-probe.sh"
_PROBE_TAG = "agentbox-doctor"

class Probe(NamedTuple):
    """What the one in-VM call found; `reason` says why there is none when it could not run."""

    creds: dict[str, bool]  # guest path relative to home -> exists in the VM
    wrappers: dict[str, str]  # "git"/"gh" -> "guard", "foreign" or "none"
    hooks: bool
    reason: str | None = None
    firewall: tuple[bool, bool] | None = None  # nft installed, agentbox's firewall in place
    provisioned: bool | None = None  # agentbox's provisioning finished at this boot (None: not known)


def run(cwd: Path, lima: Lima) -> list[Check]:
    checks: list[Check] = []
    config_checks: list[Check] = []
    config = check_config(cwd, config_checks)  # first: limactl is never looked up in a folder the VM writes
    if config is not None:
        hosttools.distrust_all(config.agent_writable())
    lima_usable = check_lima(lima, checks)
    checks += config_checks
    if config is None:
        return checks
    check_git(config, checks)
    check_tripwire(config, checks)
    instance, owned = check_vm(lima, config, checks) if lima_usable else (None, False)
    if lima_usable:
        check_base(lima, config, checks)
    if owned:
        check_drift(config, checks)
    if owned and instance is not None:
        check_ports(lima, instance, checks)
    probe = probe_vm(lima, config, instance, owned, lima_usable, checks)
    if owned and instance is not None:
        check_provisioning(instance, probe, checks)
    check_credentials(config, probe, checks)
    check_guards(config, probe, checks)
    check_network(config, probe, checks)
    return checks


# -- Lima --------------------------------------------------------------------------------------


def check_lima(lima: Lima, checks: list[Check]) -> bool:
    """limactl on PATH and recent enough; whether VM checks can go on."""
    found = hosttools.which(lima.executable)
    if found is None:
        checks.append(Check("lima", FAIL, "limactl was not found on PATH, so agentbox cannot run any VM",
                            not_found_hint(lima.executable)))
        return False
    try:
        version = lima.version()
    except LimaError as error:
        checks.append(Check("lima", FAIL, f"{found} does not work: {error.message}", f"Reinstall Lima. {INSTALL_HINT}"))
        return False
    parsed = version_tuple(version)
    if parsed is None:
        checks.append(Check("lima", WARN, f"Lima {version} ({found}): agentbox cannot tell whether it is new enough",
                            f"agentbox needs Lima {MINIMUM_LIMA_VERSION} or later; `limactl --version` shows yours."))
    elif parsed < (version_tuple(MINIMUM_LIMA_VERSION) or (0,)):
        checks.append(Check("lima", FAIL, f"Lima {version} ({found}) is older than {MINIMUM_LIMA_VERSION}, "
                            "the oldest agentbox supports", f"Upgrade Lima (`brew upgrade lima`). {INSTALL_HINT}"))
    else:
        checks.append(Check("lima", OK, f"Lima {version} (limactl at {found})"))
    return True


# -- config ------------------------------------------------------------------------------------


def check_config(cwd: Path, checks: list[Check]) -> Config | None:
    """Load the config; None when it is invalid or names no usable workspace (later checks need both)."""
    try:
        config = load.load(cwd, describe=True)
    except ConfigError as error:
        checks.append(Check("config", FAIL, f"the config is not valid: {error.message}",
                            error.hint or "Fix it, then run `agentbox config` to see the result."))
        return None
    used = [f"global {config.global_file}" if config.global_file else None,
            f"local {config.local_file}" if config.local_file else None]
    files = ", ".join(name for name in used if name) or "no config files, built-in defaults"
    checks.append(Check("config", OK, f"config is valid ({files})"))
    for unusable in config.unusable:
        checks.append(
            Check(
                "config",
                FAIL,
                f"{unusable.shown} is not used: {unusable.reason}, so launches refuse to run",
                f"Fix it with `{unusable.fix}`.",
            )
        )
    for notice in config.notices:
        if not any(notice == unusable.notice() for unusable in config.unusable):
            checks.append(Check("config", WARN, notice, "agentbox ignores that setting until it is fixed."))
    try:
        workspace = config.require_workspace()
    except ConfigError as error:
        checks.append(Check("workspace", FAIL, error.message, error.hint))
        return None
    checks.append(Check("workspace", OK, f"workspace {workspace} (VM {config.vm_name})"))
    check_trust(config, checks)
    check_ca_certificates(config, checks)
    return config


def check_trust(config: Config, checks: list[Check]) -> None:
    """A local config that widens what the VM gets must be trusted, or every launch refuses it (exit 2)."""
    risky = trust.risky_keys(config) if config.local_file is not None else []
    if config.local_file is None or not risky:
        return
    keys = ", ".join(dict.fromkeys(item.split(" ")[0].rstrip(":") for item in risky))
    if trust.is_trusted(config):
        checks.append(Check("trust", OK, f"{config.local_file} is trusted as it is ({keys})"))
        return
    why = "changed since you trusted it" if trust.trusted_record(config.local_file) else "is not trusted"
    checks.append(
        Check(
            "trust",
            FAIL,
            f"{config.local_file} {why}, so launches refuse it: it sets {keys}",
            f"Read it (`agentbox trust --show`), then run `agentbox -C {config.local_file.parent} trust`.",
        )
    )


def check_ca_certificates(config: Config, checks: list[Check]) -> None:
    """caCert and NODE_EXTRA_CA_CERTS must be readable PEM files, or creating the VM fails."""
    try:
        sources = [source for source in cacerts.sources(config) if source.used]
    except AgentboxError as error:
        checks.append(Check("ca", FAIL, error.message, error.hint))
        return
    for source in sources:
        name = "caCert" if source.config_file is not None else "NODE_EXTRA_CA_CERTS"
        where = f"`caCert` in {source.config_file}" if source.config_file else "NODE_EXTRA_CA_CERTS on the host"
        found = cacerts.inspect_file(source.path)
        if not found.exists:
            problem = "does not exist"
        elif found.error:
            problem = f"cannot be read ({found.error})"
        elif not found.pems:
            problem = "holds no PEM certificate"
        else:
            checks.append(_ca_content_check(name, source.path, found.pems))
            continue
        checks.append(
            Check(
                "ca",
                FAIL,
                f"{name}: {source.path} {problem}, so creating the VM fails",
                f"Fix {where} (`agentbox ca ls` shows what is configured).",
            )
        )


def _ca_content_check(name: str, path: Path, pems: tuple[str, ...]) -> Check:
    """A readable CA file: fine, unless it is a whole system trust store (the VM has the public roots)."""
    embedded = cacerts.embedding(path, pems)
    if embedded.whole_store is None:
        count = len(pems)
        dropped = count - len(embedded.kept)
        extra = f" ({dropped} of them public roots the VM trusts already)" if dropped else ""
        return Check("ca", OK, f"{name}: {count} CA certificate{'s' if count != 1 else ''} from {path}{extra}")
    return Check(
        "ca",
        WARN,
        f"{name}: {path} {embedded.whole_store}: {cacerts.embedding_summary(embedded)}",
        "Name only the certificates the VM needs (such as a corporate CA): put them in a file of their "
        "own and set `caCert` to it (`agentbox ca add` does it on macOS), or point NODE_EXTRA_CA_CERTS "
        "at that file.",
    )


def check_git(config: Config, checks: list[Check]) -> None:
    """A worktree's main git folder is mounted only when gitdirs validates it; say which way it went."""
    workspace = config.require_workspace()
    git = dirs.locate(workspace)
    if git.problem:
        checks.append(
            Check(
                "git",
                WARN,
                f"agentbox does not mount the git common dir: {git.problem}",
                "git in the VM will not work in this worktree. If it is a real `git worktree add` "
                "checkout, `git worktree repair` on the host rewrites its pointers.",
            )
        )
    elif git.common_dir_outside(workspace) is not None:
        checks.append(Check("git", OK, f"git worktree: the VM mounts the main repository's {git.common_dir} "
                                         "read-only, with what git writes for this checkout writable"))


def check_tripwire(config: Config, checks: list[Check]) -> None:
    """Changes to files the host runs, made in or after a session, that nobody has accepted yet."""
    found = tripwire.audit(config.require_workspace(), ProjectActivity.of(config))
    if found:
        checks.append(
            Check(
                "tripwire",
                WARN,
                tripwire.summary(found),
                "Run `agentbox audit` to see the diffs, `agentbox audit --ack` to accept them.",
            )
        )


# -- the VM ------------------------------------------------------------------------------------


def check_vm(lima: Lima, config: Config, checks: list[Check]) -> tuple[Instance | None, bool]:
    """The VM's state and whether it belongs to this workspace."""
    vm_name = config.vm_name
    try:
        instance = lima.get(vm_name)
    except LimaError as error:
        checks.append(
            Check("vm", FAIL, f"cannot ask Lima about {vm_name}: {error.message}",
                  error.hint or "Check `limactl list`.")
        )
        return None, False
    if instance is None:
        checks.append(
            Check(
                "vm",
                WARN,
                f"VM {vm_name} does not exist yet: it is created on first launch",
                "Run `agentbox start` (or an agent command such as `agentbox claude`) to create it.",
            )
        )
        return None, False
    if instance.status == RUNNING:
        checks.append(Check("vm", OK, f"VM {vm_name} is running"))
    elif instance.status == STOPPED:
        checks.append(Check("vm", OK, f"VM {vm_name} is stopped; it starts on next launch"))
    elif instance.status == BROKEN:
        errors = instance.raw.get("errors") or []
        detail = f" ({errors[0]})" if errors and isinstance(errors[0], str) else ""
        checks.append(
            Check(
                "vm",
                FAIL,
                f"VM {vm_name} is Broken{detail}",
                "`agentbox start` tries Lima's recovery; if that fails, `agentbox start --recreate` "
                f"creates it anew (its disk is lost, your workspace is not). Lima's log: {instance.log_path}",
            )
        )
    else:
        checks.append(
            Check(
                "vm",
                WARN,
                f"VM {vm_name} is {instance.status or 'in an unknown state'}",
                f"It may be starting or stopping: run `agentbox doctor` again in a moment, "
                f"or see `limactl list` and Lima's log {instance.log_path}.",
            )
        )
    recorded = lifecycle.workspace_of(instance)
    workspace = str(config.workspace)
    if recorded == workspace:
        checks.append(Check("vm.workspace", OK, f"VM {vm_name} belongs to this workspace"))
        return instance, True
    if lifecycle.half_made(instance, config):
        checks.append(Check("vm.workspace", WARN, lifecycle.HALF_MADE.format(name=vm_name),
                            "`agentbox start` makes it again; `agentbox rm --yes` discards it."))
    elif recorded is None:
        checks.append(
            Check(
                "vm.workspace",
                FAIL,
                f"the Lima instance {vm_name} was not created by agentbox (it records no workspace)",
                lifecycle.clash_hint(config, vm_name, foreign=True),
            )
        )
    else:
        checks.append(
            Check(
                "vm.workspace",
                FAIL,
                f"VM {vm_name} belongs to {recorded}, not to this workspace {workspace}",
                lifecycle.clash_hint(config, vm_name),
            )
        )
    return instance, False


def check_base(lima: Lima, config: Config, checks: list[Check]) -> None:
    """The base VM new project VMs are cloned from (agentbox.vm.golden): fresh, stale or absent; and whether
    this project's VM was cloned from an older one. Uses the `list` check_vm made."""
    if config.vm_base != "auto":
        checks.append(Check("base", OK, "vm.base is off: new VMs are created and provisioned from scratch"))
        return
    try:
        current = golden.key(config)
    except (AgentboxError, OSError) as error:
        checks.append(Check("base", WARN, f"cannot work out the base VM's key: {error}"))
        return
    name = golden.instance_name(current)
    record = golden.read_record(current)
    if name not in lima.listed:
        checks.append(Check("base", OK, f"base VM {name} is absent: the next new project VM builds it first",
                            "`agentbox base build` builds it now."))
    elif record is None or golden.age_days(record) > config.base_max_age_days:
        age = "has no build record" if record is None else f"is {golden.age_days(record):.0f} days old"
        checks.append(Check("base", WARN, f"base VM {name} is stale: it {age} (vm.baseMaxAgeDays: "
                            f"{config.base_max_age_days}); the next new project VM rebuilds it first",
                            "`agentbox base build --rebuild` rebuilds it now."))
    else:
        checks.append(Check("base", OK, f"base VM {name} is fresh (built {golden.age_days(record):.1f} days ago)"))
    line = golden.staleness(config, statefile.read(config.vm_name).get("base"))
    if line:
        checks.append(Check("base.vm", WARN, line))


def check_ports(lima: Lima, instance: Instance, checks: list[Check]) -> None:
    """The running VM's guest ports Lima could not forward to the host, with who has each host port."""
    if instance.status != RUNNING:
        return
    holders = forwards.Holders(lima.listed, instance)
    rows = holders.rows(instance)
    blocked = [row for row in rows if not row.forwarded]
    if not blocked:
        checks.append(Check("vm.ports", OK, f"VM {instance.name}: every port it forwards reaches the host "
                                            f"({len(rows)} forwarded; `agentbox ports` lists them)"))
    for row in blocked:
        hint = forwards.clash_hint(row, holders) + "."
        checks.append(Check("vm.ports", WARN, visible(forwards.clash_text(row)), hint))


def check_drift(config: Config, checks: list[Check]) -> None:
    """Settings that only a new VM gets (cpus, memory, mounts, ...) changed since this VM was created."""
    recorded = statefile.read(config.vm_name).get("fingerprint")
    if not recorded:
        return  # created before agentbox recorded them: nothing to compare with
    check_in_place(config, recorded, checks)
    changed = drift.changed_settings(recorded, config)
    if not changed:
        checks.append(Check("vm.settings", OK, f"VM {config.vm_name} was created with the current settings"))
        return
    current = drift.creation_fingerprint(config)
    described = [_change(key, recorded.get(key), current[key]) for key in changed]
    checks.append(
        Check(
            "vm.settings",
            WARN,
            f"changed since VM {config.vm_name} was created, so the VM does not have them yet: " + ", ".join(described),
            "They take effect only in a new VM: `agentbox start --recreate` creates it anew "
            "(the VM's disk is lost; your workspace is not touched).",
        )
    )


def check_in_place(config: Config, recorded: dict[str, object], checks: list[Check]) -> None:
    """cpus, memory or a larger disk changed in the config: Lima applies them when the VM next starts."""
    found = inplace.plan(recorded, config)
    if found.pending:
        checks.append(Check(
            "vm.resources", WARN, f"{', '.join(found.changes)} in the config: VM {config.vm_name} gets them when it "
            "next starts", "`agentbox restart` applies them now (Lima changes the stopped VM; no new VM).",
        ))


def _change(key: str, before: object, after: object) -> str:
    """ "cpus 4 -> 2" for a plain value; the name alone for mounts, the template and vm.lima."""
    if isinstance(before, (str, int, type(None))) and isinstance(after, (str, int, type(None))) and key != "lima":
        return f"{key} {_shown(before)} -> {_shown(after)}"
    return key


def _shown(value: object) -> str:
    return "default" if value is None else str(value)


def probe_vm(
    lima: Lima, config: Config, instance: Instance | None, owned: bool, lima_usable: bool, checks: list[Check]
) -> Probe:
    """Look inside the VM once (only when it runs and is this workspace's)."""
    if not lima_usable:
        return _no_probe("Lima is not usable")
    if instance is None:
        return _no_probe(VM_MISSING)
    if not owned:
        return _no_probe(f"{instance.name} is not this workspace's VM")
    if instance.status != RUNNING:
        return _no_probe(f"the VM is {instance.status or 'not running'}")
    relatives = sorted({guest[2:] for _, guests in credential_groups(config) for guest in guests})
    try:
        script = resources.text("provision", PROBE)
        code, output = lima.shell_output(instance.name, ["bash", "-c", script, _PROBE_TAG, *relatives])
    except LimaError as error:
        code, output = -1, error.message
    probe = parse_probe(output)
    if probe is None:
        checks.append(
            Check(
                "vm.shell",
                WARN,
                f"cannot look inside {instance.name} (`limactl shell` exit {code})",
                "Try `agentbox shell`; if it does not connect, `agentbox restart`.",
            )
        )
        return _no_probe("`limactl shell` failed")
    return probe


def parse_probe(output: str) -> Probe | None:
    creds: dict[str, bool] = {}
    wrappers: dict[str, str] = {}
    hooks: bool | None = None
    firewall: tuple[bool, bool] | None = None
    provisioned: bool | None = None
    for line in output.splitlines():
        parts = line.rstrip("\r").split(" ", 3)
        if len(parts) < 3 or parts[0] != _PROBE_TAG:
            continue
        kind, value = parts[1], parts[2]
        if kind == "cred" and len(parts) == 4:
            creds[parts[3]] = value == "yes"
        elif kind == "wrapper" and len(parts) == 4:
            wrappers[parts[3]] = value
        elif kind == "hooks":
            hooks = value == "yes"
        elif kind == "firewall" and len(parts) == 4:
            firewall = (value == "yes", parts[3] == "yes")
        elif kind == "provisioned" and value in ("yes", "no"):
            provisioned = value == "yes"
    if hooks is None:  # the last line: without it the script did not finish
        return None
    return Probe(creds, wrappers, hooks, firewall=firewall, provisioned=provisioned)


def check_provisioning(instance: Instance, probe: Probe, checks: list[Check]) -> None:
    """A running VM whose provisioning did not finish at this boot, and a last start Lima reported degraded
    (remembered in the VM's state by agentbox.vm.lifecycle.start)."""
    if instance.status != RUNNING:
        return
    name = instance.name
    again = "`agentbox restart` runs the provisioning again."
    if probe.provisioned is False:
        checks.append(Check("vm.provisioning", FAIL,
                            f"{name}'s provisioning did not finish at its last start, so tools it installs (node, "
                            "npm, gh, docker) may be missing",
                            f"See why: `agentbox shell -- sudo tail -n 50 /var/log/cloud-init-output.log`; {again}"))
    elif probe.provisioned:
        checks.append(Check("vm.provisioning", OK, f"{name}'s provisioning finished at its last start"))
    degraded = lifecycle.degraded_note(name, statefile.read(name))
    if degraded:
        checks.append(Check("vm.degraded", WARN, degraded))


def _no_probe(reason: str) -> Probe:
    return Probe({}, {}, False, reason)


# -- credentials -------------------------------------------------------------------------------


def credential_groups(config: Config) -> list[tuple[AgentConfig | None, dict[str, list[Path]]]]:
    """Per agent (None for gh and netrc): guest path ("~/...") -> the host files that land there."""
    if not config.credentials.enabled:
        return []
    groups: list[tuple[AgentConfig | None, dict[str, list[Path]]]] = []
    for agent in config.agents.values():
        groups.append((agent, _guest_map(agent.credentials)))
    extra = [
        *(loginfiles.GH_FILES if config.credentials.gh else ()),
        *((loginfiles.NETRC,) if config.credentials.netrc else ()),
    ]
    if extra:
        groups.append((None, _guest_map(extra)))
    return groups


def _guest_map(specs: Iterable[str]) -> dict[str, list[Path]]:
    mapping: dict[str, list[Path]] = {}
    for spec in specs:
        guest = loginfiles.guest_path_for(spec)
        if guest.startswith("~/"):  # the only paths launch stages
            mapping.setdefault(guest, []).append(Path(os.path.expanduser(spec)))
    return mapping


def check_credentials(config: Config, probe: Probe, checks: list[Check]) -> None:
    if not config.credentials.enabled:
        checks.append(Check("credentials", OK, "credentials are off in config (credentials: false)"))
        return
    groups = credential_groups(config)
    used = agents_in_use(config, groups, probe)
    checks.append(_agents_check(config, used))
    checks += check_broker(config)
    for agent, guests in groups:
        if agent is None:
            check = _check_other_logins(config, guests, probe)
        elif agent.name in used:
            check = _check_agent_login(config, agent, guests, probe)
        else:
            check = None
        if check is not None:
            checks.append(check)


def check_broker(config: Config) -> list[Check]:
    """The credential broker: whose logins stay on the host (brokered) and whose are copied in (staged), the
    VM's CA, and a WARN for each note of the last launch (a host login missing: how to log in on the host)."""
    report = brokerreport.of(config, config.vm_name)
    if not report["enabled"]:
        return [Check("broker", OK, f"credential broker off: every agent's login is staged (copied "
                      f"into the VM): {', '.join(report['staged']) or 'none'}",
                      "credentials.broker: true keeps the logins of Claude Code, Codex, Gemini CLI and the GitHub "
                      "CLI on the host (docs/security.md, \"The credential broker\")")]
    message = (f"credential broker on: brokered {', '.join(report['brokered']) or 'none'} (the VM holds "
               f"placeholders, no secret of theirs); staged {', '.join(report['staged']) or 'none'}; CA "
               f"{report['caFingerprint'] or 'not made yet (the next launch makes it)'}")
    checks = [Check("broker", OK, message)]
    checks += [Check("broker", WARN, note) for note in report["notes"]]
    return checks


def agents_in_use(
    config: Config, groups: list[tuple[AgentConfig | None, dict[str, list[Path]]]], probe: Probe
) -> dict[str, str]:
    """The agents worth checking, each with why: named in a config file, logged in on the host or in the VM, or
    launched in the VM before."""
    launched = set(brokerreport.launched_in(config.vm_name))
    configured: dict[str, set[str]] = {}
    for key, origin in config.origins.items():
        parts = key.split(".")
        if parts[0] == "agents" and len(parts) > 1 and origin != "default":
            configured.setdefault(parts[1], set()).add(origin.split(" ")[0])
    used: dict[str, str] = {}
    for agent, guests in groups:
        if agent is None:
            continue
        layers = configured.get(agent.name)
        if layers:  # always for an agent the config defines
            names = sorted(layers, key=lambda layer: (layer != "global", layer))
            used[agent.name] = f"set in the {' and '.join(names)} config"
        elif any(host.is_file() for hosts in login_files(agent, guests).values() for host in hosts):
            used[agent.name] = "logged in on the host"
        elif agent.vm_name == config.vm_name and any(
            probe.creds.get(guest[2:]) for guest in login_files(agent, guests)
        ):
            used[agent.name] = "logged in in the VM"
        elif agent.name in launched:
            used[agent.name] = "launched in the VM before"
    return used


def _agents_check(config: Config, used: dict[str, str]) -> Check:
    unused = [name for name in config.agents if name not in used]
    if not used:
        return Check(
            "agents",
            OK,
            "no agent is set in the config or logged in on the host or in the VM, "
            f"so no login is checked ({', '.join(unused)})",
        )
    checked = ", ".join(f"{name} ({why})" for name, why in used.items())
    skipped = f"; not checked: {', '.join(unused)} (neither set in the config nor logged in)" if unused else ""
    return Check("agents", OK, f"agents checked: {checked}{skipped}")


def login_files(agent: AgentConfig, guests: dict[str, list[Path]]) -> dict[str, list[Path]]:
    """The staged files that are a login by themselves (all of them, unless the agent's record names some:
    files some CLIs keep beside their login, like Gemini's installation_id, are copied along but are no login)."""
    spec = BUILTIN_AGENTS.get(agent.name)
    listed = spec.login_files if spec is not None and spec.login_files is not None else guests
    return {guest: hosts for guest, hosts in guests.items() if guest in listed} or guests


def _check_agent_login(config: Config, agent: AgentConfig, guests: dict[str, list[Path]], probe: Probe) -> Check:
    check = f"credentials.{agent.name}"
    if not guests:
        why = (
            "credentials are off for it in config"
            if agent.builtin
            else f"agents.{agent.name}.credentials lists no files"
        )
        return Check(check, OK, f"{agent.name}: no login to bring into the VM ({why})")
    in_vm_probe = probe if agent.vm_name == config.vm_name else _no_probe(f"it runs in its own VM {agent.vm_name}")
    on_host = [guest for guest, hosts in guests.items() if any(host.is_file() for host in hosts)]
    login = login_files(agent, guests)
    spec = BUILTIN_AGENTS.get(agent.name)
    keys = [key for key in (spec.login_env if spec else ()) if config.env.get(key)]
    if keys and not any(host.is_file() for hosts in login.values() for host in hosts):
        return Check(check, OK, f"{agent.name}: logs in with {keys[0]} from the config's env")
    if not any(guest in on_host for guest in login):
        if any(in_vm_probe.creds.get(guest[2:]) for guest in login):
            return Check(check, OK, f"{agent.name}: not logged in on the host; the VM has its own login")
        if spec is not None and spec.login_via_gh and _gh_login_on_host(config):
            return Check(check, OK, f"{agent.name}: uses the GitHub CLI's login (gh), which launches bring into the VM")
        return Check(
            check,
            WARN,
            f"{agent.name}: not logged in on the host",
            f"Log in to {agent.binary} on the host and the next `agentbox {agent.name}` brings the login "
            f"into the VM; or log in inside the VM (`agentbox {agent.name}`).",
        )
    return _login_state(
        check,
        agent.name,
        on_host,
        len(guests),
        agent.vm_name,
        in_vm_probe,
        f"The next `agentbox {agent.name}` copies it into the VM.",
        brokered=agent.name in _brokered(config),
    )


def _brokered(config: Config) -> list[str]:
    return brokerreport.candidates(config) if config.credentials.broker else []


def _gh_login_on_host(config: Config) -> bool:
    return config.credentials.gh and Path(os.path.expanduser(loginfiles.GH_FILES[0])).is_file()


def _check_other_logins(config: Config, guests: dict[str, list[Path]], probe: Probe) -> Check | None:
    """gh and netrc: shown only when the host has them (neither is needed)."""
    on_host = [guest for guest, hosts in guests.items() if any(host.is_file() for host in hosts)]
    if not on_host:
        return None
    names = sorted({"gh" if guest in loginfiles.GH_FILES else "netrc" for guest in on_host})
    return _login_state(
        f"credentials.{'+'.join(names)}",
        " and ".join(names),
        on_host,
        len(on_host),
        config.vm_name,
        probe,
        "The next launch (`agentbox shell` or an agent command) copies it into the VM.",
        brokered=names == ["gh"] and "gh" in _brokered(config),
    )


def _login_state(
    check: str, label: str, on_host: list[str], total: int, vm_name: str, probe: Probe, hint: str,
    brokered: bool = False,
) -> Check:
    """A login present on the host: is it staged for the VM (as placeholders when `brokered`), and is it in the VM?"""

    staged_home = paths.staging_dir(vm_name) / staginglayout.CREDS_HOME
    staged = all((staged_home / guest[2:]).is_file() for guest in on_host)
    count = f" ({len(on_host)} of {total} files)" if len(on_host) != total else ""
    what = "brokered: placeholders staged, the real login stays on the host" if brokered else "staged"
    parts = [f"logged in on the host{count}", what if staged else "not staged now"]
    if probe.reason is None:
        in_vm = all(probe.creds.get(guest[2:], False) for guest in on_host)
        parts.append("in the VM" if in_vm else "not in the VM yet")
        healthy = in_vm
    else:
        parts.append(f"not checked in the VM: {probe.reason}")
        healthy = staged
    return Check(check, OK if healthy else WARN, f"{label}: " + ", ".join(parts), None if healthy else hint)


# -- guards ------------------------------------------------------------------------------------


def check_network(config: Config, probe: Probe, checks: list[Check]) -> None:
    """network.mode, what enforces it, and whether the VM's firewall is in place (agentbox.net.policy)."""
    settings = config.network
    enforcement, why = hold.enforcement(config.vm_name, settings, config.vm_type)
    proxy = guard.running(config.vm_name)
    proxy_words = "" if not settings.proxied else (
        f"; its proxy runs on 127.0.0.1:{proxy.port}" if proxy else "; its proxy starts with the next session")
    checks.append(Check("network", OK, f"network.mode {settings.mode} (enforcement: {enforcement}: {why})"
                        + proxy_words))
    if probe.reason is not None or probe.firewall is None:
        return
    installed, applied = probe.firewall
    if not installed:
        checks.append(Check("network", WARN, "nft is not installed in the VM, so its firewall cannot be set: the "
                            "host's localhost is reachable from it" + (" and programs that ignore the proxy "
                            "variables go around the proxy" if settings.proxied else ""),
                            "`agentbox restart` provisions it (nftables)."))
    elif not applied:
        checks.append(Check("network", WARN, "the VM's firewall is not in place since its last boot",
                            "The next launch sets it (`agentbox shell -- true`)."))


def check_guards(config: Config, probe: Probe, checks: list[Check]) -> None:
    installed = probe.reason is None and probe.wrappers.get("git") == "guard"
    if config.remote_write:
        extra = "; the guards still in the VM are removed at the next launch" if installed else ""
        checks.append(
            Check("guards", OK, "guards are off by config (sync.remoteWrite: true): agents in the VM can push" + extra)
        )
        return
    launch = "the next launch (`agentbox shell` or an agent command)"
    # git.allowPush: session: the guards let `git push` through to the pre-push hook, which keeps it to the VM's
    # own branches (the credential broker decides on the host)
    setting = ("git.allowPush: session, pushes only to agentbox/<vm>/ branches" if config.scoped_pushes
               else "sync.remoteWrite: false")
    if probe.reason == VM_MISSING:
        checks.append(
            Check(
                "guards",
                WARN,
                f"guards ({setting}) are not installed yet: the VM does not exist",
                f"They are installed at {launch}, before anything runs.",
            )
        )
        return
    if probe.reason is not None:
        checks.append(
            Check(
                "guards",
                OK,
                f"guards are on ({setting}) and installed at every launch "
                f"(not checked in the VM: {probe.reason})",
            )
        )
        return
    foreign = [name for name in ("git", "gh") if probe.wrappers.get(name) == "foreign"]
    if foreign:
        paths = " and ".join(f"~/.local/bin/{name}" for name in foreign)
        checks.append(
            Check(
                "guards",
                FAIL,
                f"{paths} in the VM {'is' if len(foreign) == 1 else 'are'} not agentbox's, "
                "so launch does not install the guard there: remote writes through it are not blocked",
                f"Remove it (`agentbox shell -- rm {paths.replace(' and ', ' ')}`); {launch} installs the guard.",
            )
        )
        return
    missing = [name for name in ("git", "gh") if probe.wrappers.get(name) != "guard"]
    if not probe.hooks:
        missing.append("pre-push hook")
    if missing:
        checks.append(
            Check(
                "guards",
                WARN,
                f"guards ({setting}) are not installed in the VM yet (missing: {', '.join(missing)})",
                f"They are installed at {launch}.",
            )
        )
        return
    checks.append(
        Check(
            "guards", OK, f"guards are installed in the VM: git and gh wrappers, pre-push hook ({setting})"
        )
    )


# -- output ------------------------------------------------------------------------------------
