"""A launch from its verified plan (agentbox.session.plan): the warm launch's per-launch steps, nothing decided again.

What the full launch (agentbox.session.launch) does for every session, this does too, in the same order and with
the same functions: the proxy's lease, the start checkpoint and its go marker, the tripwire's fingerprint, the
VM's proof (agentbox.session.warm), the logins' way back, the one `limactl shell`, and after it the end
checkpoint, the write-back, the tripwire's check and Lima's late port warnings. What it skips is what the plan
proved unchanged: the config and its trust, the broker's handshake, the staging folder and the VM's records.
When the proxy is not as the plan found it, or the guest does not prove it is the VM agentbox checked, nothing
ran and None sends the launch down the full path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import paths, staginglayout, vmread
from agentbox.agents.argv import agent_argv
from agentbox.config.checkpointkeys import CheckpointSettings
from agentbox.progress import note, warn
from agentbox.review import quarantine, tripwire
from agentbox.session import canaries, plan, warm
from agentbox.session.checkpointing import SessionCheckpoints
from agentbox.vm.lima import Lima


class _Settings(NamedTuple):
    """What agentbox.session.checkpointing reads of a config: its checkpoint settings."""

    checkpoints: Any


def run(data: dict[str, Any], args: list[str], busy: tripwire.Busy) -> int | None:
    """Run the session the plan describes with the agent's `args`; None when it could not run (nothing did).
    `busy`: what else of the project ran, for the tripwire (agentbox.tasks.activity, for the plan's VMs)."""
    vm_name = data["vm"]
    lease = _lease(data)
    if data.get("proxy") and lease is None:
        return None
    try:
        return _with_lease(data, vm_name, args, busy)
    finally:
        if lease is not None:
            lease.release()


def _lease(data: dict[str, Any]) -> Any:
    proxy = data.get("proxy")
    if not proxy:
        return None
    # deferred: start-up (net.guard: only a launch whose VM has a proxy)
    from agentbox.net import guard

    return guard.lease_running(data["vm"], proxy["port"], proxy["brokers"], proxy["program"])


def _with_lease(data: dict[str, Any], vm_name: str, args: list[str], busy: tripwire.Busy) -> int | None:
    workspace = Path(data["workspace"])
    marks = data["checkpoints"]
    points = SessionCheckpoints(_Settings(CheckpointSettings(*marks["settings"])), Path(marks["tree"]),  # type: ignore[arg-type]
                                data["agent"], marks["verbose"], paths.staging_dir(vm_name) / staginglayout.GO_MARKERS)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # the report's start
    try:
        points.start()
        before, unacknowledged, yours = tripwire.begin_session(workspace, busy, points.session)
        tripwire.report_yours(yours)
        tripwire.remind(unacknowledged)
        instructions = tuple(data.get("instructions") or ())
        if instructions:
            quarantine.start(workspace, instructions, busy, points.session)
        attempt = warm.prove(vm_name, data["token"])
        planted = canaries.plant(vm_name, attempt.nonce)  # the plan's `--canaries {nonce}`
        returns = vmread.fresh_folder(paths.vm_outbox(vm_name), staginglayout.OUTBOX_CREDS, prefix="s") \
            if data.get("returns") else None  # as agentbox.credentials.writeback.begin makes it
        argv = _argv(data, attempt, points.go, returns, args)
        code, lima_said = Lima(debug=False).shell_unlisted(vm_name, argv)
        if warm.fell_back(attempt, code, lima_said):
            if returns is not None:
                vmread.remove_folder(returns.parent.parent, returns)  # as writeback.discard does
            canaries.done(planted)
            return None
        points.shell_ended()
        changed = tripwire.end_session(workspace, before, points.session, None)  # before any file is put back
        held = None
        if instructions:  # before the end checkpoint: it records the workspace as agents will read it
            held = quarantine.end(workspace, instructions, points.session, f"{data['agent']} session in {vm_name}")
            changed = quarantine.noted(changed, held)
        points.end()
        canaries.report(planted)
        if returns is not None:
            _write_back(data, returns)
        _late_ports(data)
        if code in (1, 255):
            code = _after_failure(data, code)
        _report(data, started, code, points, changed, held)
        if held is not None:
            quarantine.report(held)
        tripwire.report_session(*changed)
        return code
    finally:
        points.done()


def _report(data: dict[str, Any], started: str, code: int, points: SessionCheckpoints,
            changed: tuple[list[tripwire.Change], int], held: quarantine.Outcome | None) -> None:
    """The session's signed report, as the full launch writes it (agentbox.session.launch._report)."""
    # deferred: start-up (session.endreport, net.sessionlog: only after the shell)
    from agentbox.session import endreport

    facts = endreport.Facts("session", data["agent"], data["vm"], data["workspace"], False, data.get("network"))
    record = endreport.draft(facts, started, code, held_instructions=held.newly if held is not None else ())
    taken = points.taken
    record["checkpoints"]["start"] = taken.checkpoint.id if taken is not None else None
    record["tripwire"] = endreport.tripwire_part(*changed)
    if points.ending:
        endreport.finish_later(record, points.session)
    else:
        endreport.write(record)


def _argv(data: dict[str, Any], attempt: warm.Attempt, go: str | None, returns: Path | None,
          args: list[str]) -> list[str]:
    slots = {plan.NONCE: attempt.nonce, plan.STARTED: str(attempt.started), plan.GO: go or "",
             plan.RETURNS: str(returns) if returns is not None else ""}
    agent = data["command"]
    command = agent_argv(agent["binary"], list(agent["defaultArgs"]), args, agent["model"], agent["after"],
                         tuple(agent["subcommands"]) if agent["subcommands"] is not None else None)
    return [slots.get(part, part) for part in data["argv"]] + ["--", *command]


def _write_back(data: dict[str, Any], folder: Path) -> None:
    # deferred: start-up (credentials.writeback: after the session)
    from agentbox.credentials import writeback

    try:
        writeback.finish(writeback.plan_from_json(data["returns"], folder))
    except OSError as exc:
        warn(f"the session's logins were not copied back to the host: {exc}")


def _late_ports(data: dict[str, Any]) -> None:
    """Lima's warnings of ports the session opened that it could not forward: only when its log changed."""
    log = data.get("limaLog")
    if log is None or plan.signature(log[0], plan.FILE) == log[1]:
        return
    # deferred: start-up (vm.forwards and the VM's records: only when Lima logged something during the session)
    from agentbox.vm import forwards, statefile, verified

    found = verified.cached(data["vm"], statefile.read(data["vm"]))
    if found is not None:
        # known: none. A plan is saved only by a launch that said nothing before its shell, no clash included.
        forwards.warn_clashes(found.instance, {data["vm"]: found.instance}, known=set(), during=True)


def _after_failure(data: dict[str, Any], code: int) -> int:
    """Exit 1 or 255: whether the VM is still there, and what a 255 means, as the full launch says it."""
    # deferred: start-up (session.launch, vm.statefile: only after a session that ended in a failure)
    from agentbox.session.launch import SSH_FAILED, ssh_failed_note, vanished
    from agentbox.vm import statefile, verified

    vm_name = data["vm"]
    found = verified.cached(vm_name, statefile.read(vm_name))
    after = Lima(debug=False).instances().get(vm_name)
    if after is None:
        raise vanished(vm_name, code)
    if code == SSH_FAILED and found is not None:
        note(ssh_failed_note(vm_name, found.instance, after))
    return code
