"""What the VM gets while Lima provisions it: scripts from provision/, settings files, CA certificates."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from agentbox import resources
from agentbox.agents.builtin import BUILTIN_AGENTS
from agentbox.config import pins
from agentbox.config.load import Config
from agentbox.errors import ConfigError
from agentbox.progress import note

SYSTEM_SCRIPTS = ("10-base-packages.sh", "20-docker.sh", "30-nodejs.sh", "40-github-cli.sh")
USER_SCRIPTS = ("50-user-setup.sh",)

PROVISIONING_NOTE = (
    "agentbox's provisioning ends by writing this boot's id to ~/.agentbox/provisioned of the VM's user;\n"
    "every launch checks it and says when the provisioning did not finish.\n"
)

READINESS_PROBE = """#!/bin/bash
set -eu
if [ "$(cat ~/.agentbox/provisioned 2>/dev/null)" != "$(cat /proc/sys/kernel/random/boot_id)" ]; then
  echo "agentbox provisioning has not finished" >&2
  exit 1
fi
"""
READINESS_HINT = (
    "agentbox's provisioning did not finish. See /var/log/cloud-init-output.log in the VM "
    "(agentbox shell -- sudo tail -n 50 /var/log/cloud-init-output.log)."
)


class DataFile(NamedTuple):
    path: str
    content: str
    owner: str = "{{.User}}"
    permissions: str = "644"
    overwrite: bool = False


class Plan:
    """What every VM gets (plan() fills it in; a plain class: a launch does not import dataclasses)."""

    def __init__(self) -> None:
        self.system_scripts: list[str] = []
        self.user_scripts: list[str] = []
        self.data_files: list[DataFile] = []
        self.ca_certs: list[str] = []
        self.readiness_probe = READINESS_PROBE
        self.readiness_hint = READINESS_HINT


def plan(config: Config | None) -> Plan:
    """What every VM gets; the CA certificates only with a config (the base VM has none: agentbox.vm.golden)."""
    result = Plan()
    result.system_scripts = [resources.text("provision", name) for name in SYSTEM_SCRIPTS]
    result.user_scripts = [resources.text("provision", name) for name in USER_SCRIPTS]
    result.data_files = [
        DataFile("/etc/profile.d/agentbox.sh", resources.text("provision", "profile.sh"), owner="root", overwrite=True),
        DataFile("/etc/agentbox/provisioning", PROVISIONING_NOTE, owner="root", overwrite=True),
        *(DataFile("{{.Home}}/" + path, content) for path, content in home_files().items()),
    ]
    result.ca_certs = ca_certificates(config) if config is not None else []
    return result


def home_files() -> dict[str, str]:
    """The agents' settings a new VM gets in its user's home (path relative to it -> content), written once.

    The launch's sync of the agents' own setup (agentbox.sync.agentsetup) may replace them: they are agentbox's,
    not the user's edits.
    """
    return {spec.settings.path: settings_text(spec.settings.values, spec.settings.syntax)
            for spec in BUILTIN_AGENTS.values() if spec.settings is not None}


def settings_text(values: dict[str, Any], syntax: str) -> str:
    """An agent's settings (AgentSpec.settings: approvals off, each agent's own way) as its file holds them."""
    if syntax == "toml":  # a flat table of strings is all a record holds
        return "".join(f'{key} = "{value}"\n' for key, value in values.items())
    return json.dumps(values, indent=2) + "\n"


def ca_certificates(config: Config, announce: bool = True) -> list[str]:
    """PEM blocks from caCert and from the host's NODE_EXTRA_CA_CERTS, without duplicates and without
    the public roots the guest trusts already (says so when it leaves any out, if `announce`)."""
    # deferred: start-up (config.cacerts: only rendering a new VM's CA certificates needs it)
    from agentbox.config import cacerts

    sources: list[tuple[Path, str]] = []
    if config.ca_cert is not None:
        sources.append((config.ca_cert, "caCert"))
    extra = os.environ.get("NODE_EXTRA_CA_CERTS")
    if extra:
        sources.append((Path(extra), "NODE_EXTRA_CA_CERTS"))
    certs: list[str] = []
    public: frozenset[str] | None = None
    for path, origin in sources:
        text = pins.read(path, origin).decode("utf-8", errors="replace")
        found = cacerts.pem_blocks(text)
        if not found:
            raise ConfigError(f"{origin}: {path} contains no PEM certificate (-----BEGIN CERTIFICATE-----)")
        public = cacerts.public_roots() if public is None else public
        embedded = cacerts.embedding(path, found, public)
        if announce and (embedded.whole_store or len(embedded.kept) < len(found)):
            note(f"{origin}: {path} {embedded.whole_store + ': ' if embedded.whole_store else 'holds '}"
                 f"{cacerts.embedding_summary(embedded)}")
        certs.extend(cert for cert in embedded.kept if cert not in certs)
    return certs
