"""Servers for the app tests: real uvicorn on localhost, one per session, in a background thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from app.main import create_app
from app.settings import Settings
from tests.app.fake_engine import FakeEngine


@dataclass
class LiveServer:
    url: str
    app: object
    server: uvicorn.Server

    @property
    def base(self) -> str:
        return self.url + "/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(app, ready_timeout: float = 120.0) -> Iterator[LiveServer]:
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError("the test server did not become healthy")
        time.sleep(0.05)
    try:
        yield LiveServer(url, app, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="session")
def fake_engine(qwen_tokenizer) -> FakeEngine:
    return FakeEngine(qwen_tokenizer)


@pytest.fixture(scope="session")
def fake_server(fake_engine, tmp_path_factory) -> Iterator[LiveServer]:
    """The app over a scripted FakeEngine (set fake_engine.script per test; reset afterwards)."""
    db = tmp_path_factory.mktemp("db-fake") / "chatloom.db"
    settings = Settings(database_url=f"sqlite:///{db}", max_body_bytes=256 * 1024)
    yield from run_server(create_app(settings, engine=fake_engine))


@pytest.fixture
def script(fake_engine):
    """Set the fake model's text for this test: script("...") or script(callable)."""
    from tests.app.fake_engine import default_script

    def set_script(value):
        fake_engine.script = value if callable(value) else (lambda prompt, params, index: value)

    yield set_script
    fake_engine.script = default_script
    fake_engine.delay = 0.0


@pytest.fixture(scope="session")
def real_server(tiny_qwen3, tmp_path_factory) -> Iterator[LiveServer]:
    """The app loading the tiny random Qwen3 through the real engine, as `chatloom serve` does."""
    settings = Settings(
        model=str(tiny_qwen3),
        served_model_name="tiny-qwen3",
        device="cpu",
        dtype="float32",
        max_model_len=1024,
        num_kv_blocks=512,
        database_url=f"sqlite:///{tmp_path_factory.mktemp('db-real') / 'chatloom.db'}",
    )
    yield from run_server(create_app(settings))
