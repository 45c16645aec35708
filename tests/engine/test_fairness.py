"""Fairness: one request's many samples (n > 1) cannot take every seat. A request with nothing
running goes before further samples of running requests, and a few seats are kept for new requests,
so a small request starts at once behind requests with n=16 (scheduler on plain objects, then the
tiny Qwen3 checkpoint through AsyncEngine)."""

from __future__ import annotations

import asyncio
from itertools import count

from engine import AsyncEngine, EngineConfig, SamplingParams
from engine.block_manager import BlockManager
from engine.scheduler import Scheduler
from runner.sequence import Sequence

_tok = count(5000)


def _request(sched: Scheduler, rid: str, n: int, tokens: int = 8) -> list[Sequence]:
    ids = [next(_tok) for _ in range(tokens)]
    params = SamplingParams(n=n, max_tokens=100)
    seqs = [Sequence(rid, ids, params, index=i) for i in range(n)]
    for s in seqs:
        sched.add(s)
    return seqs


def test_samples_of_running_requests_leave_reserved_seats():
    sched = Scheduler(BlockManager(4096, 4, True), max_num_seqs=32, max_num_batched_tokens=4096)
    assert sched.reserved_seats == 2
    big = [_request(sched, f"big{i}", 16) for i in range(2)]
    batch = sched.schedule()
    sched.after_step(batch)
    assert len(sched.running) == 30  # 32 seats less the 2 reserved
    # each big request got its first sample before the other's further ones
    assert batch.seqs[:2] == [big[0][0], big[1][0]]
    small = _request(sched, "small", 1)
    batch = sched.schedule()
    assert small[0] in batch.seqs and len(sched.running) == 31
    sched.after_step(batch)
    # the last reserved seat is for a new request too: the big requests' remaining samples wait
    batch = sched.schedule()
    assert len(sched.running) == 31 and len(sched.waiting) == 2


def test_a_new_request_goes_before_further_samples_in_arrival_order():
    sched = Scheduler(BlockManager(4096, 4, True), max_num_seqs=8, max_num_batched_tokens=4096)
    assert sched.reserved_seats == 0  # small engines keep none; ordering alone still helps
    big = _request(sched, "big", 16)
    first = sched.schedule()
    sched.after_step(first)
    assert len(sched.running) == 8 and first.seqs == big[:8]
    small = _request(sched, "small", 1)
    sched.finish(big[0])  # a seat frees
    batch = sched.schedule()
    assert batch.seqs[-1] is small[0]  # not big's ninth sample, which arrived first


async def test_small_request_is_not_starved_behind_n16_requests(tiny_qwen3):
    cfg = EngineConfig(
        model=str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=512, max_num_seqs=64
    )
    eng = AsyncEngine(cfg)
    await eng.start()
    big_done: list[float] = []
    try:
        loop = asyncio.get_running_loop()

        async def big(i: int) -> int:
            params = SamplingParams(n=16, temperature=0.8, max_tokens=16, ignore_eos=True, seed=i)
            tokens = 0
            async for out in eng.generate([10 + i, 20, 30, 40, 50, 60], params, request_id=f"big{i}"):
                tokens += len(out.new_token_ids)
            big_done.append(loop.time())
            return tokens

        tasks = [asyncio.create_task(big(i)) for i in range(4)]
        while eng.stats()["running"] < 60:  # every big request has taken what it may
            await asyncio.sleep(0.005)
        assert eng.stats()["running"] == 60 and eng.stats()["waiting"] == 4
        sent = loop.time()
        first_token = None
        small = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        async for out in eng.generate([7, 8, 9], small, request_id="small"):
            if first_token is None and out.new_token_ids:
                first_token = loop.time()
        assert first_token is not None
        assert not big_done, "the small request waited for a big one to finish"
        assert await asyncio.gather(*tasks) == [16 * 16] * 4
        assert first_token - sent < min(big_done) - sent
    finally:
        await eng.shutdown()
