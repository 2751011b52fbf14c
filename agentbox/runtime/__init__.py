"""The places that run VMs, behind one contract (agentbox.runtime.contract): this machine and remote hosts.

May import vm, remote, config, agents, net, git and the ground floor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentbox.remote import registry
from agentbox.runtime.local import LocalRuntime
from agentbox.runtime.sshhost import SshRuntime

if TYPE_CHECKING:
    from agentbox.runtime.contract import Runtime

LOCAL = "local"


def place(name: str) -> Runtime:
    """The runtime of `local` or of a host added with `agentbox hosts add` (UnknownHost otherwise)."""
    if name == LOCAL:
        return LocalRuntime()
    return SshRuntime(registry.require(name))
