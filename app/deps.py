"""FastAPI dependencies as Annotated aliases: the engine, the serving context, settings, the API key
and the caller it makes (app.principal)."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import Depends, Request

from app import principal as principals
from app.chat.serving import Serving
from app.errors import APIError
from app.principal import OPEN, Principal, key_principal
from app.settings import Settings


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_engine(request: Request) -> Any:
    engine = getattr(request.app.state, "engine", None)
    if engine is None:
        error = getattr(request.app.state, "load_error", None)
        message = (
            f"The model failed to load: {error}" if error else "The model is still loading; retry shortly."
        )
        raise APIError(message, 503, code="model_not_ready")
    return engine


def get_serving(request: Request, engine: Annotated[Any, Depends(get_engine)]) -> Serving:
    return request.app.state.serving


def bearer_token(request: Request) -> str | None:
    """The token of `Authorization: Bearer <token>`, None without one."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def key_matches(settings: Settings, token: str | None) -> bool:
    if token is None or settings.api_key is None:
        return False
    return secrets.compare_digest(token.encode(), settings.api_key.get_secret_value().encode())


def has_api_key(settings: Settings) -> bool:
    return settings.api_key is not None and bool(settings.api_key.get_secret_value())


async def require_api_key(request: Request) -> Principal:
    """401 unless `Authorization: Bearer <key>` matches the configured key (no key: open). The
    caller (app.principal) goes to request.state.principal and to the request's context, where the
    session store finds it."""
    settings: Settings = request.app.state.settings
    if not has_api_key(settings):
        principal = OPEN
    else:
        if not request.headers.get("authorization"):
            raise APIError(
                "Missing API key: send it as 'Authorization: Bearer <key>'.", 401, code="invalid_api_key"
            )
        token = bearer_token(request)
        if not key_matches(settings, token):
            raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")
        principal = key_principal(settings.api_key.get_secret_value())
    request.state.principal = principal
    principals.set_current(principal)
    return principal


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Any, Depends(get_engine)]
ServingDep = Annotated[Serving, Depends(get_serving)]
ApiKey = Depends(require_api_key)
Caller = Annotated[Principal, Depends(require_api_key)]  # FastAPI runs it once per request
