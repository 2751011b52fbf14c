"""GitHub through the broker: read-only by allow-list, and scoped pushes (`git.allowPush: session`).

`judge()` decides a request to a GitHub host by its method, its normalised path and its query, before anything is
sent (unless `allow_push`, which is `sync.remoteWrite: true`):
- api.github.com: GET and HEAD; POST /graphql when every operation in it is a query (agentbox.net.graphql; its body
  is read whole first: `BODY_GRAPHQL`); GET /graphql?query= the same way; the Copilot token exchange is refused
  (the token it returns would be a real credential in the VM).
- uploads.github.com: GET and HEAD (release assets are written there).
- github.com, gist.github.com, with the VM's credential: git's fetch (`info/refs?service=git-upload-pack`,
  `git-upload-pack`) and Git LFS downloads (`info/lfs/objects/batch` with "operation": "download"); nothing else.
  Without it (the placeholder is not there), anything but a push: the VM holds no other GitHub login.
- A push (`git-receive-pack`) with `push_namespace`: the advertisement passes; the POST's commands are read before
  anything is sent (`BODY_PUSH`, `check_push`) and the whole push is refused when any ref is outside the namespace,
  is a delete, or updates a ref no push of this VM created.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import parse_qsl

from agentbox import lazyre
from agentbox.net import graphql

API = "api.github.com"
UPLOADS = "uploads.github.com"
GIT_HOSTS = frozenset({"github.com", "gist.github.com"})
HOSTS = GIT_HOSTS | {API, UPLOADS}
READS = ("GET", "HEAD")
BODY_GRAPHQL = "graphql"
BODY_LFS = "lfs"
BODY_PUSH = "push"
_REPO = r"(?:/[^/]+){1,2}"  # owner/repo, or a gist's id
_ADVERTISE = lazyre.compile(_REPO + r"/info/refs")
_UPLOAD_PACK = lazyre.compile(_REPO + r"/git-upload-pack")
_RECEIVE_PACK = lazyre.compile(_REPO + r"/git-receive-pack")
_LFS_BATCH = lazyre.compile(_REPO + r"/info/lfs/objects/batch")
_ZERO = lazyre.compile(r"0{40}|0{64}")
_OID = lazyre.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_BAD_REF = lazyre.compile(r"\.\.|//|/\.|@\{|[\x00-\x20\x7f~^:?*\[\\]|\.lock(?:/|$)|[/.]$")
MAX_COMMANDS = 1 << 20


class Verdict(NamedTuple):
    refused: str | None = None  # why, when refused now
    body: str | None = None  # the body must be read and checked first: BODY_GRAPHQL, BODY_LFS or BODY_PUSH


ALLOWED = Verdict()


def judge(host: str, method: str, path: str, query: str, credential: bool, allow_push: bool,
          push_namespace: str | None) -> Verdict:
    if allow_push or host not in HOSTS:
        return ALLOWED
    params = parse_qsl(query, keep_blank_values=True)
    if host == API:
        if path == "/graphql" and method == "POST":
            return Verdict(body=BODY_GRAPHQL) if not query else Verdict("a GraphQL request with a query string")
        if path == "/graphql" and method in READS:
            texts = [value for name, value in params if name == "query"]
            if len(texts) != 1 or len(params) != sum(1 for name, _ in params if name in _GET_GRAPHQL):
                return Verdict("a GraphQL request whose query cannot be read")
            return ALLOWED if _only_reads(texts[0]) else Verdict("a GraphQL mutation")
        if path == "/copilot_internal/v2/token" and credential:
            return Verdict("Copilot's token exchange: the Copilot token it returns would be a real credential in the "
                           "VM (log Copilot in inside the VM with `agentbox copilot login`)")
        return ALLOWED if method in READS else Verdict(f"a write through GitHub's API ({method} {path})")
    if host == UPLOADS:
        return ALLOWED if method in READS else Verdict(f"an upload to GitHub ({method} {path})")
    service = [value for name, value in params if name == "service"]
    if _RECEIVE_PACK.fullmatch(path) or (_ADVERTISE.fullmatch(path) and "git-receive-pack" in service):
        if push_namespace is None:
            return Verdict("a git push")
        if method == "GET" and _ADVERTISE.fullmatch(path) and service == ["git-receive-pack"] and len(params) == 1:
            return ALLOWED
        if method == "POST" and _RECEIVE_PACK.fullmatch(path) and not query:
            return Verdict(body=BODY_PUSH) if credential else ALLOWED
        return Verdict("a git push in a form the broker does not read")
    if not credential:
        return ALLOWED
    if method == "GET" and _ADVERTISE.fullmatch(path) and service == ["git-upload-pack"] and len(params) == 1:
        return ALLOWED
    if method == "POST" and _UPLOAD_PACK.fullmatch(path) and not query:
        return ALLOWED
    if method == "POST" and _LFS_BATCH.fullmatch(path) and not query:
        return Verdict(body=BODY_LFS)
    return Verdict(f"{method} {path}: the VM's GitHub login goes to {host} only for git fetches")


_GET_GRAPHQL = ("query", "variables", "operationName")


def _only_reads(text: str) -> bool:
    try:
        return graphql.document_only_queries(text)
    except graphql.Unreadable:
        return False


def check_body(kind: str, body: bytes) -> str | None:
    """Why a GraphQL or LFS request body is refused (None: it reads)."""
    if kind == BODY_GRAPHQL:
        return None if graphql.only_reads(body) else "a GraphQL request that is not only queries (a mutation, or " \
                                                      "one the broker cannot read)"
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return "a Git LFS request the broker cannot read"
    if not isinstance(data, dict) or data.get("operation") != "download":
        return "a Git LFS upload"
    return None


# -- scoped pushes -------------------------------------------------------------------------------------------

class Update(NamedTuple):
    ref: str
    old: str
    new: str


class PushRead(NamedTuple):
    updates: tuple[Update, ...]
    consumed: int  # the bytes of the body the commands (and push options) took


def read_commands(data: bytes) -> PushRead | None:
    """receive-pack's commands at the start of a push's body (pkt-lines up to the flush, and the push options'
    section when the first command asks for them); None while more bytes are needed. ValueError when it is not a
    command list the broker can read (a signed push, protocol v2 packets, a malformed line)."""
    at = 0
    updates: list[Update] = []
    options = False
    sections = 0
    while True:
        if len(data) < at + 4:
            return None
        size_text = data[at:at + 4]
        if not re.fullmatch(rb"[0-9a-f]{4}", size_text):
            raise ValueError("a malformed pkt-line")
        size = int(size_text, 16)
        if size == 0:
            at += 4
            sections += 1
            if not updates:
                raise ValueError("a push without commands")
            if sections == 2 or not options:
                return PushRead(tuple(updates), at)
            continue
        if size < 5:
            raise ValueError("a delimiter packet (protocol v2)")
        if len(data) < at + size:
            return None
        line = data[at + 4:at + size]
        at += size
        if sections == 1:
            continue  # a push option
        text = line.rstrip(b"\n")
        if not updates and b"\0" in text:
            text, _, capabilities = text.partition(b"\0")
            options = b"push-options" in capabilities.split()
        if text.startswith(b"shallow "):
            continue
        parts = text.decode("utf-8", "replace").split(" ")
        if len(parts) != 3 or not _OID.fullmatch(parts[0]) or not _OID.fullmatch(parts[1]):
            raise ValueError("a command line the broker does not read (a signed push?)")
        updates.append(Update(parts[2], parts[0], parts[1]))


def check_push(updates: tuple[Update, ...], namespace: str, created: Mapping[str, str]) -> str | None:
    """Why the push is refused (None: every update is allowed)."""
    for update in updates:
        if not update.ref.startswith(namespace) or _BAD_REF.search(update.ref[len("refs/"):]):
            return f"a push to {update.ref}: the VM may push only to branches under {namespace}"
        if _ZERO.fullmatch(update.new):
            return f"a push that deletes {update.ref}"
        if not _ZERO.fullmatch(update.old) and update.ref not in created:
            return f"a push that rewrites {update.ref}, which no push of this VM created"
    return None


def report_status(body: bytes) -> dict[str, str]:
    """ref -> "ok" or the reason GitHub refused it, from receive-pack's report-status (in side-band or not)."""
    lines = _pkt_lines(body)
    if lines and lines[0][:1] in (b"\x01", b"\x02", b"\x03"):
        lines = _pkt_lines(b"".join(line[1:] for line in lines if line[:1] == b"\x01"))
    outcome = {}
    for line in lines:
        text = line.rstrip(b"\n").decode("utf-8", "replace")
        if text.startswith("ok "):
            outcome[text[3:]] = "ok"
        elif text.startswith("ng "):
            ref, _, reason = text[3:].partition(" ")
            outcome[ref] = reason or "refused"
    return outcome


def _pkt_lines(data: bytes) -> list[bytes]:
    lines = []
    at = 0
    while at + 4 <= len(data):
        try:
            size = int(data[at:at + 4], 16)
        except ValueError:
            break
        if size == 0:
            at += 4
            continue
        if size < 4 or at + size > len(data):
            break
        lines.append(data[at + 4:at + size])
        at += size
    return lines
