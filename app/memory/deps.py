"""FastAPI dependencies of the conversation routers (state set by app.memory.lifespan.startup)."""

from __future__ import annotations

from typing import Annotated

import httpx
from fastapi import Depends, Request

from app.deps import get_engine  # 503 while the model loads, naming a load error
from app.errors import APIError
from app.memory.db import Database


def get_db(request: Request) -> Database:
    db = getattr(request.app.state, "db", None)
    if db is None:
        raise APIError("The conversation store is not running.", 503)
    return db


def get_http(request: Request) -> httpx.AsyncClient:
    http = getattr(request.app.state, "webhook_http", None)
    if http is None:
        # webhook tools: no redirects followed, no proxy from the environment (app.agent.webhooks)
        http = request.app.state.webhook_http = httpx.AsyncClient(follow_redirects=False, trust_env=False)
    return http


__all__ = ["DB", "HTTP", "get_db", "get_engine", "get_http"]

DB = Annotated[Database, Depends(get_db)]
HTTP = Annotated[httpx.AsyncClient, Depends(get_http)]
