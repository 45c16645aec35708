"""The overlapped step (tokens read back one step late) gives exactly the synchronous results:
greedy tokens, stop strings, EOS, max_tokens, n > 1, preemption, abort, and block accounting."""

from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams


def prompts(n: int = 12) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randint(0, 10000) for _ in range(rng.randint(1, 120))] for _ in range(n)]


@pytest.fixture(scope="module")
def pair(tiny_qwen3):
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=64, block_size=16)
    return LLM(tiny_qwen3, async_scheduling=False, **kw), LLM(tiny_qwen3, async_scheduling=True, **kw)


def run_both(pair, ps, params):
    sync, overlap = pair
    a, b = sync.generate(ps, params), overlap.generate(ps, params)
    for x, y in zip(a, b, strict=True):
        for ox, oy in zip(x.outputs, y.outputs, strict=True):
            assert ox.token_ids == oy.token_ids
            assert ox.text == oy.text
            assert ox.finish_reason == oy.finish_reason
    for llm in pair:
        stats = llm.stats()
        assert stats["free_blocks"] == stats["total_blocks"]
    return b


def test_greedy_and_lengths(pair):
    ps = prompts()
    params = [SamplingParams(temperature=0, max_tokens=1 + 3 * i, ignore_eos=True) for i in range(len(ps))]
    outs = run_both(pair, ps, params)
    assert [len(o.token_ids) for o in outs] == [1 + 3 * i for i in range(len(ps))]
    assert all(-1 not in o.token_ids for o in outs)


def test_stops_mid_stream(pair, qwen_tokenizer):
    ps = prompts()
    sync = pair[0]
    # pick stop tokens / strings the model really produces, so sequences end early at different steps
    free = sync.generate(ps, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    params = []
    for i, o in enumerate(free):
        if i % 3 == 0:
            stop_id = o.token_ids[5 + i % 7]
            params.append(SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_id]))
        elif i % 3 == 1:
            text = o.text
            params.append(SamplingParams(temperature=0, max_tokens=20, stop=[text[len(text) // 2 :][:3]]))
        else:
            params.append(SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    outs = run_both(pair, ps, params)
    assert sum(o.finish_reason == "stop" for o in outs) >= len(ps) // 3


def test_sampling_n_and_seed(pair):
    ps = prompts(4)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, n=2, seed=11, ignore_eos=True)
    outs = run_both(pair, ps, params)
    assert all(len(o.outputs) == 2 for o in outs)


def test_preemption(tiny_qwen3):
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=20, block_size=16)
    small = (LLM(tiny_qwen3, async_scheduling=False, **kw), LLM(tiny_qwen3, async_scheduling=True, **kw))
    ps = prompts(10)
    run_both(small, ps, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert small[1].stats()["num_preemptions"] > 0


def test_abort_in_flight(pair):
    overlap = pair[1]
    core = overlap.core
    core.add_request("a", prompts(1)[0], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    core.add_request("b", prompts(2)[1], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    for _ in range(3):
        core.step()
    assert core._inflight is not None
    outs = core.abort("a")
    assert outs and outs[0].finish_reason == "abort"
    while core.has_unfinished():
        for out in core.step():
            assert out.request_id == "b"
    stats = overlap.stats()
    assert stats["free_blocks"] == stats["total_blocks"]
