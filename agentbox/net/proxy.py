"""The host-side egress proxy for `network.mode: allowlist | offline` (HTTP CONNECT and plain HTTP).

The VM's HTTP(S)_PROXY points here; the proxy decides, per request, whether traffic may leave.

Who may use it: the VM whose proxy it is. With a secret (`start(..., secret=...)`, which agentbox.net.guard always
passes: the VM's), every CONNECT and every plain-HTTP request must carry `Proxy-Authorization: Basic
base64(agentbox:SECRET)` (the credentials in the VM's proxy URL), checked first, before any policy decision, lookup
or connection, by digest in constant time. Missing or wrong: 407 with `Proxy-Authenticate: Basic realm="agentbox"`
(clients that try without credentials first, libcurl's anyauth, then send them), a JSON body, `Connection: close`,
and a log line (deny) saying what was wrong, never what was offered. The header is never forwarded.

Policy (a `Policy` object, built from `network.allow`-style patterns):
- A pattern is `host`, `*.suffix` (subdomains of suffix only, not suffix itself), an IP literal
  (`203.0.113.7`, `[2001:db8::1]`), each optionally with `:port`. `check_pattern` says what is wrong
  with a bad one; the config layer reports that error with the key.
- Ports: a pattern without a port allows 443 for CONNECT and 80 for plain HTTP; any other port must be
  listed as `host:port`.
- IP-literal destinations are refused unless that literal is listed (a listed name must not be
  sidestepped by connecting to its address); a listed literal is connected to as written.
- The proxy resolves names itself (getaddrinfo in a worker thread, or the policy's `resolver` hook) and
  refuses when ANY address is loopback, unspecified or multicast, or (unless `allow_lan` is set) private
  (RFC 1918, IPv6 ULA), link-local (cloud metadata 169.254.169.254 included) or CGNAT (100.64/10): a public
  name must not rebind to the host or the LAN (the host's own services are `network.allowHost`'s, never
  the proxy's). It then connects to an address it checked,
  never to a second lookup.
- Refusals are HTTP 403 with a JSON body `{"blocked", "port", "reason", "allow"}` where `allow` is the
  command that would allow the host (for a name resolving to a private address: `network.allowLan`).
  A request head over 64 KB gets 431, a malformed one 400, and both close the connection.
- Plain HTTP is one request per connection (forwarded with `Connection: close`, the Host header set to
  the URL's authority, then its body as its framing says and nothing after it: a second request on the
  connection is never read); hop-by-hop proxy headers are dropped. A body framing a server could read
  otherwise (Transfer-Encoding other than chunked, or with Content-Length; several lengths) gets 400.
- At most `max_connections` requests are served at once; as many again may wait `queue_timeout`
  seconds for a slot, the rest get 503 at once. A tunnel silent in both directions for `idle_timeout`
  seconds is closed.
- Every decision is one JSON line (time, client, method, host, port, decision: allow | deny (403, 407) |
  error (400, 431, 502, 503), reason, bytes_up, bytes_down) appended to the log file (O_APPEND,
  mode 0600), written when the request ends.

Leaks at the door (agentbox.net.doors, from the files beside the log): a canary secret in a request's line or headers
(a CONNECT's authority too) or body, or a private file's chunk in a plain-HTTP body, is refused (403 JSON, decision
`leak` with `what`); a body is checked piece by piece before each piece is forwarded.

What it cannot do: see inside TLS (a tunnel to an allowed name may carry anything, domain fronting
included) or stop a program that ignores the proxy variables; that is the guest firewall's job.

`start(policy, log_path, port=0, secret=None)` runs the proxy on 127.0.0.1 in a thread for synchronous callers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import re
import socket
import ssl
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from agentbox import lazyre
from agentbox.net import doors, httpwire, intercept, placement, scan, uploads
from agentbox.net.broker import Brokering
from agentbox.net.upstream import ProxyRefused, ProxyURL, Route, open_plain, open_tunnel, trust

MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024
UPSTREAM_BUFFER = 512 * 1024  # what a connection to a host buffers: bodies come in larger pieces
CONNECT_PORT = 443
HEAD_TIMEOUT = 10.0  # seconds a new connection has to send its request head
HANDED_TIMEOUT = 1.0  # seconds agentbox.net.holdconnector has to hand a held connection over
UNIX_PATH_MAX = 100  # a longer socket path is bound through its folder (sockaddr_un holds 104 to 108 bytes)
HTTP_PORT = 80

Resolver = Callable[[str, int], Sequence[str]]

_LABEL = lazyre.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_BLOCKED_NETS = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
        "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
    )
]


_RESERVED = ipaddress.ip_network("0.0.0.0/8")


def _is_name(host: str) -> bool:
    labels = host.split(".")
    return len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _split_host_port(text: str) -> tuple[str, int | None] | str:
    """`host`, `host:port`, `[v6]`, `[v6]:port` → (host, port) or an error message."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return "has `[` without a closing `]`"
        host, rest = text[1:end], text[end + 1:]
        if _ip(host) is None or ":" not in host:
            return f"`[{host}]` is not an IPv6 address"
        if not rest:
            return host, None
        if not rest.startswith(":"):
            return f"has `{rest}` after the `]`"
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        return "looks like an IPv6 address; write it in brackets, e.g. `[2001:db8::1]:443`"
    else:
        return text, None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        return f"has port `{port_text}`; a port is a number from 1 to 65535"
    return host, int(port_text)


# Tests only: "name=address,..." the proxy process resolves itself, loopback allowed (the test's servers listen on
# 127.0.0.1); the host's environment is the user's, never the VM's.
TEST_RESOLVE = "AGENTBOX_TEST_PROXY_RESOLVE"
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
_NUMERIC = lazyre.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}")
_TEST_NET = ipaddress.ip_address("192.0.2.1")  # TEST-NET-1: never an address of this host


def _plain(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4 address written as IPv6 (::ffff:a.b.c.d, ::a.b.c.d) as the IPv4 address it reaches."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if int(ip) >> 32 == 0 and int(ip) > 1:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def _numeric_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address of a numeric name in the forms inet_aton (and so getaddrinfo) takes: 127.1, 2130706433,
    0x7f000001, 0177.0.0.1."""
    if not _NUMERIC.fullmatch(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def _local_problem(host: str) -> str | None:
    """Why a pattern's host is the host itself (its loopback, or every address of it), or None."""
    name = host.lower().rstrip(".")
    name = name[2:] if name.startswith("*.") else name
    ip = _ip(name) or _numeric_ipv4(name)
    if ip is not None:
        ip = _plain(ip)
        if ip.is_loopback:
            return f"is the host's own loopback ({ip})"
        if ip.is_unspecified or ip in _RESERVED:
            return f"is the host itself ({ip} reaches the host's own services)"
        return None
    if name in LOCAL_NAMES or name.endswith(".localhost"):
        return "names the host's own loopback"
    return None


def is_loopback_name(host: str) -> bool:
    """Whether `host` (an address in any spelling, or a name such as `localhost`) is the loopback of wherever it is
    used."""
    name = host.lower().rstrip(".")
    ip = _ip(name) or _numeric_ipv4(name)
    if ip is not None:
        return _plain(ip).is_loopback
    return name in LOCAL_NAMES or name.endswith(".localhost")


def allow_host_hint(port: Any) -> str:
    """What opens the host's own service at `port` to the VM (never the proxy: it does not connect to the host)."""
    known = port if isinstance(port, int) and port > 0 else None
    return (f"network.allowHost: [{known or 'PORT'}] in agentbox.yml, then host.lima.internal:{known or 'PORT'} in "
            "the VM (the proxy never connects to the host itself)")


def local_hint(pattern: str) -> str:
    """Where the host's own services are opened instead, with the pattern's port when it has one."""
    split = _split_host_port(pattern)
    port = split[1] if not isinstance(split, str) and split[1] is not None else None
    ports = f"[{port}]" if port else "[PORT]"
    return (f"The proxy never connects to the host itself; the host's own services are network.allowHost's: "
            f"`network.allowHost: {ports}` in agentbox.yml, then host.lima.internal:{port or 'PORT'} in the VM.")


def own_address_problem(pattern: str) -> str | None:
    """Why an IP-literal pattern is one of the host's own interface addresses (its LAN or public address), or None."""
    split = _split_host_port(pattern)
    ip = None if isinstance(split, str) else _ip(split[0])
    if ip is None or not Policy().host_own(str(ip)):
        return None
    return f"`{pattern}` is an address of this host ({_plain(ip)}); the proxy never connects to the host itself"


def check_pattern(text: Any) -> str | None:
    """Why `text` is not a valid allow pattern (`host`, `*.suffix`, IP literal, each with optional `:port`), or None.
    A pattern naming the host itself (loopback, `localhost`, 0.0.0.0, in any spelling) is refused: see local_hint."""
    problem = _syntax_problem(text)
    if not isinstance(text, str) or not text or any(ch.isspace() or ch in "/@" for ch in text):
        return problem
    split = _split_host_port(text)
    local = None if isinstance(split, str) else _local_problem(split[0])
    if local is None:
        return problem
    return f"`{text}` {local}; the proxy never connects to the host itself (its own services are network.allowHost's)"


def _syntax_problem(text: Any) -> str | None:
    if not isinstance(text, str) or not text:
        return "is empty; write a host name such as `api.example.com` or `*.example.com`"
    if any(ch.isspace() for ch in text):
        return f"`{text}` contains a space; write one host per entry"
    if "://" in text or "/" in text or "@" in text:
        return f"`{text}` is a URL; write only the host (and `:port`), e.g. `example.com`"
    split = _split_host_port(text)
    if isinstance(split, str):
        return f"`{text}` {split}"
    host = split[0].lower()
    if _ip(host) is not None:
        return None
    if host.startswith("*."):
        if not host[2:]:
            return f"`{text}` has nothing after `*.`; write e.g. `*.example.com`"
        if not _is_name(host[2:]):
            return f"`{text}` is not a valid wildcard; only a leading `*.` before a domain is allowed"
        return None
    if host == "*":
        return "`*` would allow every host; use `network.mode: open` instead"
    if "*" in host:
        return f"`{text}`: `*` is only allowed as a leading `*.`, e.g. `*.example.com`"
    if not _is_name(host):
        return f"`{text}` is not a valid host name"
    return None


@dataclass(frozen=True)
class _Rule:
    host: str  # a name, an IP literal, or ".suffix" for `*.suffix`
    port: int | None

    def matches(self, host: str, port: int, default_port: int) -> bool:
        if port != (default_port if self.port is None else self.port):
            return False
        if self.host.startswith("."):
            return host.endswith(self.host)
        return host == self.host


_SYSTEM_TLS: dict[tuple[str, ...], ssl.SSLContext] = {}


def _system_tls(route: Route | None = None) -> ssl.SSLContext:
    """The host's trust store, as any client uses it, plus the user's CA certificates (caCert, the host's
    NODE_EXTRA_CA_CERTS: a company proxy intercepting TLS signs with its own CA); made once per set of them."""
    key = route.ca_pems if route is not None else ()
    if key not in _SYSTEM_TLS:
        _SYSTEM_TLS[key] = trust(route)
    return _SYSTEM_TLS[key]


def _default_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass
class Policy:
    """What the proxy lets through; `allow` holds patterns as accepted by `check_pattern`."""

    allow: Sequence[str] = ()
    allow_lan: bool = False
    allow_loopback: bool = False  # tests and benchmarks only: their servers listen on loopback
    # network.mode open with the credential broker: every host and port, the LAN too (the VM reaches it anyway),
    # never the host's own loopback (closed to the VM in every mode), by name or by address.
    open: bool = False
    resolver: Resolver | None = None
    # the company proxy the connections go on through, and the CA files trusted besides the system's
    # (agentbox.net.upstream); None: directly, the system's store only
    upstream: Route | None = None
    max_connections: int = 256
    queue_timeout: float = 10.0
    idle_timeout: float = 300.0
    connect_timeout: float = 10.0
    # network.uploadLimit: bytes per host in the upload window `upload_window` (agentbox.net.uploads); None: no cap
    upload_limit: int | None = None
    upload_window: str = ""
    rules: list[_Rule] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rules = []
        for pattern in self.allow:
            problem = _syntax_problem(pattern)  # a local pattern is refused at connect time (its address)
            if problem:
                raise ValueError(f"network.allow: {problem}")
            split = _split_host_port(pattern)
            assert not isinstance(split, str)
            host, port = split[0].lower(), split[1]
            self.rules.append(_Rule(host[1:] if host.startswith("*.") else host, port))

    def permits(self, host: str, port: int, default_port: int) -> str | None:
        """None when host:port is listed, else the reason it is not."""
        if self.open:
            return None
        if any(rule.matches(host, port, default_port) for rule in self.rules):
            return None
        if _ip(host) is not None:
            return "IP address not in the allow list"
        if any(rule.matches(host, rule.port or default_port, default_port) for rule in self.rules):
            return f"port {port} not allowed for this host"
        return "host not in the allow list"

    def blocked_address(self, address: str) -> bool:
        """Whether a name may not lead to `address`: loopback, unspecified and multicast always (the host's own
        services are `network.allowHost`'s), private ranges unless allow_lan."""
        ip = _ip(address.split("%")[0])
        if ip is None:
            return True
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip in _RESERVED:
            return not (self.allow_loopback and ip.is_loopback)
        lan = self.allow_lan or self.open
        return not lan and any(ip in net for net in _BLOCKED_NETS if net.version == ip.version)


    def host_own(self, address: str) -> bool:
        """Whether `address` is the host itself: loopback (unless allow_loopback), unspecified, 0.0.0.0/8, or an
        address of one of the host's interfaces, whatever the pattern that led to it."""
        ip = _ip(address.split("%")[0])
        if ip is None:
            return True
        ip = _plain(ip)
        if ip.is_loopback:
            return not self.allow_loopback
        if ip.is_unspecified or ip in _RESERVED:
            return True
        if ip.is_multicast or (isinstance(ip, ipaddress.IPv6Address) and ip.is_link_local):
            return False
        return _bound_here(ip)

    @staticmethod
    def loopback(address: str) -> bool:
        ip = _ip(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return ip is not None and (ip.is_loopback or ip.is_unspecified)


def _bindable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


_PROBE: list[bool] = []  # whether binding tells the host's own addresses (not with net.ipv4.ip_nonlocal_bind)


def _bound_here(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether one of the host's interfaces has `ip`: a socket binds only to those (a syscall, no new dependency,
    current whenever the interfaces change). Where any address binds, the host name's addresses stand in."""
    if not _PROBE:
        _PROBE.append(not _bindable(_TEST_NET))
    if _PROBE[0]:
        return _bindable(ip)
    try:
        names = {str(_plain(ipaddress.ip_address(str(info[4][0]).split("%")[0])))
                 for info in socket.getaddrinfo(socket.gethostname(), None)}
    except (OSError, ValueError):
        return False
    return str(ip) in names


class _Refused(Exception):
    def __init__(self, status: int, reason: str, decision: str | None = None,
                 detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.decision = decision  # the log's decision when not deny/error (uploads.DECISION)
        self.detail = detail or {}  # more of the JSON body


class _Leak(_Refused):
    """A request that carried a canary or a private file's content (agentbox.net.doors): logged as a leak."""

    def __init__(self, hit: doors.Hit, host: str) -> None:
        refused = doors.LeakRefused(hit, host)
        super().__init__(403, refused.reason)
        self.refused = refused


_STATUS_TEXT = {400: "Bad Request", 403: "Forbidden", 407: "Proxy Authentication Required",
                413: "Content Too Large", 431: "Request Header Fields Too Large",
                502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


class _Log:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        self.path = path
        self.fd = os.open(path, flags, 0o600)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise OSError(f"{path} is not a regular file")
        os.set_blocking(self.fd, True)
        os.fchmod(self.fd, 0o600)
        self.folder = path.parent  # the VM's network folder: what the doors read (agentbox.net.doors)

    def write(self, entry: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


PROXY_USER = "agentbox"  # the user name of the proxy credentials (agentbox.net.policy.ProxyAccess)
REALM = "agentbox"


def _credentials_digest(token: str) -> bytes:
    """What a Basic token is compared by: its digest, so the comparison takes the same time whatever its length."""
    return hashlib.sha256(token.encode("latin-1", "replace")).digest()


def _expected(secret: str | None) -> bytes | None:
    if secret is None:
        return None
    return _credentials_digest(base64.b64encode(f"{PROXY_USER}:{secret}".encode()).decode("ascii"))


class _Proxy:
    def __init__(self, policy: Policy, log: _Log, broker: Brokering | None = None, secret: str | None = None) -> None:
        self.policy = policy
        self.log = log
        self.credentials = _expected(secret)  # None: every client is served (tests and benchmarks only)
        self.broker: Brokering | None = None
        self.pool = intercept.Pool()
        self.uploads = uploads.Counter(policy.upload_limit, policy.upload_window, log.path.parent / uploads.CAPS_FILE)
        self.set_broker(broker)
        self.doors = doors.Watch(log.folder)
        self.slots = asyncio.Semaphore(policy.max_connections)
        self.waiting = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str = "") -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        peer = writer.get_extra_info("peername") or ("?", 0)
        entry: dict[str, Any] = {"client": client or f"{peer[0]}:{peer[1]}", "method": None, "host": None, "port": None,
                                 "decision": "deny", "reason": "", "bytes_up": 0, "bytes_down": 0}
        try:
            # Who may use the proxy is decided before the connection takes a slot: a client without the VM's
            # credentials (another user of the machine) cannot hold the VM's slots, and one that sends no head
            # within HEAD_TIMEOUT is dropped.
            head = await self.read_head(reader, min(HEAD_TIMEOUT, self.policy.idle_timeout))
            entry["method"] = head[0]
            self.authenticate(head[2])
            if self.waiting >= self.policy.max_connections and self.slots.locked():
                raise _Refused(503, "too many connections")
            self.waiting += 1
            try:
                await asyncio.wait_for(self.slots.acquire(), self.policy.queue_timeout)
            except asyncio.TimeoutError:
                raise _Refused(503, "too many connections") from None
            finally:
                self.waiting -= 1
            try:
                await self.serve(head, reader, writer, entry)
            finally:
                self.slots.release()
        except _Refused as refused:
            entry["reason"] = refused.reason
            entry["decision"] = refused.decision or ("deny" if refused.status in (403, 407) else "error")
            if isinstance(refused, _Leak):
                doors.mark(entry, refused.refused)
            await self.refuse(writer, refused, entry)
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as error:
            entry["reason"] = entry["reason"] or type(error).__name__
        except asyncio.CancelledError:
            entry["reason"] = entry["reason"] or "proxy stopped"
        finally:
            writer.close()
            entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            with contextlib.suppress(OSError):
                self.logged(entry)
            self.tasks.discard(task)

    def use_policy(self, policy: Policy) -> None:
        self.policy = policy
        self.uploads.configure(policy.upload_limit, policy.upload_window)

    def capped(self, host: str, with_body: bool) -> _Refused:
        """The refusal of a request to `host` past its upload cap: 413 for one with a body, else 403."""
        reason, detail = self.uploads.refusal(host)
        return _Refused(413 if with_body else 403, reason, uploads.DECISION, detail)

    def count_up(self, host: str, count: int, with_body: bool = True) -> None:
        if not self.uploads.add(host, count):
            raise self.capped(host, with_body)

    def logged(self, entry: dict[str, Any]) -> None:
        """One log line, with the upload window it was counted in (agentbox.net.uploads: `net log --hosts`)."""
        if self.uploads.window:
            entry["window"] = self.uploads.window
        self.log.write(entry)

    def set_broker(self, broker: Brokering | None) -> None:
        self.pool.close()  # connections made for the previous broker (its upstream, its trust) are not reused
        if broker is not None:
            for host, context in broker.leaves.items():
                context.sni_callback = intercept.sni_guard(host)
        self.broker = broker

    async def refuse(self, writer: asyncio.StreamWriter, refused: _Refused, entry: dict[str, Any]) -> None:
        body: dict[str, Any] = {"blocked": entry["host"], "port": entry["port"], "reason": refused.reason}
        if refused.status == 403 and (refused.reason.startswith(
                ("resolves to a loopback", "is a loopback", "resolves to the host's own", "is the host's own"))
                or _local_problem(str(entry["host"])) is not None):  # `net allow` refuses these: allowHost opens them
            body["allow"] = allow_host_hint(entry["port"])
        elif refused.decision == uploads.DECISION:
            body["by"] = "agentbox proxy"
            body.update(refused.detail)
        elif refused.status == 403 and refused.reason.startswith("resolves to"):
            body["allow"] = "network.allowLan: true (in agentbox.yml)"
        elif isinstance(refused, _Leak):
            body["by"] = "agentbox proxy"
        elif refused.status == 403 and refused.reason.startswith("attempted leak"):
            body["by"] = "agentbox credential broker"
        elif refused.status == 407:
            body["by"] = "agentbox proxy"
            body["use"] = ("the proxy URL in the session's HTTPS_PROXY / HTTP_PROXY as it is: it carries this VM's "
                           "proxy credentials")
        elif refused.status == 403:
            host = f"[{entry['host']}]" if ":" in entry["host"] else entry["host"]
            body["allow"] = f"agentbox net allow {host}" + (
                "" if entry["port"] in (CONNECT_PORT, HTTP_PORT) else f":{entry['port']}")
        data = json.dumps(body).encode() + b"\n"
        challenge = f'Proxy-Authenticate: Basic realm="{REALM}"\r\n' if refused.status == 407 else ""
        head = (f"HTTP/1.1 {refused.status} {_STATUS_TEXT[refused.status]}\r\n{challenge}"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
                ).encode()
        with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
            writer.write(head + data)
            await asyncio.wait_for(writer.drain(), 5)

    async def read_head(self, reader: asyncio.StreamReader, timeout: float
                        ) -> tuple[str, str, list[tuple[str, str]]]:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        except asyncio.LimitOverrunError:
            raise _Refused(431, "request head over 64 KB") from None
        except asyncio.IncompleteReadError as error:
            if len(error.partial) > MAX_HEAD:
                raise _Refused(431, "request head over 64 KB") from None
            raise
        if len(raw) > MAX_HEAD:
            raise _Refused(431, "request head over 64 KB")
        try:
            head = httpwire.parse_request(raw)
        except httpwire.WireError as error:
            raise _Refused(400, f"malformed request: {error}") from None
        return head.first[0], head.first[1], head.headers

    def check_destination(self, host: str, port: int, default_port: int, entry: dict[str, Any]) -> str:
        host = host.lower().rstrip(".") if _ip(host) is None else host
        entry["host"], entry["port"] = host, port
        if _ip(host) is None and not _is_name(host):
            raise _Refused(400, "malformed host")
        reason = self.policy.permits(host, port, default_port)
        if reason:
            raise _Refused(403, reason)
        return host

    def company_proxy(self, host: str, port: int, plain: bool = False) -> ProxyURL | None:
        """The company proxy a connection to host:port goes through (None: directly)."""
        route = self.policy.upstream
        if route is None:
            return None
        return route.via(host.lower().rstrip(".") if _ip(host) is None else host, port, tls=not plain)

    async def open_upstream(self, host: str, port: int, default_port: int, entry: dict[str, Any],
                            tls: ssl.SSLContext | None = None,
                            plain: bool = False) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A checked connection to host:port (TLS with `tls`), directly or through the company proxy (`plain`: to
        that proxy itself, for a plain-HTTP request in absolute form)."""
        host = self.check_destination(host, port, default_port, entry)
        wrap: dict[str, Any] = {"ssl": tls, "server_hostname": host} if tls is not None else {}
        proxy = self.company_proxy(host, port, plain)
        if proxy is None and tls is not None and self.broker is not None and self.broker.upstream_address is not None:
            return await self.connect([self.broker.upstream_address(host, port)], host, wrap)  # a test's upstream
        if _ip(host) is not None:
            addresses: Sequence[str] = [host]  # listed by the user, as written: no rebinding to fear
        else:
            resolve = self.policy.resolver or _default_resolver
            try:
                addresses = await asyncio.get_running_loop().run_in_executor(None, resolve, host, port)
            except OSError:
                addresses = []
            if not addresses and proxy is None:
                raise _Refused(502, "name does not resolve")
            # With a company proxy a name need not resolve here (the proxy resolves it); one that does is checked,
            # and so is a name that is the host's loopback or an address whatever resolves it.
            numeric = _numeric_ipv4(host)
            if not addresses and numeric is not None:
                addresses = [str(numeric)]
            if proxy is not None and _local_problem(host) is not None and not self.policy.allow_loopback:
                raise _Refused(403, f"is a loopback name ({host})")
        own = [a for a in addresses if self.policy.host_own(a)]
        if own:  # checked on the address connected to, whatever the pattern: a name rebinding to the host too
            kind = "a loopback address" if self.policy.loopback(own[0]) else "the host's own address"
            raise _Refused(403, f"{'resolves to' if _ip(host) is None else 'is'} {kind} ({own[0]})")
        bad = [a for a in addresses if self.policy.blocked_address(a)] if _ip(host) is None or self.policy.open else []
        if bad:
            kind = "a loopback" if self.policy.loopback(bad[0]) else "a private"
            raise _Refused(403, f"resolves to {kind} address ({bad[0]})")
        if proxy is not None:
            entry["via"] = proxy.where
            return await self.through(proxy, host, port, tls, plain)
        return await self.connect([(address, port) for address in addresses], host, wrap)

    async def through(self, proxy: ProxyURL, host: str, port: int, tls: ssl.SSLContext | None,
                      plain: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The company proxy's tunnel to host:port (TLS to the real host over it, verified for `host`, with `tls`);
        with `plain`, a connection to the proxy itself."""
        timeout = self.policy.connect_timeout
        try:
            if plain:
                return await open_plain(proxy, timeout)
            reader, writer = await open_tunnel(proxy, host, port, timeout)
        except ProxyRefused as error:
            raise _Refused(502, str(error)) from None
        if tls is None:
            return reader, writer
        try:
            return reader, await intercept.start_tls(reader, writer, tls, host, timeout)
        except ssl.SSLError as error:
            writer.close()
            raise _Refused(502, f"the upstream's TLS certificate is not valid for {host}: "
                                f"{getattr(error, 'verify_message', None) or error.reason}") from None
        except (OSError, asyncio.TimeoutError) as error:
            writer.close()
            raise _Refused(502, f"TLS to {host} through the company proxy {proxy.where} failed: "
                                f"{type(error).__name__}") from None

    async def connect(self, addresses: Sequence[tuple[str, int]], host: str,
                      wrap: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        last: Exception | None = None
        for address, port in addresses:
            try:
                return await asyncio.wait_for(asyncio.open_connection(address, port, limit=UPSTREAM_BUFFER, **wrap),
                                              self.policy.connect_timeout)
            except ssl.SSLError as error:
                # the upstream's certificate is not the host's: nothing is sent to it
                raise _Refused(502, f"the upstream's TLS certificate is not valid for {host}: "
                                    f"{getattr(error, 'verify_message', None) or error.reason}") from None
            except (OSError, asyncio.TimeoutError) as error:
                last = error
        raise _Refused(502, f"cannot connect: {last}")

    async def serve(self, head: tuple[str, str, list[tuple[str, str]]], reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, entry: dict[str, Any]) -> None:
        """One authenticated request (its head read): a CONNECT tunnel, a brokered session, or plain HTTP."""
        method, target, headers = head
        body: _Body | None = None
        if method == "CONNECT":
            split = _split_host_port(target)
            if isinstance(split, str) or split[1] is None:
                raise _Refused(400, "CONNECT target must be host:port")
            entry["host"], entry["port"] = split[0].lower(), split[1]
            self.no_leak_in_head(method, target, headers, entry)
            broker = self.broker
            if broker is not None and split[1] == CONNECT_PORT and split[0].lower().rstrip(".") in broker.hosts:
                await self.intercept(broker, split[0].lower().rstrip("."), reader, writer, entry)
                return
            host = self.check_destination(split[0], split[1], CONNECT_PORT, entry)
            if self.uploads.full(host):
                raise self.capped(host, with_body=False)
            up_reader, up_writer = await self.open_upstream(split[0], split[1], CONNECT_PORT, entry)
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            first = b""
        else:
            match = re.match(r"^http://([^/?#]+)(.*)$", target, re.IGNORECASE)
            if not match or "@" in match.group(1):
                raise _Refused(400, "plain HTTP needs an absolute http:// URL")
            split = _split_host_port(match.group(1))
            if isinstance(split, str):
                raise _Refused(400, "malformed host")
            entry["host"], entry["port"] = split[0].lower(), split[1] or HTTP_PORT
            body = _Body(reader, *_framing(headers), leak=self._leak_reason(split[0]) if self.broker else None)
            self.no_placeholders(split[0], target, headers)
            self.no_leak_in_head(method, target, headers, entry)
            body.doors = self.doors.current().body(_content_encoding(headers))
            body.host = entry["host"]
            if self.uploads.full(entry["host"]):
                raise self.capped(entry["host"], with_body=body.state != "done")
            proxy = self.company_proxy(split[0], split[1] or HTTP_PORT, plain=True)
            up_reader, up_writer = await self.open_upstream(split[0], split[1] or HTTP_PORT, HTTP_PORT, entry,
                                                            plain=proxy is not None)
            path = match.group(2) or "/"
            if not path.startswith("/"):
                path = "/" + path
            # Host is the checked authority, so a different Host header cannot pick another virtual host.
            kept = [("Host", match.group(1))] + [
                (n, v) for n, v in headers
                if n.lower() not in ("host", "connection", "proxy-connection", "proxy-authorization", "keep-alive")]
            credentials = proxy.authorization() if proxy is not None else None
            if credentials:
                kept.append(("Proxy-Authorization", credentials))
            # through the company proxy: the absolute form, with its credentials
            line = f"http://{match.group(1)}{path}" if proxy is not None else path
            first = (f"{method} {line} HTTP/1.1\r\n" + "".join(f"{n}: {v}\r\n" for n, v in kept)
                     + "Connection: close\r\n\r\n").encode("latin-1")
        entry["decision"], entry["reason"] = "allow", "listed"
        try:
            self.count_up(entry["host"], len(first), with_body=body is not None and body.state != "done")
            entry["bytes_up"] += len(first)
            up_writer.write(first)
            await self.relay(body or reader, writer, up_reader, up_writer, entry)
        finally:
            up_writer.close()

    def authenticate(self, headers: Sequence[tuple[str, str]]) -> None:
        """The VM's proxy credentials (`Proxy-Authorization: Basic base64(agentbox:SECRET)`), compared by digest in
        constant time; 407 when they are missing or wrong (never saying what was offered)."""
        if self.credentials is None:
            return
        offered = [value for name, value in headers if name.lower() == "proxy-authorization"]
        if not offered:
            raise _Refused(407, "no proxy credentials (Proxy-Authorization)")
        if len(offered) > 1:
            raise _Refused(407, "more than one Proxy-Authorization header")
        scheme, _, token = offered[0].strip().partition(" ")
        if scheme.lower() != "basic":
            raise _Refused(407, "proxy credentials that are not Basic")
        if not hmac.compare_digest(_credentials_digest(token.strip()), self.credentials):
            raise _Refused(407, "wrong proxy credentials (not this VM's)")

    async def intercept(self, broker: Brokering, host: str, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, entry: dict[str, Any]) -> None:
        """A CONNECT to a credential host: TLS as that host, each request judged (agentbox.net.intercept)."""
        host = self.check_destination(host, CONNECT_PORT, CONNECT_PORT, entry)
        entry["decision"] = "allow"
        entry["reason"] = ("inspected (network.inspect: all)" if host in broker.inspected
                           else "credential host: brokered")
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        try:
            writer = await intercept.start_tls(reader, writer, broker.leaves[host])
        except (ssl.SSLError, ConnectionError, asyncio.TimeoutError) as error:
            entry["decision"], entry["reason"] = "deny", f"TLS with the client failed: {type(error).__name__}"
            return
        context = broker.upstream_context or _system_tls(self.policy.upstream)

        async def opener(name: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            try:
                return await self.open_upstream(name, port, CONNECT_PORT, {}, tls=context)
            except _Refused as refused:
                raise intercept.Refusal(refused.status, refused.reason) from None

        session = intercept.Session(broker, host, CONNECT_PORT, entry["client"], opener, self.logged,
                                    self.policy.idle_timeout, self.pool, self.uploads)
        session.doors = self.doors.current()
        try:
            await session.run(reader, writer)
        finally:
            writer.close()

    def no_placeholders(self, host: str, target: str, headers: Sequence[tuple[str, str]]) -> None:
        """A plain-HTTP request that carries a placeholder (this VM's or another's) is an attempted leak."""
        if self.broker is None:
            return
        text = unquote(target) + "\n" + "\n".join(f"{name}: {value}" for name, value in headers)
        found = scan.placeholders_in(text.encode("utf-8", "surrogateescape"))
        if found:
            raise _Refused(403, f"attempted leak: {self._whose(found)} sent to {host} over plain HTTP")

    def no_leak_in_head(self, method: str, target: str, headers: Sequence[tuple[str, str]],
                        entry: dict[str, Any]) -> None:
        """A canary in the request line or headers (a CONNECT's authority too) is an attempted leak."""
        door = self.doors.current()
        if not door.needles:
            return
        text = f"{method} {target} {unquote(target)}\n" + "\n".join(f"{name}: {value}" for name, value in headers)
        hit = door.head(text.encode("utf-8", "surrogateescape"))
        if hit is not None:
            raise _Leak(hit, str(entry["host"]))

    def _leak_reason(self, host: str) -> Callable[[list[str]], str]:
        return lambda found: f"attempted leak: {self._whose(found)} in the body of a plain-HTTP request to {host}"

    def _whose(self, found: list[str]) -> str:
        secrets = {placement.core(secret.placeholder): secret for secret in (self.broker or Brokering({})).secrets}
        ours = [secrets[core] for core in found if core in secrets]
        return f"{ours[0].agent}'s placeholder" if ours else "another VM's placeholder"

    async def relay(self, reader: asyncio.StreamReader | _Body, writer: asyncio.StreamWriter,
                    up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, entry: dict[str, Any]) -> None:
        """Both ways until either side ends; `reader` a plain-HTTP request's body (_Body): its end is not the
        client's (the upstream's answer still comes), and nothing after it is forwarded."""
        last = [time.monotonic()]
        idle = self.policy.idle_timeout

        async def pipe(src: asyncio.StreamReader | _Body, dst: asyncio.StreamWriter, counter: str) -> None:
            while True:
                try:
                    data = await asyncio.wait_for(src.read(CHUNK), idle)
                except asyncio.TimeoutError:
                    if time.monotonic() - last[0] >= idle:
                        entry["reason"] = "idle timeout"
                        return
                    continue
                except _Malformed as error:
                    entry["decision"], entry["reason"] = "error", str(error)
                    raise
                if not data:
                    if isinstance(src, _Body):
                        return  # the request is whole: the client may still read the answer
                    if dst.can_write_eof():
                        with contextlib.suppress(OSError):
                            dst.write_eof()
                    return
                last[0] = time.monotonic()
                if counter == "bytes_up":
                    self.count_up(entry["host"], len(data))
                entry[counter] += len(data)
                dst.write(data)
                await dst.drain()

        up = asyncio.ensure_future(pipe(reader, up_writer, "bytes_up"))
        down = asyncio.ensure_future(pipe(up_reader, writer, "bytes_down"))
        try:
            # The client finishing its upload leaves the download running; the server finishing, an
            # error or the idle timeout on either side ends the tunnel.
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            leak = up.exception() if up in done else None
            if isinstance(leak, _Refused) and leak.decision == uploads.DECISION and not isinstance(reader, _Body):
                entry["decision"], entry["reason"] = leak.decision, leak.reason  # a tunnel is cut where it stands
                return
            if isinstance(leak, _Refused):
                if entry["bytes_down"]:
                    entry["decision"], entry["reason"] = leak.decision or "deny", leak.reason
                    if isinstance(leak, _Leak):
                        doors.mark(entry, leak.refused)
                    return
                raise leak
            if down not in done and up.exception() is None and entry["reason"] != "idle timeout":
                await down
        except (ConnectionError, OSError):
            pass
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)


class _Malformed(Exception):
    """A plain-HTTP request body whose framing breaks the rules (its head was forwarded already: the relay ends)."""


_HEX = lazyre.compile(r"[0-9A-Fa-f]{1,16}")


def _framing(headers: Sequence[tuple[str, str]]) -> tuple[int, bool]:
    """A plain-HTTP request's body framing (RFC 9112 section 6): (Content-Length, chunked). 400 for what a server and
    the proxy could read differently (both headers, another transfer coding, several or odd lengths)."""
    encodings = [value for name, value in headers if name.lower() == "transfer-encoding"]
    lengths = [value.strip() for name, value in headers if name.lower() == "content-length"]
    if encodings:
        if lengths or len(encodings) > 1 or encodings[0].strip().lower() != "chunked":
            raise _Refused(400, "request body framing the proxy does not forward (Transfer-Encoding)")
        return 0, True
    if len(lengths) > 1 or (lengths and not (lengths[0].isdigit() and len(lengths[0]) <= 18)):
        raise _Refused(400, "malformed Content-Length")
    return int(lengths[0]) if lengths else 0, False


def _content_encoding(headers: Sequence[tuple[str, str]]) -> str | None:
    found = [value for name, value in headers if name.lower() == "content-encoding"]
    return found[0] if len(found) == 1 else None


class _Body:
    """A plain-HTTP request's body read from the client as its framing says, bytes as sent (chunk framing included):
    one request per connection, so nothing the client sends after it is read (a second request's head, never
    checked, never reaches the upstream)."""

    def __init__(self, reader: asyncio.StreamReader, length: int, chunked: bool,
                 leak: Callable[[list[str]], str] | None = None) -> None:
        self.reader = reader
        self.chunked = chunked
        self.left = length  # of the body, or of the current chunk
        self.state = "size" if chunked else ("data" if length else "done")
        # with a broker: the body's content (de-chunked) and its trailers are scanned for placeholders, and one
        # found is refused with leak(found) before it is forwarded
        self.leak = leak
        self.scanned = scan.PlaceholderScan()
        self.doors: doors.BodyCheck | None = None  # canaries and private files (agentbox.net.doors)
        self.host = ""

    def _check(self, content: bytes, whole: bool = False) -> None:
        if self.leak is None:
            return
        found = scan.placeholders_in(content) if whole else self.scanned.feed(content)
        if found:
            raise _Refused(403, self.leak(found))

    def _doors(self, content: bytes | None) -> None:
        """`content` (None: the body's end) checked before it is forwarded."""
        if self.doors is None:
            return
        hit = self.doors.feed(content) if content is not None else self.doors.end()
        if hit is not None:
            raise _Leak(hit, self.host)

    async def read(self, limit: int) -> bytes:
        while self.state == "data" and not self.left:
            self.state = "crlf" if self.chunked else "done"
        if self.state == "done":
            self._doors(None)
            self.doors = None
            return b""
        if self.state == "data":
            data = await self.reader.read(min(limit, self.left))
            if not data:
                raise asyncio.IncompleteReadError(b"", self.left)
            self.left -= len(data)
            self._check(data)
            self._doors(data)
            return data
        try:
            line = await self.reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise _Malformed("a chunked body's line over 64 KB") from None
        if self.state == "size":
            size = line[:-2].split(b";", 1)[0].rstrip(b" \t")
            if not _HEX.fullmatch(size.decode("latin-1")):
                raise _Malformed("malformed chunk size")
            self.left = int(size, 16)
            self.state = "data" if self.left else "trailer"
        elif self.state == "crlf":
            if line != b"\r\n":
                raise _Malformed("a chunk longer than its size")
            self.state = "size"
        elif line == b"\r\n":  # the trailer section's end
            self.state = "done"
        else:
            self._check(line, whole=True)  # a trailer field: a header the server may read
        return line


class RunningProxy:
    """A proxy serving on 127.0.0.1:`port` from its own thread until `stop()`."""

    def __init__(self, policy: Policy, log_path: Path, port: int, broker: Brokering | None = None,
                 listener: socket.socket | None = None, secret: str | None = None,
                 guest_socket: Path | None = None) -> None:
        self.port = 0
        self._guest_socket = guest_socket
        self._handed: socket.socket | None = None
        self._handing: set[asyncio.Task[None]] = set()
        self._broker = broker
        self._secret = secret
        self._log = _Log(log_path)
        self._loop = asyncio.new_event_loop()
        self._proxy: _Proxy | None = None
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(policy, port, listener), name="agentbox-netproxy",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._log.close()
            raise self._error

    def _run(self, policy: Policy, port: int, listener: socket.socket | None) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._open(policy, port, listener))
        except BaseException as error:  # handed to the caller of start()
            self._error = error
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _open(self, policy: Policy, port: int, listener: socket.socket | None) -> None:
        self._proxy = _Proxy(policy, self._log, self._broker, self._secret)
        if self._guest_socket is not None:
            self._handed = _listen_unix(self._guest_socket)
            self._loop.add_reader(self._handed.fileno(), self._take_handed)
        if listener is not None:  # bound and listening already: connections made meanwhile wait in its backlog
            self._server = await asyncio.start_server(self._proxy.handle, sock=listener, limit=MAX_HEAD)
            self.port = listener.getsockname()[1]
            return
        try:
            self._server = await asyncio.start_server(self._proxy.handle, "127.0.0.1", port, limit=MAX_HEAD)
        except OSError:
            if port == 0:
                raise
            self._server = await asyncio.start_server(self._proxy.handle, "127.0.0.1", 0, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]

    def _take_handed(self) -> None:
        """A held VM's connection, handed over by agentbox.net.holdconnector: served as any client."""
        assert self._handed is not None and self._proxy is not None
        try:
            connection, _ = self._handed.accept()
        except OSError:
            return
        with connection:
            connection.settimeout(HANDED_TIMEOUT)
            try:
                _, descriptors, _, _ = socket.recv_fds(connection, 1, 4)
            except OSError:
                return
        for descriptor in descriptors:
            try:
                guest = socket.socket(fileno=descriptor)
            except OSError:  # not a socket: nothing to serve
                os.close(descriptor)
                continue
            guest.setblocking(False)
            task = self._loop.create_task(self._serve_handed(guest))
            self._handing.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._handing.discard)

    async def _serve_handed(self, guest: socket.socket) -> None:
        assert self._proxy is not None
        try:
            reader, writer = await asyncio.open_connection(sock=guest, limit=MAX_HEAD)
        except OSError:
            guest.close()
            return
        await self._proxy.handle(reader, writer, client="guest (held)")

    async def _shutdown(self) -> None:
        assert self._server is not None and self._proxy is not None
        if self._handed is not None:
            self._loop.remove_reader(self._handed.fileno())
            self._handed.close()
            if self._guest_socket is not None:
                with contextlib.suppress(OSError):
                    self._guest_socket.unlink()  # nothing stale for the next proxy (it binds anew)
        self._server.close()
        tasks = list(self._proxy.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._proxy.pool.close()
        await self._server.wait_closed()
        await self._loop.shutdown_default_executor()

    def set_policy(self, policy: Policy) -> None:
        """Decide the next requests by `policy` (open tunnels stay as they are)."""
        if self._proxy is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._proxy.use_policy, policy)

    def set_secret(self, secret: str | None) -> None:
        """Ask the next connections for the proxy credentials with `secret` (open connections stay as they are)."""
        if self._proxy is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(setattr, self._proxy, "credentials", _expected(secret))

    def set_broker(self, broker: Brokering | None) -> None:
        """Broker the next connections with `broker` (None: tunnel everything; open connections stay as they are)."""
        if self._proxy is not None and self._thread.is_alive():
            proxy = self._proxy

            async def swap() -> None:
                proxy.set_broker(broker)

            asyncio.run_coroutine_threadsafe(swap(), self._loop).result()  # the next connection sees it

    def stop(self) -> None:
        """Close the listener and every open connection, then the log; idempotent."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._log.close()

    def __enter__(self) -> RunningProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listen_unix(path: Path) -> socket.socket:
    """A listening Unix socket at `path` (in a 0700 folder: only this user reaches it), made anew."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address = str(path)
    if len(os.fsencode(address)) > UNIX_PATH_MAX and sys.platform.startswith("linux"):
        # Longer than a socket address takes: bound through the folder's descriptor.
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            listener.bind(f"/proc/self/fd/{folder}/{path.name}")
        finally:
            os.close(folder)
    else:
        listener.bind(address)
    listener.listen(64)
    listener.setblocking(False)
    return listener


def start(policy: Policy, log_path: Path, port: int = 0, broker: Brokering | None = None,
          listener: socket.socket | None = None, secret: str | None = None,
          guest_socket: Path | None = None) -> RunningProxy:
    """Serve the proxy on 127.0.0.1:port (0, or a taken port: any free one), or on `listener` (a listening socket
    on 127.0.0.1), from a background thread; with a broker, CONNECTs to its credential hosts are brokered
    (agentbox.net.intercept). `secret`: every request must carry the proxy credentials `agentbox:SECRET` (the VM's
    proxy process always passes its VM's, agentbox.net.guard); None asks for none (tests and benchmarks)."""
    return RunningProxy(policy, Path(log_path), port, broker, listener, secret, guest_socket)
