"""Codex's login as the broker keeps it: ~/.codex/auth.json on the host, placeholders in the VM.

    host:  {"OPENAI_API_KEY": key or null, "tokens": {"id_token", "access_token", "refresh_token", "account_id"},
            "last_refresh": ISO time}
    VM:    the same shape: id_token an unsigned JWT with the same claims (Codex decodes it, never verifies it),
           access and refresh tokens placeholders, the API key a placeholder.
    refresh: POST auth.openai.com/oauth/token (JSON); the answer {"id_token", "access_token", "refresh_token"}.
"""

from __future__ import annotations

from typing import Any

from agentbox.credentials.filelogin import FileLogin, number, remaining, string
from agentbox.credentials.tokens import Tokens, jwt_claims


class CodexLogin(FileLogin):
    access_kind = ""
    refresh_kind = ""

    def parse(self, doc: dict[str, Any]) -> Tokens | None:
        tokens = doc.get("tokens")
        if tokens is None:
            return None
        if not isinstance(tokens, dict):
            raise self.bad("its tokens is not an object")
        access, refresh = string(tokens, "access_token"), string(tokens, "refresh_token")
        if access is None or refresh is None:
            return None
        return Tokens(access, refresh, number(jwt_claims(access).get("exp")), string(tokens, "id_token"))

    def api_key(self) -> str | None:
        doc = self.file.json()
        return self.file_api_key(doc) if doc else None

    def file_api_key(self, doc: dict[str, Any]) -> str | None:
        key = doc.get("OPENAI_API_KEY")
        return key if isinstance(key, str) and key else None

    def with_file_api_key(self, vm_doc: dict[str, Any], placeholder: str) -> dict[str, Any]:
        return {**vm_doc, "OPENAI_API_KEY": placeholder}

    def without_login(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Its ChatGPT tokens and its API key go (the key is the previous login's: Codex's own login replaces it
        too, with the key it exchanges the new id token for, or none)."""
        kept = {key: value for key, value in doc.items() if key not in ("tokens", "last_refresh")}
        return {**kept, "OPENAI_API_KEY": None}

    def apply(self, doc: dict[str, Any], response: dict[str, Any], now: float) -> dict[str, Any]:
        tokens = doc.get("tokens")
        tokens = dict(tokens) if isinstance(tokens, dict) else {}
        for key in ("id_token", "access_token", "refresh_token"):
            if string(response, key):
                tokens[key] = response[key]
        account = _account(tokens.get("id_token"))
        if account and not string(tokens, "account_id"):
            tokens["account_id"] = account
        # deferred: start-up (datetime: tests/test_own_time.py keeps it off the launch)
        from datetime import datetime, timezone  # only a token refresh writes a date (not a launch)

        stamp = datetime.fromtimestamp(now, timezone.utc).isoformat().replace("+00:00", "Z")
        return {"OPENAI_API_KEY": doc.get("OPENAI_API_KEY"), **doc, "tokens": tokens, "last_refresh": stamp}

    def reply(self, tokens: Tokens, ph: dict[str, str], upstream: dict[str, Any] | None, now: float
              ) -> dict[str, Any]:
        reply: dict[str, Any] = {"access_token": ph["access"], "refresh_token": ph["refresh"]}
        if "id_token" in ph:
            reply["id_token"] = ph["id_token"]
        if upstream and isinstance(upstream.get("token_type"), str):
            reply["token_type"] = upstream["token_type"]
        if tokens.expires_at is not None:
            reply["expires_in"] = remaining(tokens, now)
        return reply

    def vm_file(self, doc: dict[str, Any], tokens: Tokens, ph: dict[str, str]) -> dict[str, Any]:
        real = doc["tokens"]
        vm_tokens: dict[str, Any] = {"access_token": ph["access"], "refresh_token": ph["refresh"]}
        if "id_token" in ph:
            vm_tokens["id_token"] = ph["id_token"]
        if isinstance(real.get("account_id"), str):
            vm_tokens["account_id"] = real["account_id"]
        result: dict[str, Any] = {"OPENAI_API_KEY": None, "tokens": vm_tokens}
        if isinstance(doc.get("last_refresh"), str):
            result["last_refresh"] = doc["last_refresh"]
        return result


def _account(id_token: Any) -> str | None:
    auth = jwt_claims(id_token).get("https://api.openai.com/auth")
    account = auth.get("chatgpt_account_id") if isinstance(auth, dict) else None
    return account if isinstance(account, str) and account else None
