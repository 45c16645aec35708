"""Fixtures of the conversation-store suite: every DB test runs on SQLite and on PostgreSQL
(127.0.0.1:5432, user postgres, a fresh database per test, dropped after), a scripted fake engine
with the real Qwen tokenizer, the app with chatloom's conversation routers, and a local webhook
server."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from engine.outputs import StepOutput

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=2):
            return True
    except Exception:
        return False


_PG = _pg_available()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/chatloom.db"
        return
    if not _PG:
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    import psycopg

    name = f"chatloom_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def chat_tokenizer(tmp_path_factory):
    """The real Qwen2.5 tokenizer with our chat template (no weights needed)."""
    from transformers import AutoTokenizer

    from models.tiny import write_tokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


@dataclass
class Call:
    prompt_ids: list[int]
    params: object
    retention_key: str | None


@dataclass
class FakeEngine:
    """AsyncEngine's interface with scripted replies. Each reply is a text, or a list of token
    ids (to emit a tokenization the tokenizer would not choose itself)."""

    tokenizer: object
    replies: deque = field(default_factory=deque)
    calls: list[Call] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    delay: float = 0.0  # seconds per token

    def say(self, *replies) -> None:
        self.replies.extend(replies)

    async def generate(self, prompt, params, request_id: str, retention_key: str | None = None):
        self.calls.append(Call(list(prompt), params, retention_key))
        reply = self.replies.popleft() if self.replies else f"Reply number {len(self.calls)}."
        stop_reason = None
        if isinstance(reply, tuple):  # (text, the stop string that ended it)
            reply, stop_reason = reply
        ids = reply if isinstance(reply, list) else self.tokenizer.encode(reply, add_special_tokens=False)
        done: list[int] = []
        skip = params.skip_special_tokens
        for tid in ids:
            before = self.tokenizer.decode(done, skip_special_tokens=skip)
            done.append(tid)
            delta = self.tokenizer.decode(done, skip_special_tokens=skip)[len(before) :]
            await asyncio.sleep(self.delay)
            yield StepOutput(request_id, 0, [tid], delta)
        last = [] if stop_reason else [self.tokenizer.eos_token_id]
        yield StepOutput(request_id, 0, last, "", finish_reason="stop", stop_reason=stop_reason)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> dict:
        return {"prefix_cache_hit_tokens": 0, "prefix_cache_queried_tokens": 0}

    max_model_len: int = 4096

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass


@pytest.fixture
def fake_engine(chat_tokenizer) -> FakeEngine:
    return FakeEngine(chat_tokenizer)


def build_app(settings, engine):
    """The whole service (app.main.create_app) with the given engine: the conversation routers and
    the memory lifespan hooks are wired the way production runs them."""
    from app.main import create_app

    return create_app(settings, engine=engine)


# the local webhook server listens on loopback, which webhook tools may only reach when allowed
LOOPBACK_TOOLS = {"webhook_allowed_networks": ["127.0.0.0/8"]}


def make_settings(db_url: str, **extra):
    from app.settings import Settings

    values = dict(
        database_url=db_url,
        n8n_history_table="n8n_chat_histories",
        cors_origins=[],
        assistants_file=None,
        api_key=None,
        environment="development",
    )
    values.update(extra)
    return Settings(**values)


@asynccontextmanager
async def running_app(settings, engine) -> AsyncIterator[httpx.AsyncClient]:
    """Start the app (lifespan included) and yield a client bound to it; stop it on exit."""
    app = build_app(settings, engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            client.app = app
            yield client


# ---- a webhook server for tools ----------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        self.server.received.append((self.path, body))
        if self.path.startswith("/slow"):
            time.sleep(1.5)
        if self.path.startswith("/fail"):
            self._send(500, {"message": "workflow crashed"})
        else:
            self._send(200, [{"response": f"Sunny in {body.get('city', '?')}"}])

    def _send(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass


@pytest.fixture
def webhook_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    server.daemon_threads = True
    server.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


ROOT = Path(__file__).resolve().parents[2]
