"""Tokenizing and rendering a huge prompt happen off the event loop: a small request sent meanwhile
is answered at once instead of waiting seconds for the tokenizer (issue 42)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.main import create_app
from app.settings import Settings
from tests.app.conftest import run_server
from tests.app.fake_engine import FakeEngine


@pytest.fixture(scope="module")
def roomy_server(qwen_tokenizer, tmp_path_factory):
    settings = Settings(
        database_url=f"sqlite:///{tmp_path_factory.mktemp('db-loop') / 'c.db'}", max_body_bytes=8 << 20
    )
    yield from run_server(create_app(settings, engine=FakeEngine(qwen_tokenizer)))


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")],
)
async def test_a_huge_prompt_does_not_stall_a_small_request(roomy_server, path, field):
    text = "the quick brown fox jumps over the lazy dog. " * 12_000  # 540 kB, ~120k tokens
    body = {"prompt": text} if field == "prompt" else {"messages": [{"role": "user", "content": text}]}
    async with httpx.AsyncClient(base_url=roomy_server.url, timeout=60) as client:
        await client.get("/v1/models")  # a warm connection pool
        start = time.perf_counter()
        big = asyncio.create_task(client.post(path, json=body))
        latencies = []
        while not big.done():
            t0 = time.perf_counter()
            assert (await client.get("/v1/models")).status_code == 200
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - start
        r = await big
    # the prompt is longer than the context: a 400 naming it, after the whole tokenization
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    # small requests were answered while the big one ran; on the event loop the first of them would
    # wait for the whole tokenization (a latency close to `elapsed`). Relative, so that a fast or a
    # loaded machine decides nothing
    assert len(latencies) >= 3, "the big request was too quick to show anything"
    assert max(latencies) < elapsed / 2, (max(latencies), elapsed)
