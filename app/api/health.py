"""Liveness and metrics: never behind the API key.

/health: 200 {"status": "ok", "database": "ok"} when the model is loaded and the conversation
store answers (the "database" key only where the app has a store); 503 with "loading" or "error"
while the model is not serving; 503 {"status": "degraded", "database": "down", "error": ...} when
the model serves but the store does not answer (the OpenAI routes without a session still work,
but a load balancer should prefer another replica)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["health"])

PING_TIMEOUT_S = 2.0  # /health answers within this even when the store is frozen


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = request.app.state
    if getattr(state, "engine", None) is None:
        error = getattr(state, "load_error", None)
        body = {"status": "error", "error": error} if error else {"status": "loading"}
        return JSONResponse(body, status_code=503)
    db = getattr(state, "db", None)
    if db is None:
        return JSONResponse({"status": "ok"})
    problem = await db.ping(min(PING_TIMEOUT_S, db.timeout_s))
    if problem is not None:
        return JSONResponse({"status": "degraded", "database": "down", "error": problem}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
