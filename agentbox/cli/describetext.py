"""`agentbox describe` without --json: the sandbox description (agentbox.session.context) as text for people."""

from __future__ import annotations

from typing import Any

from agentbox.safetext import visible_text

WIDTH = 14  # the label column


def as_text(document: dict[str, Any], block: str) -> str:
    """Every section of the document, one labelled group of lines each, then the memory-file block."""
    vm = document["vm"]
    workspace = document["workspace"]
    remote = document["remoteWrite"]
    credentials = document["credentials"]
    tools = document["tools"]
    ask = document["askForMore"]
    resources = ", ".join(part for part in (
        f"{vm['cpus']} CPUs" if vm["cpus"] else "",
        f"{_size(vm['memory'])} memory" if vm["memory"] else "",
        f"{_size(vm['disk'])} disk" if vm["disk"] else "",
        f"vmType {vm['vmType'] or 'chosen by Lima'}",
        "arch " + (vm["arch"] or "the host's"),
    ) if part)
    lines = [
        f"What the agent is told about its sandbox ({document['contextFile']} in the VM, schema "
        f"{document['schema']}; `agentbox describe --json` prints it as JSON).",
        "",
        *_group("VM", [f"{vm['name']}: {resources}", vm["root"]]),
        *_group("Workspace", [f"{workspace['path']} ({'writable' if workspace['writable'] else 'read-only'}), "
                              f"{workspace['mode']}: {workspace['meaning']}"]),
        *_group("Mounts", [f"{'rw' if m['writable'] else 'ro'}  {_mount(m)}  ({m['role']})"
                           for m in document["mounts"]]),
        *_group("Network", [f"mode: {document['network']['mode']} (enforcement: {document['network']['enforcement']}: "
                            f"{document['network']['enforcementWhy']})",
                            f"internet: {document['network']['internet']}",
                            f"host's localhost: {document['network']['hostLocalhost']}",
                            f"ports: {document['network']['guestPorts']}",
                            f"SSH agent: {document['network']['sshAgent']}",
                            *(f"changed by {key}: the lines above may not hold"
                              for key in document["network"]["changedByConfig"])]),
        *_group("Remote writes", [
            f"{_push_words(remote)}: {remote['setting']}",
            *(f"blocked: {item}" for item in remote["blocked"]),
            *(f"allowed: {item}" for item in remote["allowedCommands"]),
            *([f"instead: {remote['instead']}"] if remote["instead"] else []),
            f"enforced by: {remote['enforcedBy']}",
        ]),
        *_group("Logins", [
            *(f"{item['path']} ({item['for']})" for item in credentials["files"]),
            *([] if credentials["files"] else ["no login files"]),
            f"git identity: {'yes' if credentials['gitIdentity'] else 'no'}",
            f"brought for: {credentials['stagedFor'] or 'agentbox shell (every agent)'}",
        ]),
        *_group("Broker", _broker_lines(credentials["broker"])),
        *_group("Env keys", [", ".join(document["env"]["keys"])]),
        *_group("Tools", [", ".join(_tool(tool) for tool in tools["list"]),
                          "(looked up in the VM at each launch)" if tools["checkedInVm"]
                          else "(looked up in the VM at each launch; not here)"]),
        *_group("Memory files", [", ".join(document["memoryFiles"])]),
        *_group("Ask for more", [ask["how"],
                                 f"global config: {ask['configFiles']['global']}",
                                 f"project config: {ask['configFiles']['local'] or 'none yet (agentbox.yml)'}",
                                 *(f"{change['want']}: {change['key']}; in agentbox.yml needs trust: "
                                   f"{change['projectFileNeedsTrust']}; applies at {change['appliesAt']}"
                                   for change in ask["changes"])]),
        "",
        "The block kept in the agents' memory files:",
        "",
        *("  " + line if line else "" for line in block.rstrip("\n").split("\n")),
    ]
    return visible_text("\n".join(lines)) + "\n"


def _push_words(remote: dict[str, Any]) -> str:
    if remote["allowed"]:
        return "allowed"
    return f"only to {remote['pushes']['branches']}" if remote["pushes"]["scope"] == "session" else "blocked"


def _broker_lines(report: dict[str, Any]) -> list[str]:
    # deferred: start-up (report: only describe's broker section)
    from agentbox.credentials import brokerreport

    return brokerreport.lines(report)


def _group(label: str, lines: list[str]) -> list[str]:
    return [f"{(label if number == 0 else ''):<{WIDTH}}{line}" for number, line in enumerate(lines)]


def _mount(mount: dict[str, Any]) -> str:
    if mount["hostPath"] == mount["guestPath"]:
        return str(mount["guestPath"])
    return f"{mount['guestPath']} (host: {mount['hostPath']})"


def _tool(tool: dict[str, Any]) -> str:
    if tool["path"] is None:
        return str(tool["name"])
    return f"{tool['name']} ({tool['path']})"


def _size(size: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if size >= factor:
            return f"{size / factor:g} {unit}"
    return f"{size} bytes"
