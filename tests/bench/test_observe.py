"""bench.observe.NewKernels: the Triton kernel variants first met inside a timed block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bench.observe import NewKernels

knobs = pytest.importorskip("triton").knobs


def _first_met(name: str):  # what Triton calls before compiling (or loading) a new variant
    return knobs.runtime.jit_cache_hook(key=name, repr="", fn=SimpleNamespace(name=name), compile={},
                                        is_manual_warmup=False, already_compiled=False)  # fmt: skip


def test_records_new_variants_and_restores_the_previous_hook():
    seen = []
    previous = lambda **kw: seen.append(kw["key"])
    knobs.runtime.jit_cache_hook = previous
    try:
        with NewKernels() as new:
            _first_met("_decode_kernel")
            _first_met("_decode_kernel")
            _first_met("_gemv_fma_kernel")
        assert knobs.runtime.jit_cache_hook is previous  # put back
        assert seen == ["_decode_kernel", "_decode_kernel", "_gemv_fma_kernel"]  # chained, not replaced
        assert new.summary().endswith(": 3 (_decode_kernel x2, _gemv_fma_kernel)")
    finally:
        knobs.runtime.jit_cache_hook = None


def test_an_empty_block_reports_zero():
    with NewKernels() as new:
        pass
    assert new.summary().endswith(": 0")
    assert NewKernels().summary().endswith("not recorded (this Triton has no jit_cache_hook)")


class _FakeEvent:
    """A CUDA event on a fake clock: record() stamps the clock's time in microseconds."""

    clock = [0.0]

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = None

    def record(self) -> None:
        self.t = _FakeEvent.clock[0]

    def elapsed_time(self, other) -> float:  # milliseconds, as torch's
        return (other.t - self.t) / 1e3


def test_gpu_gaps_marks_each_part_of_a_step(monkeypatch):
    import torch

    from bench.observe import GpuGaps
    from bench.step_timers import StepTimers

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    tick = lambda us: lambda *a, **k: _FakeEvent.clock.__setitem__(0, _FakeEvent.clock[0] + us)
    graph = SimpleNamespace(replay=tick(100))
    runner = SimpleNamespace(
        prepare=tick(5),
        graphs=SimpleNamespace(graphs={1: (graph, None)}),
        extend_graphs=None,
        batch_graphs=None,
    )
    runner.run = lambda *a: (tick(10)(), graph.replay())
    runner.run_sampled = lambda *a: (tick(10)(), graph.replay())
    sample = tick(20)
    core = SimpleNamespace(runner=runner, sampler=SimpleNamespace(sample=sample), _launched=tick(3))
    timers = StepTimers()
    gaps = GpuGaps(core, timers)
    for _ in range(2):  # a step as the engine orders it: prepare the next, sample, tokens, forward
        core.runner.prepare()
        core.sampler.sample()
        core._launched()
        core.runner.run()
    kinds = [k for k, _ in gaps.marks]
    assert kinds[:6] == ["prepared", "sampled", "tokens", "forward", "replay", "forward end"]
    spans = {}
    for (a, ea), (b, eb) in zip(gaps.marks, gaps.marks[1:], strict=False):
        spans.setdefault(f"{a} -> {b}", []).append(ea.elapsed_time(eb) * 1e3)
    assert spans["forward -> replay"] == [10, 10]  # the work before the graph's replay
    assert spans["replay -> forward end"] == [100, 100]
    assert spans["prepared -> sampled"] == [20, 20] and spans["sampled -> tokens"] == [3, 3]
    timers.restore()
    assert core.sampler.sample is sample and len(gaps.marks) == 12  # unwrapped; six marks a step
    # a step graph's replay (forward and sampling) is marked from its launch to its tokens
    core.runner.run_sampled()
    assert len(gaps.marks) == 12  # restored: no marks
    gaps = GpuGaps(core, timers)
    core.runner.run_sampled()
    assert [k for k, _ in gaps.marks] == ["forward", "replay", "sampled"]
    timers.restore()


def test_kernel_gaps_bins_idle_time_and_names_the_kernel_after_each_gap():
    from bench.observe import kernel_gaps

    us = 1000  # ns
    spans = [
        (0, 10 * us, "gemm"),
        (11_500, 20 * us, "norm"),  # 1.5 us after gemm
        (15 * us, 18 * us, "overlap"),  # inside norm: no gap
        (23 * us, 30 * us, "attn"),  # 3 us
        (33 * us, 40 * us, "norm"),  # 3 us
        (540 * us, 550 * us, "gemm"),  # 500 us: the host's, not a launch gap
    ]
    text = kernel_gaps(spans)
    assert "6 kernels over 0.6 ms" in text
    assert "busy 0.0 ms (8%)" in text  # 10 + 8.5 + 7 + 7 + 10 = 42.5 us of 550
    assert "1-2 us: 1 gaps 0.0 ms" in text and "2-5 us: 2 gaps 0.0 ms" in text
    assert ">=100 us: 1 gaps 0.5 ms" in text
    by_name = text.split("by the kernel after them: ")[1]
    assert by_name.index("before norm") < by_name.index("before attn")  # 4.5 us before norm, 3 before attn
    assert "before gemm" not in by_name  # its only gap is the host's
    assert kernel_gaps([]) == "kernel gaps: no kernel spans recorded"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message is for machines without CUDA")
def test_trace_without_a_gpu_says_it_wrote_nothing(tmp_path, capsys):
    from bench.observe import Profile

    path = tmp_path / "trace.json"
    prof = Profile(enabled=False, trace=str(path))  # a trace asked for turns the profile on
    assert prof.enabled
    with prof:
        sum(range(100))
    prof.report(0.01, 1)
    assert f"{path} not written" in capsys.readouterr().out and not path.exists()
