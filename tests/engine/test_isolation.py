"""Per-request fault isolation on the tiny Qwen3 checkpoint (CPU, float32): a request whose grammar
mask, token acceptance or sampling raises ends alone with finish_reason "error" and a message, while
the other requests of the same batch finish with the tokens they get alone; a step that fails as a
whole ends only the requests in it."""

from __future__ import annotations

import asyncio

import pytest

from engine import LLM, AsyncEngine, EngineConfig, SamplingParams
from engine.async_engine import GenerationError


class _AllowAll:
    """A constraint that allows every token; `fail` names the call that raises, after `after` calls."""

    def __init__(self, fail: str | None = None, after: int = 0) -> None:
        self.fail, self.after, self.calls = fail, after, 0

    def _maybe_fail(self, what: str) -> None:
        if self.fail == what:
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError(f"{what} exploded")

    def fill_bitmask(self, bitmask, row: int, remaining_tokens: int) -> None:
        self._maybe_fail("fill_bitmask")  # the row stays all-allowed (-1) otherwise

    def accept_token(self, token_id: int) -> bool:
        self._maybe_fail("accept_token")
        return True

    def is_terminated(self) -> bool:
        return False


class _Grouped(_AllowAll):
    """The same, filled through a shared group filler (as grammar.constraint does) that raises when
    any of its rows would."""

    @staticmethod
    def fill_bitmasks(bitmask, rows) -> None:
        for c, row, budget in rows:
            c.fill_bitmask(bitmask, row, budget)


class _Factory:
    def __init__(self, kind=_AllowAll, **kw) -> None:
        self.kind, self.kw = kind, kw

    def ready(self) -> bool:
        return True

    def new(self):
        return self.kind(**self.kw)


def greedy(max_tokens: int = 10, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def prompt(seed: int, n: int = 30) -> list[int]:
    return [(seed * 7919 + i * 104729) % 150000 for i in range(n)]


@pytest.fixture(scope="module")
def shared_engine(tiny_qwen3):
    eng = AsyncEngine(EngineConfig(model=str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=256))
    yield eng
    asyncio.run(eng.shutdown())


@pytest.fixture
async def engine(shared_engine):
    await shared_engine.start()
    yield shared_engine
    s = shared_engine.stats()
    for _ in range(2000):
        if s["running"] == s["waiting"] == 0 and s["free_blocks"] == s["total_blocks"]:
            break
        await asyncio.sleep(0.01)
        s = shared_engine.stats()
    assert s["free_blocks"] == s["total_blocks"], s


async def run(eng, p, params, rid):
    """(token ids, finish reason) of sample 0, or the GenerationError that ended the request."""
    tokens, reason = [], None
    try:
        async for out in eng.generate(p, params, request_id=rid):
            tokens += out.new_token_ids
            reason = out.finish_reason
    except GenerationError as exc:
        return exc
    return tokens, reason


def _bad(kind: str) -> SamplingParams:
    if kind == "sampling":
        params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=30, ignore_eos=True)
        params.min_p = "broken"  # set past validation: the sampler raises on this row alone
        return params
    cls = _Grouped if kind.startswith("grouped") else _AllowAll
    fail = "accept_token" if kind.endswith("accept") else "fill_bitmask"
    return greedy(30, constraint=_Factory(cls, fail=fail, after=2))


@pytest.mark.parametrize("kind", ["fill", "accept", "grouped_fill", "sampling"])
async def test_a_failing_request_ends_alone_the_others_finish(engine, kind):
    good = [greedy(12 + 2 * i) for i in range(3)]
    if kind.startswith("grouped"):  # the good rows share the failing row's group filler
        good = [greedy(12 + 2 * i, constraint=_Factory(_Grouped)) for i in range(3)]
    alone = [await run(engine, prompt(i), good[i], f"alone-{kind}-{i}") for i in range(3)]
    results = await asyncio.gather(
        *(run(engine, prompt(i), good[i], f"good-{kind}-{i}") for i in range(3)),
        run(engine, prompt(9), _bad(kind), f"bad-{kind}"),
    )
    assert results[:3] == alone
    assert [r[1] for r in alone] == ["length"] * 3 and [len(r[0]) for r in alone] == [12, 14, 16]
    err = results[3]
    assert isinstance(err, GenerationError)
    mask = "computing its grammar mask: RuntimeError: fill_bitmask exploded"
    expected = {
        "fill": mask,
        "grouped_fill": mask,
        "accept": "accepting token",
        "sampling": "while sampling: TypeError",
    }
    assert expected[kind] in str(err)
    # the engine goes on serving
    assert await run(engine, prompt(1), greedy(4), f"after-{kind}") == (alone[1][0][:4], "length")


async def test_the_error_output_carries_the_message(tiny_qwen3):
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=64)
    core = llm.core
    core.add_request("ok", prompt(1), greedy(5))
    core.add_request("bad", prompt(2), greedy(5, constraint=_Factory(fail="fill_bitmask")))
    outs = []
    while core.has_unfinished():
        outs += core.step()
    bad = [o for o in outs if o.request_id == "bad"]
    assert [o.finish_reason for o in bad] == ["error"]
    assert "computing its grammar mask" in bad[0].error and "fill_bitmask exploded" in bad[0].error
    ok = [o for o in outs if o.request_id == "ok"]
    assert ok[-1].finish_reason == "length" and sum(len(o.new_token_ids) for o in ok) == 5
    assert core.stats()["free_blocks"] == core.stats()["total_blocks"]


def test_a_step_failing_as_a_whole_ends_only_the_requests_in_it(tiny_qwen3):
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=2)
    core = llm.core
    for i in range(3):
        core.add_request(f"r{i}", prompt(i), greedy(4))
    real = core.runner.execute
    calls = []

    def failing(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("forward failed")
        return real(*args, **kw)

    core.runner.execute = failing
    with pytest.raises(RuntimeError, match="forward failed"):
        core.step()
    assert sorted(core.abort_step()) == ["r0", "r1"]  # only two seats: r2 was still waiting
    assert list(core.requests) == ["r2"]
    outs = []
    while core.has_unfinished():
        outs += core.step()
    assert outs[-1].request_id == "r2" and outs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outs) == 4
    assert core.stats()["free_blocks"] == core.stats()["total_blocks"]
