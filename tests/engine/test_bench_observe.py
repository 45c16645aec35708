"""engine.bench_observe.NewKernels: the Triton kernel variants first met inside a timed block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.bench_observe import NewKernels

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
