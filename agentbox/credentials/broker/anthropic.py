"""Claude Code's login as the broker keeps it: ~/.claude/.credentials.json on the host, placeholders in the VM.

    host:  {"claudeAiOauth": {"accessToken", "refreshToken", "expiresAt" (ms), "scopes", "subscriptionType", ...}}
    VM:    the same with sk-ant-oat01-agentbox-ph-... / sk-ant-ort01-agentbox-ph-...; other top-level entries
           (an MCP server's OAuth tokens) stay on the host.
    refresh: POST platform.claude.com/v1/oauth/token (and console.anthropic.com's, older versions), JSON;
           the answer {"token_type", "access_token", "expires_in", "refresh_token", "scope", ...}.
"""

from __future__ import annotations

import json
from typing import Any

from agentbox.credentials.filelogin import FileLogin, expires_in, number, remaining, string
from agentbox.credentials.tokens import Tokens

KEPT = ("expiresAt", "scopes", "subscriptionType", "rateLimitTier")  # non-secret fields the VM's file keeps
# ~/.claude.json: what holds a secret there (an API key approved in Claude Code; the approved keys' last 20
# characters), dropped from the VM's copy.
CLAUDE_JSON_SECRETS = ("primaryApiKey",)


class ClaudeLogin(FileLogin):
    access_kind = "sk-ant-oat01-"
    refresh_kind = "sk-ant-ort01-"

    def parse(self, doc: dict[str, Any]) -> Tokens | None:
        oauth = doc.get("claudeAiOauth")
        if oauth is None:
            return None
        if not isinstance(oauth, dict):
            raise self.bad("its claudeAiOauth is not an object")
        access, refresh = string(oauth, "accessToken"), string(oauth, "refreshToken")
        if access is None or refresh is None:
            return None  # what Claude Code leaves after a failed refresh: logged out
        expires = oauth.get("expiresAt")
        if expires is not None and number(expires) is None:
            raise self.bad("its claudeAiOauth.expiresAt is not a time in milliseconds")
        scopes = oauth.get("scopes")
        scope = " ".join(s for s in scopes if isinstance(s, str)) if isinstance(scopes, list) else None
        return Tokens(access, refresh, expires / 1000 if expires else None, None, scope)

    def apply(self, doc: dict[str, Any], response: dict[str, Any], now: float) -> dict[str, Any]:
        oauth = doc.get("claudeAiOauth")
        oauth = dict(oauth) if isinstance(oauth, dict) else {}
        oauth["accessToken"] = response["access_token"]
        if string(response, "refresh_token"):
            oauth["refreshToken"] = response["refresh_token"]
        seconds = expires_in(response)
        if seconds is not None:
            oauth["expiresAt"] = int((now + seconds) * 1000)
        if string(response, "scope"):
            oauth["scopes"] = response["scope"].split()
        return {**doc, "claudeAiOauth": oauth}

    def without_login(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in doc.items() if key != "claudeAiOauth"}  # an MCP server's tokens stay

    def account_companion(self, response: dict[str, Any]) -> bytes | None:
        """The token response's `account` ({"uuid", "email_address"}) as ~/.claude.json's oauthAccount names it."""
        account = response.get("account")
        if not isinstance(account, dict):
            return None
        named = {key: account[field] for key, field in (("accountUuid", "uuid"), ("emailAddress", "email_address"))
                 if isinstance(account.get(field), str)}
        return json.dumps({"oauthAccount": named}).encode()

    def reply(self, tokens: Tokens, ph: dict[str, str], upstream: dict[str, Any] | None, now: float
              ) -> dict[str, Any]:
        base = {k: v for k, v in (upstream or {}).items() if k in ("token_type", "scope", "account", "organization")}
        return {"token_type": "Bearer", **({"scope": tokens.scope} if tokens.scope else {}), **base,
                "access_token": ph["access"], "refresh_token": ph["refresh"],
                "expires_in": remaining(tokens, now)}

    def vm_file(self, doc: dict[str, Any], tokens: Tokens, ph: dict[str, str]) -> dict[str, Any]:
        oauth = doc["claudeAiOauth"]
        kept = {key: oauth[key] for key in KEPT if key in oauth}
        return {"claudeAiOauth": {"accessToken": ph["access"], "refreshToken": ph["refresh"], **kept}}


def claude_json_for_vm(data: bytes, api_key_placeholder: str | None) -> bytes:
    """~/.claude.json without the secrets it may hold (its MCP servers are filtered by staging's transform as
    before). With a placeholder API key, that key is the one approved (Claude Code asks otherwise)."""
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    result = {key: value for key, value in doc.items() if key not in CLAUDE_JSON_SECRETS}
    responses = result.pop("customApiKeyResponses", None)
    if api_key_placeholder is not None:
        result["customApiKeyResponses"] = {"approved": [api_key_placeholder[-20:]], "rejected": []}
    elif isinstance(responses, dict):
        result["customApiKeyResponses"] = {"approved": [], "rejected": []}
    return (json.dumps(result, indent=2) + "\n").encode()
