"""LLM and AsyncEngine load their EngineCore on the thread that steps it (engine.step_thread), and
that thread ends with the engine."""

from __future__ import annotations

import asyncio
import threading

import pytest

import engine.async_engine as async_engine_mod
import engine.llm as llm_mod
from engine import AsyncEngine, EngineConfig, SamplingParams
from engine.step_thread import StepThread


def _recording(monkeypatch, module) -> dict:
    """Records the thread that builds the core and the threads that step it."""
    seen: dict = {"built": None, "stepped": set()}
    real = module.EngineCore

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **k):
            seen["built"] = threading.current_thread().name
            super().__init__(*a, **k)

        def step(self):
            seen["stepped"].add(threading.current_thread().name)
            return super().step()

    monkeypatch.setattr(module, "EngineCore", Recorded)
    return seen


def test_llm_builds_and_steps_on_one_thread(monkeypatch, tiny_qwen3):
    seen = _recording(monkeypatch, llm_mod)
    llm = llm_mod.LLM(str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=32)
    llm.generate([1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0))
    assert seen["built"] == "chatloom-llm" and seen["stepped"] == {"chatloom-llm"}


def test_async_engine_builds_and_steps_on_one_thread(monkeypatch, tiny_qwen3):
    seen = _recording(monkeypatch, async_engine_mod)

    async def run() -> tuple[AsyncEngine, list]:
        config = EngineConfig(model=str(tiny_qwen3), device="cpu", dtype="float32", num_kv_blocks=32)
        eng = AsyncEngine(config)
        await eng.start()
        outs = [o async for o in eng.generate([1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0))]
        await eng.shutdown()
        return eng, outs

    eng, outs = asyncio.run(run())
    assert outs and outs[-1].finish_reason == "length"
    assert seen["built"] == "chatloom-engine" and seen["stepped"] == {"chatloom-engine"}
    assert not eng.running
    eng._worker._thread.join(timeout=5)
    assert not eng._worker._thread.is_alive()  # shut down: its thread is gone


def test_step_thread_runs_in_order_and_raises_to_the_caller():
    class Owner:
        pass

    owner = Owner()
    worker = StepThread("t", owner=owner)
    order: list[int] = []
    for i in range(5):
        worker.submit(order.append, i)
    assert worker.call(lambda: threading.current_thread().name) == "t"
    assert order == [0, 1, 2, 3, 4]
    with pytest.raises(ZeroDivisionError):
        worker.call(lambda: 1 / 0)
    worker.stop()
    worker._thread.join(timeout=5)
    assert not worker._thread.is_alive()
    with pytest.raises(RuntimeError, match="stopped"):  # not a call that would wait for ever
        worker.submit(order.append, 5)


def test_step_thread_stops_when_its_owner_is_collected():
    class Owner:
        pass

    owner = Owner()
    worker = StepThread("t", owner=owner)
    del owner
    worker._thread.join(timeout=5)
    assert not worker._thread.is_alive()
