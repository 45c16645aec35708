"""FastAPI dependencies as Annotated aliases: the engine, the serving context, settings, the API key."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import Depends, Request

from app.chat.serving import Serving
from app.errors import APIError
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


async def require_api_key(request: Request) -> None:
    """401 unless `Authorization: Bearer <key>` matches the configured key (no key: open)."""
    settings: Settings = request.app.state.settings
    if settings.api_key is None or not settings.api_key.get_secret_value():
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise APIError(
            "Missing API key: send it as 'Authorization: Bearer <key>'.", 401, code="invalid_api_key"
        )
    expected = settings.api_key.get_secret_value().encode()
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected):
        raise APIError("Incorrect API key provided.", 401, code="invalid_api_key")


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Any, Depends(get_engine)]
ServingDep = Annotated[Serving, Depends(get_serving)]
ApiKey = Depends(require_api_key)
