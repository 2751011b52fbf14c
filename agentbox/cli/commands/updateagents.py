"""`agentbox update-agents [AGENT]...`: update the agent CLIs inside the project's VM (agentbox.sync.update).

It costs `limactl list` and one `limactl shell` per VM (an agent with agents.NAME.vmName has its own VM). The
update runs with the environment a launch stages (agentbox.session.guestenv), sent on the shell's stdin.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from agentbox.cli.commands.common import vm_control
from agentbox.errors import AgentboxError, UsageError
from agentbox.progress import Progress, emit, say
from agentbox.safetext import visible
from agentbox.session import brokersetup, guestenv
from agentbox.staginglayout import GUEST_CA_BUNDLE
from agentbox.sync import update
from agentbox.vm import lifecycle

if TYPE_CHECKING:
    from agentbox.config.load import AgentConfig, Config
    from agentbox.vm.lifecycle import VmControl
    from agentbox.vm.lima import Instance


@click.command("update-agents")
@click.argument("agents", nargs=-1, metavar="[AGENT]...")
@click.pass_context
def update_agents_command(ctx: click.Context, agents: tuple[str, ...]) -> None:
    """Update the agent CLIs in the project's VM to their latest release, without a new VM.

    Each agent is updated its own way: `npm install -g PACKAGE@latest` for the npm ones (in the VM user's
    ~/.local), its install command again for the others, with the environment a launch gives (CA certificates,
    the config's env, the network mode's proxy). Without AGENT: every agent installed in the VM.
    Prints each one's old and new version, then which were updated, already current and failed; exits 1
    naming any agent whose update failed.
    """
    control = vm_control(ctx)
    config = control.config
    config.require_workspace()
    chosen = _chosen(config, agents)
    summary = _Summary()
    unreachable: list[str] = []
    for vm_name, group in _by_vm(chosen).items():
        instance = control.instance(vm_name)
        if instance is None:
            say(f"{vm_name} does not exist yet; its agents are installed, at their latest, by their first launch")
            continue
        argv = update.script_argv(group, named=bool(agents))
        with _launch_env(control, vm_name, instance, group) as env, \
                Progress(f"Updating agents in VM {vm_name}", verbose=control.verbose):
            code, stdout, stderr = control.lima.shell_bytes(vm_name, argv, update.OUTPUT_LIMIT,
                                                            stdin_data=update.env_records(env))
        if code == 255 and not stdout:
            unreachable.append(vm_name)
            summary.failed += [agent.name for agent in group]
            emit(f"agentbox: could not reach {vm_name} to update its agents (ssh exit 255)")
            continue
        outcomes = update.parse(stdout, group)
        for outcome in outcomes:
            if outcome.status in (update.UPDATED, update.UNCHANGED):
                click.echo(outcome.describe())
                (summary.updated if outcome.status == update.UPDATED else summary.current).append(outcome.agent)
            elif outcome.status == update.MISSING and agents:
                summary.failed.append(outcome.agent)
                emit(visible(f"agentbox: {outcome.agent} is not installed in {vm_name} (`agentbox {outcome.agent}` "
                             "installs it)"))
            elif outcome.status == update.FAILED:
                summary.failed.append(outcome.agent)
        if any(outcome.status == update.FAILED for outcome in outcomes):
            for line in stderr.splitlines()[-40:]:
                emit(visible(f"  {line}"))
        if not any(outcome.status != update.MISSING for outcome in outcomes) and not agents:
            say(f"no agent is installed in {vm_name} yet; each installs at its first launch")
    if summary.failed:
        commands = "; ".join(f"{name}: `{update.update_command(config.agent(name))}`" for name in summary.failed
                             if name not in {agent.name for agent in chosen if agent.vm_name in unreachable})
        reach = (f"`agentbox restart` restarts {', '.join(unreachable)}; then run the command again. "
                 if unreachable else "")
        by_hand = (f"What it printed last is above. The update commands ({commands}) can be run by hand in "
                   "`agentbox shell`." if commands else "")
        raise AgentboxError(
            visible(f"updating {', '.join(summary.failed)} failed" + summary.others()),
            hint=visible((reach + by_hand).strip()),
        )
    if summary.updated or summary.current:
        say(visible(f"agentbox: {summary.others().removeprefix('; ')}"))


class _Summary:
    """Which agents were updated, were already current, failed: what the last line names."""

    def __init__(self) -> None:
        self.updated: list[str] = []
        self.current: list[str] = []
        self.failed: list[str] = []

    def others(self) -> str:
        """"; updated: claude; already the latest: codex" (empty when neither)."""
        parts = [f"{label}: {', '.join(names)}" for label, names in
                 (("updated", self.updated), ("already the latest", self.current)) if names]
        return "".join(f"; {part}" for part in parts)


@contextlib.contextmanager
def _launch_env(control: VmControl, vm_name: str, instance: Instance,
                group: list[AgentConfig]) -> Iterator[dict[str, str]]:
    """The VM running, and the environment a launch stages for it (agentbox.session.guestenv): the CA, the config's env
    (with the broker's placeholders for the logins it brokers), and in allowlist and offline mode the proxy's
    variables, the proxy running (started while Lima is asked, as for a launch) until the update ends."""
    config = control.config
    brokering = brokersetup.prepare(config, vm_name)
    lease = brokersetup.begin_proxy(config, vm_name, {agent.name: agent.endpoints for agent in group})
    try:
        lifecycle.ensure_running(control, vm_name, instance)
        env = guestenv.of(config, lease.access if lease is not None else None,
                            brokering.prepared.env if brokering is not None else None)
        if brokering is not None and brokering.authority is not None:
            env.setdefault("NODE_EXTRA_CA_CERTS", GUEST_CA_BUNDLE)  # the broker's CA is in the guest's trust store
        yield env
    finally:
        if lease is not None:
            lease.release()


def _chosen(config: Config, names: tuple[str, ...]) -> list[AgentConfig]:
    """The agents named (each must exist and have an update command), or the project VM's agents that have one."""
    if not names:
        return [agent for agent in config.agents.values()
                if agent.vm_name == config.vm_name and update.update_command(agent)]
    chosen = []
    for name in dict.fromkeys(names):
        if name not in config.agents:
            close = difflib.get_close_matches(name, list(config.agents), n=1, cutoff=0.6)
            agents = f"Agents: {', '.join(config.agents)}."
            raise UsageError(visible(f"no agent `{name}`" + (f": did you mean {close[0]}?" if close else "")),
                             hint=visible(f"Run `agentbox update-agents {close[0]}`. {agents}" if close else agents))
        agent = config.agent(name)
        if not update.update_command(agent):
            raise UsageError(visible(f"`{name}` has no install command, so agentbox cannot update it"),
                             hint=f"Set agents.{name}.install to the command that installs its latest release.")
        chosen.append(agent)
    return chosen


def _by_vm(agents: list[AgentConfig]) -> dict[str, list[AgentConfig]]:
    groups: dict[str, list[AgentConfig]] = {}
    for agent in agents:
        groups.setdefault(agent.vm_name, []).append(agent)
    return groups
