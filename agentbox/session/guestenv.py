"""The environment a session gets in the VM: agentbox's additions, the config's env, the proxy's variables."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from agentbox.credentials import loginfiles
from agentbox.net import policy
from agentbox.progress import note
from agentbox.staginglayout import GUEST_CA_BUNDLE

if TYPE_CHECKING:
    from agentbox.config.load import Config


def of(config: Config, proxy: policy.ProxyAccess | None = None,
       brokered: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the session gets: agentbox's additions, then the config's env over them; in allowlist and
    offline mode (or with the credential broker) the proxy's variables over both, with the VM's proxy credentials
    (said when the config's env had its own). `brokered`: the broker's placeholders for API keys, over the config's
    real values."""
    added = _added_env(config)
    if brokered is not None:
        added.pop("GH_TOKEN", None)  # the Keychain's real token: the broker's placeholder stands for it
    env = {**added, **config.env, **(brokered or {})}
    if proxy is None:
        return env
    variables = proxy.env()
    replaced = sorted(key for key in variables if key in config.env)
    if replaced:
        note(f"network.mode {config.network.mode}: the session's {', '.join(replaced)} point to agentbox's proxy, "
             "which goes on through the proxy in env")
    return {**env, **variables}


def _added_env(config: Config) -> dict[str, str]:
    """Variables agentbox sets for the session; the config's env overrides each of them."""
    added: dict[str, str] = {}
    settings = config.credentials
    if settings.enabled and settings.gh and "GH_TOKEN" not in config.env:
        token = loginfiles.gh_token_from_keychain()
        if token:
            added["GH_TOKEN"] = token
    if (
        config.ca_cert is not None or os.environ.get("NODE_EXTRA_CA_CERTS")
    ) and "NODE_EXTRA_CA_CERTS" not in config.env:
        added["NODE_EXTRA_CA_CERTS"] = GUEST_CA_BUNDLE
    return added
