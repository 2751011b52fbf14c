"""What the VM's network may reach (`network.*`), and how much of that agentbox can enforce.

Three modes. `open`: the internet is open, the host's loopback is closed (unless `allowHost`). `allowlist`:
traffic leaves only through agentbox's host-side proxy (agentbox.net.proxy, run by agentbox.net.guard), which
lets through the launched agents' API endpoints, the presets the user picked and `network.allow`. `offline`:
the same proxy with the agents' API endpoints only (`agentApi: false`: nothing).

Enforcement is said honestly: the proxy decides on the host, but inside the guest what stops a program from going
around it, and what closes the host's loopback, is a firewall (nftables, the ruleset below), which the agent, root
in the VM, can undo (`enforcement()`: `advisory`). With Lima's QEMU driver agentbox holds an allowlist or offline VM
on the host instead (agentbox.net.hold: QEMU's user network restricted to the proxy): `host`. Pure data and text:
the warm launch reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from agentbox import sizes
from agentbox.net import uploads

MODES = ("open", "allowlist", "offline")
INSPECT_CREDENTIALS, INSPECT_ALL = "credentials", "all"
ADVISORY = "advisory"
HOST = "host"

# Lima's user-mode network (pkg/networks/const.go): the host's loopback as the guest sees it, and its DNS.
HOST_ADDRESS = "192.168.5.2"
HOST_ADDRESS6 = "fec0::2"  # QEMU's slirp gives the guest IPv6 too, with the host at ::2 of its prefix
HOST_NAME = "host.lima.internal"
DNS_ADDRESS = "192.168.5.3"
# A held VM's forwards (agentbox.net.hold): QEMU's default guestfwd address in Lima's network, the proxy's port there.
HOLD_ADDRESS = "192.168.5.4"
HOLD_PROXY_PORT = 3128
HOLD_SOCKET = "guest.sock"  # in the VM's network folder: where its proxy process takes held connections
PRIVATE_NETS = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10")
PRIVATE_NETS6 = ("fc00::/7", "fe80::/10")

PRESETS: dict[str, tuple[str, ...]] = {
    "npm": ("registry.npmjs.org", "registry.yarnpkg.com"),
    "pypi": ("pypi.org", "files.pythonhosted.org"),
    "github": ("github.com", "*.github.com", "*.githubusercontent.com", "ghcr.io", "codeload.github.com"),
    "apt": ("deb.debian.org", "security.debian.org", "archive.ubuntu.com", "*.archive.ubuntu.com",
            "security.ubuntu.com", "ports.ubuntu.com"),
    "docker": ("registry-1.docker.io", "auth.docker.io", "index.docker.io", "production.cloudflare.docker.com",
               "download.docker.com"),
}

# network.private's default: workspace files whose content must not be uploaded (agentbox.net.doors)
DEFAULT_PRIVATE = (".env*", "*.pem", "*.key", "id_*", "secrets/**")


class NetworkSettings(NamedTuple):
    mode: str = "open"
    allow_host: bool | tuple[int, ...] = False  # True: every port of the host's loopback
    allow_lan: bool = False
    presets: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    agent_api: bool = True
    upload_limit: int | None = uploads.DEFAULT_LIMIT  # bytes per host and session (agentbox.net.uploads); None: none
    upload_limit_text: str | bool = uploads.DEFAULT_TEXT  # as the config wrote it (false: no cap)
    inspect: str = INSPECT_CREDENTIALS  # network.inspect: which allowed hosts the broker terminates TLS for
    private: tuple[str, ...] = DEFAULT_PRIVATE

    @property
    def proxied(self) -> bool:
        return self.mode != "open"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "allowHost": self.allow_host if isinstance(self.allow_host, bool)
                else list(self.allow_host), "allowLan": self.allow_lan, "presets": list(self.presets),
                "allow": list(self.allow), "agentApi": self.agent_api,
                "uploadLimit": self.upload_limit_text, "inspect": self.inspect, "private": list(self.private)}


def from_data(raw: Mapping[str, Any]) -> NetworkSettings:
    """Settings from a merged `network` mapping (validated by schema.py)."""
    host = raw.get("allowHost", False)
    return NetworkSettings(
        mode=raw.get("mode", "open"),
        allow_host=host if isinstance(host, bool) else tuple(sorted(set(host))),
        allow_lan=raw.get("allowLan", False),
        presets=tuple(dict.fromkeys(raw.get("presets", ()))),
        allow=tuple(dict.fromkeys(raw.get("allow", ()))),
        agent_api=raw.get("agentApi", True),
        upload_limit=upload_limit(raw.get("uploadLimit", uploads.DEFAULT_TEXT)),
        inspect=raw.get("inspect", INSPECT_CREDENTIALS),
        upload_limit_text=False if raw.get("uploadLimit") is False else str(raw.get("uploadLimit",
                                                                                    uploads.DEFAULT_TEXT)),
        private=tuple(dict.fromkeys(raw.get("private", DEFAULT_PRIVATE))),
    )


def upload_limit(value: Any) -> int | None:
    """network.uploadLimit as bytes (validated by schema.py: a size, or false for no cap); None: no cap."""
    if value is False or value is None:
        return None
    return sizes.to_bytes(str(value)) or uploads.DEFAULT_LIMIT


# -- config checks (schema.py calls these for each value) --------------------------------------------------

def check_mode(value: str) -> str | None:
    return None if value in MODES else f"expected open, allowlist or offline, found {value!r}"


def check_inspect(value: str) -> str | None:
    return None if value in (INSPECT_CREDENTIALS, INSPECT_ALL) else f"expected credentials or all, found {value!r}"


def check_preset(value: str) -> str | None:
    if value in PRESETS:
        return None
    return f"unknown preset {value!r}; the presets are {', '.join(PRESETS)} (list other hosts in network.allow)"


def check_host_pattern(value: str) -> str | None:
    # deferred: start-up (net.proxy: only a configured allow pattern is checked; the launch reads the cache)
    from agentbox.net.proxy import check_pattern

    return check_pattern(value)


def check_port(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"expected a port number, found {value!r}"
    return None if 1 <= value <= 65535 else f"port {value} is out of range (1 to 65535)"


# -- the allow list ----------------------------------------------------------------------------------------

def allow_list(settings: NetworkSettings, agent_endpoints: Mapping[str, Iterable[str]]) -> list[tuple[str, str]]:
    """(pattern, where it comes from) for the proxy; agent_endpoints: each launched agent's endpoints."""
    entries: list[tuple[str, str]] = []
    if settings.mode == "open":
        return entries
    if settings.agent_api:
        for name, hosts in agent_endpoints.items():
            entries += [(host, f"agent {name}") for host in hosts]
    if settings.mode == "allowlist":
        for preset in settings.presets:
            entries += [(host, f"preset {preset}") for host in PRESETS.get(preset, ())]
        entries += [(host, "network.allow") for host in settings.allow]
    seen: set[str] = set()
    unique = []
    for host, source in entries:
        if host.lower() not in seen:
            seen.add(host.lower())
            unique.append((host, source))
    return unique


def inspected_hosts(settings: NetworkSettings) -> tuple[str, ...]:
    """The allowed hosts the broker terminates TLS for besides the credential hosts (network.inspect: all, in
    allowlist and offline mode): every listed name on 443. A `*.suffix` pattern, an IP literal and another port are
    tunnelled as before (a leaf is made ahead for a name, never on a request's path)."""
    if settings.inspect != INSPECT_ALL or settings.mode == "open":
        return ()
    names = []
    for pattern, _ in allow_list(settings, {}):
        host, _, port = pattern.lower().partition(":")
        if port in ("", "443") and not host.startswith(("*", "[")) and not host.replace(".", "").isdigit():
            names.append(host.rstrip("."))
    return tuple(dict.fromkeys(names))


# -- trust: a project's file may tighten the policy, never loosen it -----------------------------------------

_RANK = {mode: rank for rank, mode in enumerate(MODES)}


def loosened(global_only: NetworkSettings, effective: NetworkSettings) -> list[str]:
    """How `effective` (global + project file) lets the VM reach more than `global_only` does, each in words."""
    found: list[str] = []
    if _RANK[effective.mode] < _RANK[global_only.mode]:
        found.append(f"network.mode: {effective.mode} (the global config says {global_only.mode})")
    if not _ports_within(effective.allow_host, global_only.allow_host):
        found.append(f"network.allowHost: {_ports_words(effective.allow_host)} (opens the host's localhost to the VM)")
    dropped = [glob for glob in global_only.private if glob not in effective.private]
    if dropped:  # checked in every mode: the broker reads what goes to the credential hosts in open mode too
        found.append(f"network.private: leaves out {', '.join(dropped)} (their content may then be uploaded)")
    if effective.mode == "open" or global_only.mode == "open":
        return found  # open lets everything but the host through: any list is narrower
    if _cap_above(effective.upload_limit, global_only.upload_limit):
        cap = "false" if effective.upload_limit is None else sizes.shown(effective.upload_limit)
        allowed = "no cap" if global_only.upload_limit is None else sizes.shown(global_only.upload_limit)
        found.append(f"network.uploadLimit: {cap} (more than the global config's {allowed} may be uploaded to a "
                     "host)")
    if effective.inspect == INSPECT_CREDENTIALS and global_only.inspect == INSPECT_ALL:
        found.append("network.inspect: credentials (the global config has the broker read what goes to every "
                     "allowed host)")
    if effective.allow_lan and not global_only.allow_lan:
        found.append("network.allowLan: true (opens your local network to the VM)")
    if effective.agent_api and not global_only.agent_api:
        found.append("network.agentApi: true (the global config keeps the agents' APIs closed)")
    if effective.mode == "allowlist":
        before = {host.lower() for host, _ in allow_list(global_only._replace(mode="allowlist"), {})}
        added = [host for host, _ in allow_list(effective, {}) if host.lower() not in before]
        if global_only.mode == "offline" or added:
            shown = ", ".join(added) if added else "the global config's list"
            found.append(f"network.allow/presets: {shown} (more hosts the VM may reach)")
    return found


def _cap_above(cap: int | None, allowed: int | None) -> bool:
    return allowed is not None and (cap is None or cap > allowed)


def _ports_within(ports: bool | tuple[int, ...], allowed: bool | tuple[int, ...]) -> bool:
    if allowed is True or ports is False or ports == ():
        return True
    if ports is True:
        return False
    return set(ports) <= set(allowed or ())


def _ports_words(ports: bool | tuple[int, ...]) -> str:
    if isinstance(ports, bool):
        return "true" if ports else "false"
    return "[" + ", ".join(str(port) for port in ports) + "]"


# -- what is enforced --------------------------------------------------------------------------------------

def enforcement(settings: NetworkSettings) -> tuple[str, str]:
    """(`advisory`, why) for a VM the host does not hold (agentbox.net.hold.enforcement says which are)."""
    if settings.mode == "open":
        return ADVISORY, ("the host's localhost is closed by a firewall inside the VM, which the agent (root "
                          "there) can undo; the internet is open")
    return ADVISORY, ("the host-side proxy decides what it forwards, but the VM is kept from going around it "
                      "only by a firewall inside the VM, which the agent (root there) can undo")


def ruleset(settings: NetworkSettings, proxy_port: int | None, held: tuple[int, ...] | None = None) -> str:
    """The guest's nftables ruleset (`nft -f`): replaces agentbox's own table, touches no other. `held`: the VM's
    network is held on the host (agentbox.net.hold), with these allowHost ports forwarded: the host's proxy port and
    those ports are sent to the hold's forwards, so the guest's addresses stay the same."""
    host_ports: list[int] = [] if settings.allow_host is True else list(settings.allow_host or ())
    if proxy_port is not None:
        host_ports.append(proxy_port)
    lines = [
        "# agentbox-managed: network." + f"mode {settings.mode}" + (" (held)" if held is not None else ""),
        "table inet agentbox",
        "delete table inet agentbox",
        "table inet agentbox {",
    ]
    forwards: list[tuple[int, int]] = []
    if held is not None:
        forwards = ([(proxy_port, HOLD_PROXY_PORT)] if proxy_port is not None else []) + [
            (port, port) for port in held if port != HOLD_PROXY_PORT]
        lines += ["  chain held {", "    type nat hook output priority -100; policy accept;"]
        lines += [f"    ip daddr {HOST_ADDRESS} tcp dport {port} dnat ip to {HOLD_ADDRESS}:{to}"
                  for port, to in forwards]
        lines += ["  }"]
    lines += [
        "  chain output {",
        "    type filter hook output priority 0; policy accept;",
        '    oif "lo" accept',
        "    ct state established,related accept",
        # Neighbour discovery is not tracked by conntrack: without this the guest cannot find the host's
        # IPv6 address (fec0::2) in allowlist/offline, and its answers to the host's probes are refused.
        "    icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept",
        # The DHCP server is the host address: a lease renewal is a unicast from a UDP socket.
        f"    ip daddr {HOST_ADDRESS} udp sport 68 udp dport 67 accept",
    ]
    if held is not None and forwards:
        ports = ", ".join(str(to) for to in sorted({to for _, to in forwards}))
        lines.append(f"    ip daddr {HOLD_ADDRESS} tcp dport {{ {ports} }} accept")
    if settings.allow_host is True:
        lines += [f"    ip daddr {HOST_ADDRESS} accept", f"    ip6 daddr {HOST_ADDRESS6} accept"]
    else:
        if host_ports:
            ports = ", ".join(str(port) for port in sorted(set(host_ports)))
            lines += [f"    ip daddr {HOST_ADDRESS} tcp dport {{ {ports} }} accept",
                      f"    ip6 daddr {HOST_ADDRESS6} tcp dport {{ {ports} }} accept"]
        lines += [f"    ip daddr {HOST_ADDRESS} reject with icmpx type admin-prohibited",
                  f"    ip6 daddr {HOST_ADDRESS6} reject with icmpx type admin-prohibited"]
    if settings.mode != "open":
        lines += [f"    ip daddr {DNS_ADDRESS} meta l4proto {{ tcp, udp }} th dport 53 accept"]
        if settings.allow_lan:
            lines += ["    ip daddr { " + ", ".join(PRIVATE_NETS) + " } accept",
                      "    ip6 daddr { " + ", ".join(PRIVATE_NETS6) + " } accept"]
        lines += ["    meta l4proto tcp reject with tcp reset", "    reject with icmpx type admin-prohibited"]
    lines += ["  }", "}", ""]
    return "\n".join(lines)


# The user name in the VM's proxy URL; the password is the VM's proxy secret (agentbox.net.guard.secret), which the
# proxy asks of every connection (Proxy-Authorization: Basic): only this VM has it.
PROXY_USER = "agentbox"
MASKED = "***"


class ProxyAccess(NamedTuple):
    """How the VM reaches its proxy: the port (on the host, or a remote host's forward of it) and the VM's secret."""

    port: int
    secret: str

    @property
    def url(self) -> str:
        return f"http://{PROXY_USER}:{self.secret}@{HOST_NAME}:{self.port}"

    def env(self) -> dict[str, str]:
        """The guest's proxy variables, both spellings (tools read one or the other), with the VM's credentials."""
        no_proxy = "localhost,127.0.0.1,::1"
        return {"HTTP_PROXY": self.url, "HTTPS_PROXY": self.url, "http_proxy": self.url, "https_proxy": self.url,
                "NO_PROXY": no_proxy, "no_proxy": no_proxy}


def proxy_env(port: int, secret: str) -> dict[str, str]:
    """The guest's proxy variables for the proxy at `port` with the VM's `secret`."""
    return ProxyAccess(port, secret).env()


def shown_url(port: int) -> str:
    """The VM's proxy URL as agentbox shows it on the host: the secret masked (it is the VM's own)."""
    return ProxyAccess(port, MASKED).url
