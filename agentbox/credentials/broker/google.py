"""Gemini CLI's login as the broker keeps it: ~/.gemini/oauth_creds.json on the host, placeholders in the VM.

    host:  {"access_token", "refresh_token", "scope", "token_type", "id_token", "expiry_date" (ms)}
    VM:    ya29.agentbox-ph-... / 1//agentbox-ph-..., the id_token an unsigned JWT with the same claims.
    Gemini checks its token first (POST oauth2.googleapis.com/tokeninfo with the access token): the access
    token may go there as well as to its API.
    refresh: POST oauth2.googleapis.com/token (form); the answer {"access_token", "expires_in", "scope",
           "token_type", "id_token"}.
"""

from __future__ import annotations

from typing import Any

from agentbox.credentials.filelogin import FileLogin, expires_in, number, remaining, string
from agentbox.credentials.tokens import Tokens


class GeminiLogin(FileLogin):
    access_kind = "ya29."
    refresh_kind = "1//"

    def parse(self, doc: dict[str, Any]) -> Tokens | None:
        access, refresh = string(doc, "access_token"), string(doc, "refresh_token")
        if refresh is None:
            return None
        if access is None:
            access = ""
        expiry = doc.get("expiry_date")
        if expiry is not None and number(expiry) is None:
            raise self.bad("its expiry_date is not a time in milliseconds")
        return Tokens(access, refresh, expiry / 1000 if expiry else None, string(doc, "id_token"),
                      string(doc, "scope"))

    def apply(self, doc: dict[str, Any], response: dict[str, Any], now: float) -> dict[str, Any]:
        result = dict(doc)
        for key in ("access_token", "refresh_token", "id_token", "scope", "token_type"):
            if string(response, key):
                result[key] = response[key]
        seconds = expires_in(response)
        if seconds is not None:
            result["expiry_date"] = int((now + seconds) * 1000)
        return result

    def reply(self, tokens: Tokens, ph: dict[str, str], upstream: dict[str, Any] | None, now: float
              ) -> dict[str, Any]:
        reply: dict[str, Any] = {"access_token": ph["access"], "expires_in": remaining(tokens, now),
                                 "token_type": "Bearer"}
        if tokens.scope:
            reply["scope"] = tokens.scope
        if "id_token" in ph:
            reply["id_token"] = ph["id_token"]
        if upstream is not None and string(upstream, "refresh_token"):
            reply["refresh_token"] = ph["refresh"]  # a code exchange (a login) returns one; a refresh does not
        return reply

    def vm_file(self, doc: dict[str, Any], tokens: Tokens, ph: dict[str, str]) -> dict[str, Any]:
        result: dict[str, Any] = {"access_token": ph["access"], "refresh_token": ph["refresh"],
                                  "token_type": doc.get("token_type") or "Bearer"}
        for key in ("scope", "expiry_date"):
            if key in doc:
                result[key] = doc[key]
        if "id_token" in ph:
            result["id_token"] = ph["id_token"]
        return result
