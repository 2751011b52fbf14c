"""How agentbox's own proxy reaches the internet: through the company's proxy when one is configured, trusting the
user's CA certificates as well as the system's.

Which proxy: the config's `env` HTTPS_PROXY / https_proxy (CONNECT tunnels, brokered hosts, the broker's OAuth
refreshes), HTTP_PROXY / http_proxy (plain-HTTP requests), ALL_PROXY / all_proxy (either, when the specific one is
unset), NO_PROXY / no_proxy (hosts reached directly). When the config's env sets none of these, the same variables
of agentbox's own environment (the host's shell) are used instead: the proxy the host's own tools go through. Only
`http://` proxies are supported (`user:password@` in the URL becomes Basic Proxy-Authorization).
`host.lima.internal` in a proxy URL (written for the VM) is the host's loopback here.

The launch writes what it found to the VM's network folder (`upstream.json`, 0600: a proxy password may be in it);
the proxy process reads it there (never from its command line) and again whenever it changes. Log lines and error
messages name the proxy as host:port only.
"""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:  # a launch imports this module to write the settings; only the proxy process connects
    import asyncio
    import ipaddress

FILE = "upstream.json"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
                   "NO_PROXY", "no_proxy")
MAX_REPLY_HEAD = 16 * 1024
GUEST_HOST_NAME = "host.lima.internal"  # the VM's name for the host; on the host, its loopback


class ProxyURL(NamedTuple):
    host: str
    port: int
    user: str | None = None
    password: str | None = None

    @property
    def where(self) -> str:
        """host:port, for messages (never the credentials)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def authorization(self) -> str | None:
        if self.user is None:
            return None
        pair = f"{self.user}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def parse_url(text: str) -> ProxyURL:
    """A proxy URL (`http://[user:password@]host[:port]`, the scheme optional) or a ValueError saying what is wrong
    (without the password)."""
    value = text.strip()
    if "://" not in value:
        value = "http://" + value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError("is not a proxy URL (http://host:port)") from None
    if parts.scheme.lower() != "http":
        raise ValueError(f"uses `{parts.scheme}://`; agentbox's proxy goes on only through an http:// proxy")
    host = parts.hostname
    if not host:
        raise ValueError("has no host name")
    if host == GUEST_HOST_NAME:
        host = "127.0.0.1"
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return ProxyURL(host, port or 80, user, password)


def _no_proxy_entries(text: str) -> tuple[str, ...]:
    return tuple(entry.strip().lower() for entry in text.split(",") if entry.strip())


class Route(NamedTuple):
    """The company proxy per kind of request, the hosts reached without it, the CA certificates to trust too."""

    https: ProxyURL | None = None
    http: ProxyURL | None = None
    no_proxy: tuple[str, ...] = ()
    ca_pems: tuple[str, ...] = ()  # read by the launch, as pinned (the proxy process opens no file of the config)

    def via(self, host: str, port: int, tls: bool) -> ProxyURL | None:
        """The proxy a connection to host:port goes through (`tls`: a CONNECT), None: directly."""
        proxy = self.https if tls else self.http
        if proxy is None or self.bypassed(host, port):
            return None
        return proxy

    def bypassed(self, host: str, port: int) -> bool:
        """NO_PROXY as curl reads it: `*`, a name (its subdomains too, a leading `.` allowed), an IP or CIDR,
        each optionally with `:port`."""
        name = host.lower().rstrip(".")
        address = _address(name)
        for entry in self.no_proxy:
            if entry == "*":
                return True
            pattern, wanted_port = entry, None
            if entry.count(":") == 1 and entry.rsplit(":", 1)[1].isdigit():
                pattern, text = entry.rsplit(":", 1)
                wanted_port = int(text)
            if wanted_port is not None and wanted_port != port:
                continue
            pattern = pattern.strip("[]")
            if address is not None:

                try:
                    if address in ipaddress.ip_network(pattern, strict=False):
                        return True
                except ValueError:
                    pass
                continue
            pattern = pattern.lstrip("*").lstrip(".").rstrip(".")
            if pattern and (name == pattern or name.endswith("." + pattern)):
                return True
        return False


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def chosen(config_env: Mapping[str, str], host_env: Mapping[str, str]) -> dict[str, str]:
    """The proxy variables agentbox's proxy goes by: the config env's when it sets any, else the host's."""
    source = config_env if any(config_env.get(name) for name in PROXY_VARIABLES) else host_env
    return {name: source[name] for name in PROXY_VARIABLES if source.get(name)}


def settings(config_env: Mapping[str, str], host_env: Mapping[str, str],
             ca_pems: tuple[str, ...]) -> tuple[dict[str, Any] | None, list[str]]:
    """What the launch writes for the proxy process (None: nothing to write) and problems to tell the user (a
    proxy URL agentbox cannot use; that kind of request then goes directly)."""
    variables = chosen(config_env, host_env)
    problems = []
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        if name in variables:
            try:
                parse_url(variables[name])
            except ValueError as error:
                problems.append(f"{name} {error}: agentbox's proxy does not use it")
                del variables[name]
    if not variables and not ca_pems:
        return None, problems
    return {"variables": variables, "caPems": list(ca_pems)}, problems


def route_of(data: Any) -> Route | None:
    """The Route from the launch's file (see `settings`); None when there is nothing in it."""
    if not isinstance(data, dict):
        return None
    found = data.get("variables")
    variables: dict[str, Any] = found if isinstance(found, dict) else {}
    ca_pems = tuple(pem for pem in data.get("caPems") or () if isinstance(pem, str))

    def first(*names: str) -> ProxyURL | None:
        for name in names:
            value = variables.get(name)
            if isinstance(value, str) and value:
                try:
                    return parse_url(value)
                except ValueError:
                    continue
        return None

    no_proxy = variables.get("NO_PROXY") or variables.get("no_proxy") or ""
    route = Route(https=first("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"),
                  http=first("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"),
                  no_proxy=_no_proxy_entries(no_proxy if isinstance(no_proxy, str) else ""), ca_pems=ca_pems)
    return route if route.https or route.http or route.ca_pems else None


class ProxyRefused(Exception):
    """The company proxy could not be reached or did not open the tunnel (the message names it as host:port)."""


def authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def open_tunnel(proxy: ProxyURL, host: str, port: int,
                      timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to host:port through the company proxy's CONNECT (its answer must be 2xx)."""
    # deferred: start-up (asyncio, ~43 ms: only the proxy process opens connections)
    import asyncio

    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(proxy.host, proxy.port, limit=64 * 1024),
                                                timeout)
    except (OSError, asyncio.TimeoutError) as error:
        raise ProxyRefused(f"cannot connect to the company proxy {proxy.where}: {str(error) or 'timed out'}") from None
    target = authority(host, port)
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    credentials = proxy.authorization()
    if credentials:
        head += f"Proxy-Authorization: {credentials}\r\n"
    try:
        writer.write((head + "\r\n").encode("latin-1"))
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
        writer.close()
        raise ProxyRefused(f"the company proxy {proxy.where} did not answer the CONNECT to {target}: "
                           f"{type(error).__name__}") from None
    status_line = answer.split(b"\r\n", 1)[0].decode("latin-1", errors="replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit() or not 200 <= int(parts[1]) < 300:
        writer.close()
        raise ProxyRefused(f"the company proxy {proxy.where} refused the CONNECT to {target}: "
                           f"{status_line[:120]!r}")
    return reader, writer


async def open_plain(proxy: ProxyURL, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the company proxy for one plain-HTTP request in absolute form."""
    # deferred: start-up (asyncio, ~43 ms: only the proxy process opens connections)
    import asyncio

    try:
        return await asyncio.wait_for(asyncio.open_connection(proxy.host, proxy.port, limit=64 * 1024), timeout)
    except (OSError, asyncio.TimeoutError) as error:
        raise ProxyRefused(f"cannot connect to the company proxy {proxy.where}: {str(error) or 'timed out'}") from None


def trust(route: Route | None) -> Any:
    """The system's trust store plus the route's CA certificates: how the broker checks the real hosts (a company proxy
    that intercepts TLS presents its own CA's certificates; on macOS Python does not see the Keychain's)."""
    # deferred: start-up (ssl, ~10 ms: only the proxy process opens connections)
    import ssl

    context = ssl.create_default_context()
    pems = "\n".join(route.ca_pems) if route is not None else ""
    if pems:
        try:
            context.load_verify_locations(cadata=pems)
        except (ssl.SSLError, ValueError):
            pass
    return context
