"""The overlapped step (tokens read back one step late) gives exactly the synchronous results:
greedy tokens, stop strings, EOS, max_tokens, n > 1, preemption, abort, and block accounting; and
so do requests whose rows read their previous token on the host before sampling (constraints,
penalties, logits processors), which stay overlapped: the forward never waits for their tokens."""

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
            assert (ox.logprobs is None) == (oy.logprobs is None)
            for lx, ly in zip(ox.logprobs or [], oy.logprobs or [], strict=True):
                assert lx.token_id == ly.token_id and lx.logprob == pytest.approx(ly.logprob, abs=1e-5)
                assert [t for t, _ in lx.top] == [t for t, _ in ly.top]
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


# ---- rows that read their previous token on the host -------------------------------------------
def _bit(t: int) -> int:
    v = 1 << (t % 32)
    return v - (1 << 32) if v >= 1 << 31 else v  # bit 31 of an int32 word is its sign


class _Chain:
    """A grammar stand-in: its allowed tokens follow from the previous accepted token, so a mask
    filled before that token reached the host would differ. EOS only after `length` tokens."""

    def __init__(self, first: int, length: int, eos: int) -> None:
        self.first, self.length, self.eos = first, length, eos
        self.seen: list[int] = []
        self.done = False

    def allowed(self) -> list[int]:
        if len(self.seen) >= self.length:
            return [self.eos]
        base = self.seen[-1] if self.seen else self.first
        return [100 + (base * 31 + 1009 * k) % 5000 for k in range(4)]

    def fill_bitmask(self, bitmask, row: int, remaining_tokens: int) -> None:
        assert not self.done, "the row of a finished sequence was filled"
        bitmask[row].zero_()
        for t in self.allowed():
            bitmask[row, t // 32] |= _bit(t)

    def accept_token(self, token_id: int) -> bool:
        assert not self.done and token_id in self.allowed()
        self.seen.append(token_id)
        self.done = token_id == self.eos
        return True

    def is_terminated(self) -> bool:
        return self.done


class _BatchedChain(_Chain):
    @staticmethod
    def fill_bitmasks(bitmask, rows: list) -> None:
        for c, row, remaining in rows:
            c.fill_bitmask(bitmask, row, remaining)


class _ChainFactory:
    def __init__(self, kind: type[_Chain], first: int, length: int, eos: int) -> None:
        self.kind, self.first, self.length, self.eos = kind, first, length, eos

    def ready(self) -> bool:
        return True

    def new(self) -> _Chain:
        return self.kind(self.first, self.length, self.eos)


def _chain_params(core, count: int, **kw) -> list[SamplingParams]:
    eos = min(core.eos_token_ids)
    # lengths 3..31 against max_tokens 24: some stop on EOS mid-batch, some run out of tokens
    return [
        SamplingParams(
            max_tokens=24,
            constraint=_ChainFactory(_BatchedChain if i % 2 else _Chain, i, 3 + 4 * i, eos),
            **kw,
        )
        for i in range(count)
    ]


def test_constrained_greedy(pair):
    ps = prompts(8)
    outs = run_both(pair, ps, _chain_params(pair[0].core, len(ps), temperature=0))
    assert {o.finish_reason for o in outs} == {"stop", "length"}


def test_constrained_seeded_sampling_n2(pair):
    ps = prompts(6)
    run_both(pair, ps, _chain_params(pair[0].core, len(ps), temperature=1.0, seed=7, n=2))


def test_seeded_penalties_processors_logprobs(pair):
    def nudge(ids, logits):  # reads the previous token: makes its successor (nearly) certain
        logits = logits.clone()
        logits[(ids[-1] + 1) % 1000 if ids else 0] += 30.0
        return logits

    ps = prompts(6)
    params = [
        SamplingParams(
            temperature=0.9,
            seed=5 + i,
            n=2,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            presence_penalty=0.3,
            logprobs=2,
            logits_processors=[nudge] if i % 2 else [],
            max_tokens=6 + 3 * i,
            ignore_eos=True,
        )
        for i in range(len(ps))
    ]
    outs = run_both(pair, ps, params)
    assert all(len(c.logprobs) == len(c.token_ids) for o in outs for c in o.outputs)


def test_stop_strings_with_penalties(pair):
    ps = prompts()
    free = pair[0].generate(ps, SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.2))
    params = []
    for i, o in enumerate(free):
        stop = [o.text[len(o.text) // 2 :][:3]] if i % 2 else []
        params.append(SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.2, stop=stop))
    outs = run_both(pair, ps, params)
    assert sum(o.finish_reason == "stop" for o in outs) >= len(ps) // 3


def test_host_token_rows_keep_steps_overlapped(pair):
    core = pair[1].core
    for i, p in enumerate(_chain_params(core, 4, temperature=0)):
        core.add_request(f"c{i}", prompts(4)[i], p)
    core.add_request(
        "pen", prompts(5)[4], SamplingParams(max_tokens=8, frequency_penalty=1.0, ignore_eos=True)
    )
    overlapped = ahead = 0
    while core.has_unfinished():
        core.step()
        overlapped += core._inflight is not None
        ahead += core._ahead is not None
    assert overlapped >= 8  # every step but the last leaves its tokens in flight
    assert ahead >= 6  # ... and the next step's forward is launched (launch_ahead)
    stats = pair[1].stats()
    assert stats["free_blocks"] == stats["total_blocks"]


def test_launch_ahead_equals_launch_after_and_survives_aborts(tiny_qwen3):
    # the same constrained + penalty traffic with the next forward launched ahead or not: same
    # tokens; a request aborted while the step holding it was launched ahead leaves no blocks behind
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=64, block_size=16, async_scheduling=True)
    results = []
    for launch_ahead in (True, False):
        core = LLM(tiny_qwen3, launch_ahead=launch_ahead, **kw).core
        for i, p in enumerate(_chain_params(core, 4, temperature=0)):
            core.add_request(f"c{i}", prompts(4)[i], p)
        pen = SamplingParams(temperature=0, max_tokens=8, frequency_penalty=1.0, ignore_eos=True)
        core.add_request("pen", prompts(5)[4], pen)
        core.add_request("gone", prompts(6)[5], pen)
        tokens: dict[str, list[int]] = {}
        steps = 0
        while core.has_unfinished():
            for out in core.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            steps += 1
            if steps == 4:
                assert (core._ahead is not None) == launch_ahead
                core.abort("gone")
        tokens.pop("gone", None)
        results.append(tokens)
        stats = core.stats()
        assert stats["free_blocks"] == stats["total_blocks"] and stats["running"] == 0
    assert results[0] == results[1] and len(results[0]) == 5


def test_steps_whose_graph_samples_give_the_same_tokens(tiny_qwen3):
    """EngineCore's path for decode steps that a CUDA step graph samples (the runner returns the tokens,
    no logits), emulated on the CPU with greedy draws for decode-only batches of up to 4: the tokens,
    stops and block accounting of the synchronous engine, with steps on both paths as batches shrink;
    a batch holding a row that asks for logprobs stays on the sampler's path."""
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=64, block_size=16)
    sync = LLM(tiny_qwen3, async_scheduling=False, **kw)
    llm = LLM(tiny_qwen3, async_scheduling=True, **kw)
    runner = llm.core.runner
    runner.samples_in_graph = lambda batch: batch.num_decodes == len(batch.seqs) <= 4
    execute, taken = runner.execute, []

    def sampled_in_graph(batch, pending=None, temps=None):
        logits, sampling, tokens = execute(batch, pending)
        if temps is None:
            return logits, sampling, tokens
        assert logits is not None and temps.tolist() == [0.0] * len(sampling)
        taken.append(len(sampling))
        return None, sampling, (logits.argmax(dim=-1), None)

    runner.execute = sampled_in_graph
    ps = prompts(7)
    params = [SamplingParams(temperature=0, max_tokens=2 + 4 * i, ignore_eos=True) for i in range(len(ps))]
    want = sync.generate(ps, params)
    got = llm.generate(ps, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert len(taken) > 5 and max(taken) <= 4 and llm.stats()["free_blocks"] == llm.stats()["total_blocks"]
    taken.clear()
    lp = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)] + params[1:3]
    out = llm.generate(ps[:3], lp)
    assert [o.token_ids for o in out] == [o.token_ids for o in sync.generate(ps[:3], lp)]
    assert len(out[0].outputs[0].logprobs) == 6 and len(taken) == 10 - 6  # steps after the logprobs row ends
