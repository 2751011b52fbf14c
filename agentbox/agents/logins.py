"""The login files agentbox can copy back from the VM: how each is read, whose it is, how fresh it is.

Only these formats are written back (agentbox.credentials.writeback); any other credential file (Kiro's database,
gh's hosts.yml, ~/.claude.json) only ever travels host → VM. A file is parsed here from bytes the
VM wrote, so nothing in it is trusted beyond its shape: JSON of a bounded size, the fields each
format needs, JWT payloads decoded (never verified: agentbox has no key to verify them with, and the
only question asked is whether two files name the same account).

    file (under the home)         account                                   freshness
    .claude/.credentials.json     oauthAccount.accountUuid of ~/.claude.json claudeAiOauth.expiresAt (ms)
                                  (the credential file names no account)
    .codex/auth.json              tokens.account_id, the id_token's          last_refresh (ISO 8601),
                                  chatgpt_account_id and sub                 else the access token's exp
    .gemini/oauth_creds.json      the id_token's sub                         expiry_date (ms)

When neither side names an account, two logins count as the same account when they have the same
shape: the same kind of tokens (Claude's `sk-ant-ort01`-style prefixes, the token type). A file
without a freshness field is compared by modification time.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from agentbox.agents.builtin import BUILTIN_AGENTS

MAX_FILE = 1 << 20  # a login file; real ones are a few KB
MAX_COMPANION = 32 << 20  # ~/.claude.json keeps per-project history and grows to several MB


class Unusable(Exception):
    """The bytes are not a login of this format; the message says why, in words."""


class Login(NamedTuple):
    ids: dict[str, str]  # stable account identifiers the file names, by kind
    shown: str | None  # the account in words (an e-mail address), for messages
    shape: tuple[str, ...]  # compared when neither side names an account
    fresh_until: float | None  # expiry or refresh time, seconds since the epoch; None: use the file's mtime


class Format(NamedTuple):
    path: str  # relative to the home, as staged (credentials.Staged.guest_path)
    agent: str  # whose login it is, in words
    command: str  # the agent's name in agentbox's commands (`agentbox claude login`)
    parse: Callable[[bytes], Login]
    companion: str | None = None  # another staged file that names the account
    companion_ids: Callable[[bytes], tuple[dict[str, str], str | None]] | None = None


def same_account(guest: Login, host: Login) -> bool | None:
    """True or False when the two name comparable accounts; None when neither names one."""
    common = set(guest.ids) & set(host.ids)
    if not common:
        return None
    return all(guest.ids[kind] == host.ids[kind] for kind in common)


def with_companion(fmt: Format, login: Login, companion: bytes | None) -> Login:
    """The login with the account its companion file names (Claude Code keeps it in ~/.claude.json)."""
    if fmt.companion_ids is None or companion is None:
        return login
    try:
        ids, shown = fmt.companion_ids(companion)
    except Unusable:
        return login
    return login._replace(ids={**ids, **login.ids}, shown=login.shown or shown)


# -- the formats ---------------------------------------------------------------------------------


def _claude(data: bytes) -> Login:
    oauth = _object(_json(data), "claudeAiOauth")
    access = _string(oauth, "accessToken", "claudeAiOauth.")
    refresh = _string(oauth, "refreshToken", "claudeAiOauth.")
    return Login({}, None, ("claude", _token_kind(access), _token_kind(refresh)),
                 _milliseconds(oauth.get("expiresAt")))


def _claude_account(data: bytes) -> tuple[dict[str, str], str | None]:
    account = _json(data, MAX_COMPANION).get("oauthAccount")
    if not isinstance(account, dict):
        return {}, None
    ids = {"accountUuid": account["accountUuid"]} if _nonempty(account.get("accountUuid")) else {}
    return ids, account["emailAddress"] if _nonempty(account.get("emailAddress")) else None


def _codex(data: bytes) -> Login:
    doc = _json(data)
    tokens = _object(doc, "tokens")
    access = _string(tokens, "access_token", "tokens.")
    _string(tokens, "refresh_token", "tokens.")
    claims = jwt_claims(tokens.get("id_token"))
    auth = claims.get("https://api.openai.com/auth")
    auth = auth if isinstance(auth, dict) else {}
    ids: dict[str, str] = {}
    account = tokens.get("account_id") if _nonempty(tokens.get("account_id")) else auth.get("chatgpt_account_id")
    if _nonempty(account):
        ids["account"] = str(account)
    if _nonempty(claims.get("sub")):
        ids["sub"] = str(claims["sub"])
    fresh = _iso_time(doc.get("last_refresh"))
    if fresh is None:
        fresh = _seconds(jwt_claims(access).get("exp"))
    return Login(ids, _email(claims), ("codex", "chatgpt"), fresh)


def _gemini(data: bytes) -> Login:
    doc = _json(data)
    _string(doc, "refresh_token")
    claims = jwt_claims(doc.get("id_token"))
    ids = {"sub": claims["sub"]} if _nonempty(claims.get("sub")) else {}
    token_type = doc.get("token_type")
    kind = token_type.lower() if isinstance(token_type, str) else ""
    return Login(ids, _email(claims), ("gemini", kind), _milliseconds(doc.get("expiry_date")))


# The parsers by the name an agent's record gives (AgentSpec.login_formats).
PARSERS: dict[str, Callable[[bytes], Login]] = {"claude": _claude, "codex": _codex, "gemini": _gemini}
COMPANION_PARSERS: dict[str, Callable[[bytes], tuple[dict[str, str], str | None]]] = {
    "claude_account": _claude_account,
}


def formats() -> dict[str, Format]:
    """The login files written back, by path, from the built-in agents' records."""
    return {
        login.path: Format(
            login.path, spec.title, spec.name, PARSERS[login.parser], login.companion,
            COMPANION_PARSERS[login.companion_parser] if login.companion_parser else None,
        )
        for spec in BUILTIN_AGENTS.values()
        for login in spec.login_formats
    }


FORMATS: dict[str, Format] = formats()


# -- reading -------------------------------------------------------------------------------------


def _json(data: bytes, limit: int = MAX_FILE) -> dict[str, Any]:
    if len(data) > limit:
        raise Unusable(f"it is larger than {limit:,} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Unusable("it is not valid JSON") from exc
    if not isinstance(doc, dict):
        raise Unusable("it is not a JSON object")
    return doc


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise Unusable(f"it has no {key} object")
    return value


def _string(doc: dict[str, Any], key: str, where: str = "") -> str:
    value = doc.get(key)
    if not _nonempty(value):
        raise Unusable(f"it has no {where}{key}")
    return str(value)


def _nonempty(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 4096


def _token_kind(token: str) -> str:
    """`sk-ant-ort01` for an Anthropic token (the prefix names its kind, the rest is the secret)."""
    parts = token.split("-")
    return "-".join(parts[:3]) if token.startswith("sk-") and len(parts) > 3 else "opaque"


def _milliseconds(value: Any) -> float | None:
    return value / 1000 if _number(value) else None


def _seconds(value: Any) -> float | None:
    return float(value) if _number(value) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e16


def _iso_time(value: Any) -> float | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    # Python 3.10's fromisoformat takes neither "Z" nor other than 3 or 6 digits of a second's fraction.
    # deferred: start-up (datetime: tests/test_own_time.py keeps it off the launch)
    from datetime import datetime  # only a login with an ISO expiry needs it (not on most launches)

    text = re.sub(r"\.(\d+)", lambda m: "." + (m.group(1) + "000000")[:6], value.strip())
    try:
        moment = datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", text))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def jwt_claims(token: Any) -> dict[str, Any]:
    """A JWT's payload, decoded but not verified; {} for anything that is not one."""
    if not isinstance(token, str) or len(token) > 65536 or token.count(".") != 2:
        return {}
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, RecursionError):
        return {}
    return claims if isinstance(claims, dict) else {}


def _email(claims: dict[str, Any]) -> str | None:
    email = claims.get("email")
    return email if _nonempty(email) else None
