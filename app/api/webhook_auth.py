"""Who is calling /webhook/{assistant}/chat, with n8n Chat Trigger's authentication options:

- "none": anyone (production answers 403 unless CHATLOOM_ALLOW_OPEN_WEBHOOK=true);
- "basic": `Authorization: Basic base64(user:password)` (n8n's Basic Auth credential);
- "header": a named header carrying a token (n8n's Header Auth; @n8n/chat sends it from
  `webhookConfig.headers`).
An assistant's own `webhook_auth` wins over the server's CHATLOOM_WEBHOOK_AUTH. The API key
(`Authorization: Bearer <key>`, as the web chat sends it) is accepted everywhere.

The caller (app.principal) that comes out: the key holder for the key; "webhook:<assistant id>"
for the webhook's credential, and for anyone at all on an open webhook of a server that has a key
(then marked anonymous: such callers run the assistant's tools only if it allows them); on an
open server an open webhook's caller is DEFAULT, the same caller /v1 sees (no key protects
anything there)."""

from __future__ import annotations

import base64
import binascii
import secrets
from typing import Any

from fastapi import Request

from app.agent.config import verify_secret
from app.deps import bearer_token, has_api_key, key_matches
from app.errors import APIError
from app.principal import OPEN, Principal, key_principal, webhook_principal
from app.settings import Settings


def _basic_credentials(request: Request) -> tuple[str, str] | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def _same(given: str, expected: str) -> bool:
    return secrets.compare_digest(given.encode(), expected.encode())


class WebhookAuthError(APIError):
    """A refused webhook caller; `headers` go on the answer (WWW-Authenticate for Basic)."""

    def __init__(self, message: str, status_code: int, code: str, headers: dict[str, str] | None = None):
        super().__init__(message, status_code, code=code)
        self.headers = headers or {}

    def response(self):
        from app.errors import error_response

        return error_response(
            self.status_code, self.message, code=self.code, type=self.type, headers=self.headers
        )


def _unauthorized(kind: str) -> WebhookAuthError:
    if kind == "basic":
        return WebhookAuthError(
            "This webhook needs Basic authentication (Authorization: Basic ...).",
            401,
            "invalid_credentials",
            {"WWW-Authenticate": 'Basic realm="chatloom webhook", charset="UTF-8"'},
        )
    return WebhookAuthError("This webhook needs its authentication header.", 401, "invalid_credentials")


def _check_basic(request: Request, auth: dict[str, Any], settings: Settings) -> bool:
    given = _basic_credentials(request)
    if given is None:
        return False
    user, password = given
    if "password_hash" in auth:  # the assistant's own credential
        return _same(user, auth.get("user") or "") and verify_secret(password, auth["password_hash"])
    expected = settings.webhook_password.get_secret_value() if settings.webhook_password else None
    return expected is not None and _same(user, settings.webhook_user or "") and _same(password, expected)


def _check_header(request: Request, auth: dict[str, Any], settings: Settings) -> bool:
    if "value_hash" in auth:
        value = request.headers.get(auth.get("name") or "")
        return value is not None and verify_secret(value.strip(), auth["value_hash"])
    value = request.headers.get(settings.webhook_header_name)
    expected = settings.webhook_header_value.get_secret_value() if settings.webhook_header_value else None
    return value is not None and expected is not None and _same(value.strip(), expected)


def authenticate(
    request: Request, settings: Settings, assistant_id: str, auth: dict[str, Any] | None
) -> Principal:
    """The caller of this assistant's webhook; WebhookAuthError (401 / 403) when refused.
    auth: the assistant's stored webhook_auth, None for the server's settings."""
    token = bearer_token(request)
    if key_matches(settings, token):
        return key_principal(settings.api_key.get_secret_value())
    kind = (auth or {}).get("type") or settings.webhook_auth
    auth = auth or {}
    if kind == "basic":
        if not _check_basic(request, auth, settings):
            raise _unauthorized("basic")
        return webhook_principal(assistant_id)
    if kind == "header":
        if not _check_header(request, auth, settings):
            raise _unauthorized("header")
        return webhook_principal(assistant_id)
    # an open webhook
    if settings.environment == "production" and not settings.allow_open_webhook:
        raise WebhookAuthError(
            "This webhook is open to anyone, which production refuses: set CHATLOOM_WEBHOOK_AUTH (or the "
            "assistant's webhook_auth), or CHATLOOM_ALLOW_OPEN_WEBHOOK=true.",
            403,
            "open_webhook_refused",
        )
    if not has_api_key(settings):
        return OPEN
    if token is not None:  # a key that is not the key: say so (the web chat then asks again)
        raise WebhookAuthError("Incorrect API key provided.", 401, "invalid_api_key")
    return webhook_principal(assistant_id, anonymous=True)
