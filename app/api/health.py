"""Liveness and metrics: never behind the API key."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["health"])


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = request.app.state
    if getattr(state, "engine", None) is not None:
        return JSONResponse({"status": "ok"})
    error = getattr(state, "load_error", None)
    body = {"status": "error", "error": error} if error else {"status": "loading"}
    return JSONResponse(body, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
