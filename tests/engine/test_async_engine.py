"""AsyncEngine on the tiny Qwen3 checkpoint (CPU, float32): continuous batching keeps greedy tokens
unchanged, abort and early exit free every block, n > 1, errors, many concurrent tasks, retention keys.

Waiting for the engine to go idle polls its stats with a generous deadline; nothing here asserts speed."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine import AsyncEngine, EngineConfig, SamplingParams

STATS_KEYS = {"free_blocks", "total_blocks", "running", "waiting", "prefix_cache_hit_tokens"}


@pytest.fixture(scope="module")
def shared_engine(tiny_qwen3):
    eng = AsyncEngine(EngineConfig(model=str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=256))
    yield eng
    asyncio.run(eng.shutdown())


@pytest.fixture
async def engine(shared_engine):
    await shared_engine.start()
    yield shared_engine
    await wait_idle(shared_engine)  # leave no request behind for the next test


async def wait_idle(eng: AsyncEngine, deadline_s: float = 60.0) -> dict:
    end = time.monotonic() + deadline_s
    while True:
        s = eng.stats()
        if s["running"] == 0 and s["waiting"] == 0 and s["free_blocks"] == s["total_blocks"]:
            return s
        assert time.monotonic() < end, f"engine did not go idle: {s}"
        await asyncio.sleep(0.01)


def greedy(max_tokens: int = 8, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


async def collect(eng, prompt, params, started: asyncio.Event | None = None, **kw) -> dict:
    """All outputs of one request: {index: (token ids, text, finish reason)}, plus the first output."""
    tokens: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    first = None
    async for out in eng.generate(prompt, params, **kw):
        first = first or out
        tokens.setdefault(out.index, []).extend(out.new_token_ids)
        texts[out.index] = texts.get(out.index, "") + out.text_delta
        reasons[out.index] = out.finish_reason
        if started is not None:
            started.set()
    return {"tokens": tokens, "texts": texts, "reasons": reasons, "first": first}


def prompt(seed: int, n: int = 40) -> list[int]:
    return [(seed * 7919 + i * 104729) % 150000 for i in range(n)]


async def test_stats_keys_and_start_values(engine):
    s = await wait_idle(engine)
    assert set(s) >= STATS_KEYS
    assert s["free_blocks"] == s["total_blocks"] == 256


async def test_request_joining_a_running_batch_gets_its_alone_tokens(engine):
    a_alone = await collect(engine, prompt(1), greedy(12))
    b_alone = await collect(engine, prompt(2, 70), greedy(40))
    assert a_alone["reasons"] == {0: "length"} and len(a_alone["tokens"][0]) == 12

    started = asyncio.Event()
    b_task = asyncio.create_task(collect(engine, prompt(2, 70), greedy(40), started))
    await started.wait()  # b is decoding now
    a_joined = await collect(engine, prompt(1), greedy(12))
    b_joined = await b_task
    assert a_joined["tokens"] == a_alone["tokens"]
    assert b_joined["tokens"] == b_alone["tokens"]
    assert a_joined["first"].cached_tokens == 32  # the alone run left its prefix in the cache
    text = engine.tokenizer.decode(a_joined["tokens"][0])
    assert a_joined["texts"][0] == text
    s = await wait_idle(engine)
    assert s["free_blocks"] == s["total_blocks"]


async def test_abort_frees_all_blocks(engine):
    got = []
    async for out in engine.generate(prompt(3, 60), greedy(1000), request_id="to-abort"):
        got.append(out)
        if len(got) == 2:
            await engine.abort("to-abort")
    assert got[-1].finish_reason == "abort"
    assert all(o.finish_reason is None for o in got[:-1])
    assert len(got) < 1000
    s = engine.stats()  # already current when the abort reaches the stream
    assert s["free_blocks"] == s["total_blocks"] and s["running"] == 0


async def test_leaving_the_loop_early_aborts(engine):
    n = 0
    async for _ in engine.generate(prompt(4, 60), greedy(1000), request_id="early-exit"):
        n += 1
        if n == 2:
            break
    s = await wait_idle(engine)
    assert s["free_blocks"] == s["total_blocks"]
    # the id is free again: a new request may use it
    again = await collect(engine, prompt(4, 60), greedy(2), request_id="early-exit")
    assert again["reasons"] == {0: "length"}


async def test_cancelling_the_consumer_task_aborts(engine):
    started = asyncio.Event()
    task = asyncio.create_task(collect(engine, prompt(5, 60), greedy(1000), started))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    s = await wait_idle(engine)
    assert s["free_blocks"] == s["total_blocks"]


async def test_n2_yields_both_indices(engine):
    res = await collect(engine, prompt(6), SamplingParams(n=2, temperature=1.0, seed=11, max_tokens=4))
    assert set(res["tokens"]) == {0, 1}
    assert all(len(t) == 4 for t in res["tokens"].values())
    assert res["reasons"] == {0: "length", 1: "length"}
    assert res["tokens"][0] != res["tokens"][1]


@pytest.mark.parametrize(
    "bad_prompt, params, match",
    [
        ([1, 2, 151936], greedy(), "outside the vocabulary"),
        ([1] * 4090, greedy(16), "context length"),
        ([], greedy(), "empty"),
        ([1, 2], greedy(logit_bias={10**6: 1.0}), "logit_bias"),
    ],
)
async def test_invalid_request_raises_value_error(engine, bad_prompt, params, match):
    with pytest.raises(ValueError, match=match):
        async for _ in engine.generate(bad_prompt, params):
            pass
    assert (await collect(engine, prompt(7), greedy(2)))["reasons"] == {0: "length"}  # still serving


async def test_duplicate_request_id_is_rejected_without_harming_the_first(engine):
    started = asyncio.Event()
    first = asyncio.create_task(collect(engine, prompt(8), greedy(30), started, request_id="dup"))
    await started.wait()
    with pytest.raises(ValueError, match="already running"):
        async for _ in engine.generate(prompt(9), greedy(2), request_id="dup"):
            pass
    res = await first
    assert res["reasons"] == {0: "length"} and len(res["tokens"][0]) == 30


async def test_many_concurrent_tasks_all_finish_with_their_alone_tokens(engine):
    prompts = [prompt(20 + i, 5 + 9 * i) for i in range(4)]
    alone = [await collect(engine, p, greedy(5)) for p in prompts]
    results = await asyncio.gather(*(collect(engine, prompts[i % 4], greedy(5)) for i in range(12)))
    for i, res in enumerate(results):
        assert res["reasons"] == {0: "length"}
        assert res["tokens"] == alone[i % 4]["tokens"]
    s = await wait_idle(engine)
    assert s["free_blocks"] == s["total_blocks"]


async def test_retention_key_requests_keep_working(engine):
    turn1 = await collect(engine, prompt(30), greedy(6), retention_key="conversation-1")
    history = prompt(30) + turn1["tokens"][0] + prompt(31, 10)
    others = asyncio.gather(
        *(collect(engine, prompt(40 + i), greedy(3), retention_key=f"c{i}") for i in range(3))
    )
    turn2 = await collect(engine, history, greedy(6), retention_key="conversation-1")
    await others
    assert turn2["reasons"] == {0: "length"}
    assert turn2["first"].cached_tokens >= 32  # the first turn's prompt came back from the cache
    assert turn2["tokens"] == (await collect(engine, history, greedy(6)))["tokens"]
    s = await wait_idle(engine)
    assert s["free_blocks"] == s["total_blocks"] and s["prefix_cache_hit_tokens"] > 0


async def test_failed_step_ends_its_requests_and_the_engine_keeps_serving(engine):
    def explode(ids, logits):
        raise RuntimeError("processor exploded")

    bad = greedy(6, logits_processors=[explode])
    with pytest.raises(RuntimeError, match="generation failed"):
        async for _ in engine.generate([5, 6, 7], bad, request_id="boom"):
            pass
    outs = [o async for o in engine.generate([5, 6, 7], greedy(4), request_id="after")]
    assert outs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outs) == 4
    stats = await wait_idle(engine)
    assert stats["free_blocks"] == stats["total_blocks"]


async def test_overlapped_penalty_rows_launch_ahead_and_abort(tiny_qwen3):
    # the server's loop over an overlapped engine (the CUDA default) with rows that read their
    # previous token on the host (penalties: each step launches the next forward ahead): concurrent
    # requests get their alone tokens, one aborted mid-stream leaves no blocks behind
    cfg = dict(model=str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=256)
    eng = AsyncEngine(EngineConfig(**cfg, async_scheduling=True))
    await eng.start()
    try:
        pen = [greedy(10 + 3 * i, frequency_penalty=0.5, presence_penalty=0.2) for i in range(4)]
        alone = [await collect(eng, prompt(20 + i, 30 + 5 * i), pen[i]) for i in range(4)]

        async def aborted() -> None:
            n = 0
            long = greedy(500, frequency_penalty=0.5)
            async for _ in eng.generate(prompt(30, 50), long, request_id="gone"):
                n += 1
                if n == 3:
                    await eng.abort("gone")

        together = await asyncio.gather(
            *(collect(eng, prompt(20 + i, 30 + 5 * i), pen[i]) for i in range(4)), aborted()
        )
        assert [t["tokens"] for t in together[:4]] == [a["tokens"] for a in alone]
        s = await wait_idle(eng)
        assert s["free_blocks"] == s["total_blocks"]
    finally:
        await eng.shutdown()
