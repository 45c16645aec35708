"""kernels.decode_tail_tma (the batch-1 layer tail with its weights copied into shared memory by TMA) vs
reference.decode_layer_tail and vs kernels.decode_tail. Gluon has no interpreter: on the CPU its plan is
checked here and the kernel compiled for sm_90 (tests/kernels/compile_sm90.py); the GPU tests run it."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch as ops
from kernels import dispatch_linear
from kernels import reference as ref
from tests.kernels.paged import capture, gpu
from tests.kernels.test_decode_tail import QWEN3_06B, _close, _weights
from tests.kernels.test_gemv import _randn

tma = pytest.importorskip("kernels.decode_tail_tma")
tma_plan = pytest.importorskip("kernels.decode_tail_tma_plan")


def test_plan_splits_the_qwen3_shapes_into_boxes():
    p = tma_plan.plan(1024, 2048, 3072, 4096, 132)
    assert p.programs == 128 and p.r1 == 8
    assert p.gu == (3, 16) and p.down == (8, 3, 4) and p.qkv == (1, 32)
    assert p.shared == 2 * 1024 * (48 + 8 * 3 + 32) and p.shared + 4096 <= tma_plan.SHARED_LIMIT
    assert tma_plan.plan(1024, 2048, 3072, None, 132).qkv == (0, 1)  # the last layer: no next qkv


def test_plan_aliases_the_next_qkv_into_gate_up_buffers():
    """TmaPlan.alias: the next qkv's 32 rows a program as two boxes of gate_up's height, in gate_up's three
    buffers, so the copies take 64 KB less shared memory (room for a decode attention program beside)."""
    p = tma_plan.plan(1024, 2048, 3072, 4096, 132, alias=True)
    assert p.alias and p.gu == (3, 16) and p.qkv == (2, 16)
    apart = tma_plan.plan(1024, 2048, 3072, 4096, 132)
    assert p.shared == 2 * 1024 * (48 + 8 * 3) == apart.shared - 2 * 1024 * 32
    assert not tma_plan.plan(1024, 2048, 3072, None, 132, alias=True).alias  # no next qkv: nothing to alias
    # next-qkv rows that are not whole gate_up boxes: separate buffers
    small = tma_plan.plan(1024, 2048, 3072, 1024, 132, alias=True)
    assert small is not None and not small.alias and small.qkv == (1, 8)
    w = _weights(*QWEN3_06B, torch.bfloat16)
    assert tma_plan._plan_for(w, torch.device("cpu")).alias  # the engine's plan


def test_plan_refuses_what_does_not_divide_or_fit():
    assert tma_plan.plan(1000, 2048, 3072, 4096, 132) is None  # H not whole chunks
    assert tma_plan.plan(1024, 2048, 3000, 4096, 132) is None  # I not whole chunks
    assert tma_plan.plan(2048, 4096, 8192, 6144, 132) is None  # slices past the shared memory
    assert tma_plan.plan(1024, 2048, 3072, 4096 + 64, 132) is None  # next qkv rows do not divide


def test_fits_only_cuda_batch_one_without_biases():
    w = _weights(*QWEN3_06B, torch.bfloat16)
    assert not tma.fits(1, torch.bfloat16, w, torch.device("cpu"))
    with_bias = w._replace(o_bias=torch.zeros(1024, dtype=torch.bfloat16))
    assert not tma.fits(1, torch.bfloat16, with_bias, torch.device("cuda"))
    assert not tma.fits(2, torch.bfloat16, w, torch.device("cuda"))
    assert not tma.fits(1, torch.float32, w, torch.device("cuda"))


def test_dispatch_takes_the_cpu_ops_without_cuda():
    w = _weights(64, 96, 80, 160, torch.float32)
    a, res = _randn(1, 96, dtype=torch.float32, seed=1), _randn(1, 64, dtype=torch.float32, seed=2)
    assert dispatch_linear._tail_tma(a, w) is None
    got, got_res = ops.decode_layer_tail(a, res.clone(), w)
    expect, expect_res = ref.decode_layer_tail(a, res, w)
    _close(got, expect, torch.float32, "out")
    _close(got_res, expect_res, torch.float32, "residual")


def _inputs(seed=1):
    a = _randn(1, 2048, dtype=torch.bfloat16, device="cuda", seed=seed)
    return a, _randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=2) * 4


@gpu
@pytest.mark.parametrize("has_next", [True, False])
def test_gpu_matches_reference_and_the_register_tail(has_next):
    from kernels.decode_tail import decode_layer_tail as register_tail

    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", has_next=has_next)
    assert tma.fits(1, torch.bfloat16, w, torch.device("cuda"))
    a, res = _inputs()
    a0, res0 = a.clone(), res.clone()
    got, got_res = tma.decode_layer_tail(a, res, w)
    expect, expect_res = ref.decode_layer_tail(a, res, w)
    _close(got, expect, torch.bfloat16, "out")
    _close(got_res, expect_res, torch.bfloat16, "residual")
    assert torch.equal(a, a0) and torch.equal(res, res0)
    other, other_res = register_tail(a, res, w)  # the same rounding points, another summation order
    _close(got, other, torch.bfloat16, "out vs decode_tail")
    _close(got_res, other_res, torch.bfloat16, "residual vs decode_tail")


@gpu
def test_gpu_back_to_back_launches_and_graph_replays():
    """200 launches queued back to back on new inputs (each must find the counters zeroed and its
    mbarriers fresh), then a CUDA graph replayed on new inputs, each against a lone launch."""
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    res = _inputs()[1]
    inputs = [_inputs(seed)[0] for seed in range(200)]
    outs = [tma.decode_layer_tail(a, res, w) for a in inputs]
    for a, (out, out_res) in zip(inputs, outs, strict=True):
        expect, expect_res = ref.decode_layer_tail(a, res, w)
        _close(out, expect, torch.bfloat16, "out")
        _close(out_res, expect_res, torch.bfloat16, "residual")
    alone = [tma.decode_layer_tail(a, res, w) for a in inputs[:3]]
    for (x, y), (x1, y1) in zip(alone, outs[:3], strict=True):  # deterministic: the same bits
        assert torch.equal(x, x1) and torch.equal(y, y1)
    a = inputs[0].clone()
    graph, (out, out_res) = capture(lambda: tma.decode_layer_tail(a, res, w))
    for seed in (3, 4, 5):
        a.copy_(inputs[seed])
        graph.replay()
        expect, expect_res = tma.decode_layer_tail(inputs[seed], res, w)
        assert torch.equal(out, expect) and torch.equal(out_res, expect_res)


@gpu
def test_gpu_dispatch_takes_it_at_batch_one():
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    a, res = _inputs()
    assert dispatch_linear._tail_tma(a, w) is tma
    assert dispatch_linear._tail_tma(torch.cat([a, a]), w) is None
    got, got_res = ops.decode_layer_tail(a, res, w)
    expect, expect_res = tma.decode_layer_tail(a, res, w)
    assert torch.equal(got, expect) and torch.equal(got_res, expect_res)
