"""kernels.decode_tail (o projection, norm + gate_up, SiLU + down, next norm + qkv in one launch) vs
reference.decode_layer_tail. The interpreter runs one launch per stage; the GPU tests check the one
launch with grid barriers, which must give the same bits as the staged launches."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.decode_tail import TailConfig, decode_layer_tail
from tests.kernels.paged import gpu
from tests.kernels.test_gemv import _randn

# relative to max |expected|: the reference rounds its intermediates in the dtype too, so only the
# summation order differs (and, in 16 bits, one rounding of an intermediate may flip)
RTOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _weights(h, a, inter, nq, dtype, device="cpu", bias=False, has_next=True):
    rnd = lambda *shape, seed: _randn(*shape, dtype=dtype, device=device, seed=seed) * shape[-1] ** -0.5
    norm = lambda seed: (1 + 0.2 * _randn(h, dtype=torch.float32, seed=seed)).to(dtype).to(device)
    bias_of = lambda n, seed: _randn(n, dtype=dtype, device=device, seed=seed) * 0.1 if bias else None
    return ref.TailWeights(
        rnd(h, a, seed=10), bias_of(h, 11), norm(12), 1e-6, rnd(2 * inter, h, seed=13),
        bias_of(2 * inter, 14), rnd(h, inter, seed=15), bias_of(h, 16), norm(17) if has_next else None, 1e-5,
        rnd(nq, h, seed=18) if has_next else None, bias_of(nq, 19) if has_next else None,
    )  # fmt: skip


def _close(got, expect, dtype, what):
    err = (got.double() - expect.double()).abs().max().item() / expect.double().abs().max().item()
    assert err < RTOL[dtype], (what, err)


def _check(m, w, dtype, device="cpu", **kwargs):
    a = _randn(m, w.o.shape[1], dtype=dtype, device=device, seed=1)
    res = _randn(m, w.o.shape[0], dtype=dtype, device=device, seed=2) * 4
    a0, res0 = a.clone(), res.clone()
    expect, expect_res = ref.decode_layer_tail(a, res, w)
    got, got_res = decode_layer_tail(a, res, w, **kwargs)
    assert got.shape == expect.shape and got_res.shape == expect_res.shape
    _close(got, expect, dtype, "out")
    _close(got_res, expect_res, dtype, "residual")
    assert torch.equal(a, a0) and torch.equal(res, res0)  # the inputs are not modified
    return got, got_res


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "bias", "has_next"), [(1, False, True), (3, True, True), (1, True, False),
                                                     (2, False, False)])  # fmt: skip
def test_decode_tail_matches_reference(dtype, m, bias, has_next):
    # A = 96 and I = 80 are ragged against their power-of-two tiles; 4 programs own 16-40 rows each
    w = _weights(64, 96, 80, 160, dtype, bias=bias, has_next=has_next)
    _check(m, w, dtype)


def test_decode_tail_one_program_and_more_programs_than_tasks():
    w = _weights(32, 32, 48, 64, torch.float32)
    out1 = _check(1, w, torch.float32, config=TailConfig(1, 4))  # one program holds every row
    out2 = _check(1, w, torch.float32, config=TailConfig(40, 4))  # one row each, some programs idle
    for x, y in zip(out1, out2, strict=True):
        _close(x, y, torch.float32, "configs")


def test_decode_tail_rejects_what_it_cannot_run():
    w = _weights(32, 32, 48, 64, torch.float32)
    a, res = torch.zeros(1, 32), torch.zeros(1, 32)
    with pytest.raises(ValueError, match="grid barrier"):
        decode_layer_tail(a, res, w, fused=True)  # the interpreter cannot run the barriers
    with pytest.raises(ValueError, match="rows"):
        decode_layer_tail(torch.zeros(9, 32), torch.zeros(9, 32), w)
    with pytest.raises(ValueError, match="shapes"):
        decode_layer_tail(torch.zeros(1, 16), res, w)
    with pytest.raises(ValueError, match="dtype"):
        decode_layer_tail(a.half(), res.half(), w)


def test_decode_tail_trace_needs_the_one_launch():
    w = _weights(32, 32, 48, 64, torch.float32)
    trace = torch.zeros(8, 12, dtype=torch.int64)
    with pytest.raises(ValueError, match="trace"):  # the interpreter runs the stages as launches
        decode_layer_tail(torch.zeros(1, 32), torch.zeros(1, 32), w, trace=trace)


def test_decode_tail_trace_needs_a_row_per_program():
    """The one launch as compiled for the H200 (recorded, not run: 132 SMs x 2 programs) refuses a trace
    with too few rows or the wrong number of points, which its programs would write past."""
    from kernels._jit import record_launches
    from kernels.decode_tail import TRACE_POINTS

    w = _weights(32, 32, 48, 64, torch.float16)
    a, res = torch.zeros(1, 32, dtype=torch.float16), torch.zeros(1, 32, dtype=torch.float16)
    with record_launches() as launches:
        for shape in ((8, TRACE_POINTS.value), (264, TRACE_POINTS.value - 1)):
            with pytest.raises(ValueError, match="trace"):
                decode_layer_tail(a, res, w, trace=torch.zeros(shape, dtype=torch.int64))
        assert not launches
        decode_layer_tail(a, res, w, trace=torch.zeros((264, TRACE_POINTS.value), dtype=torch.int64))
    ((_, grid, _, kwargs),) = launches
    assert grid == (264,) and kwargs["TRACE"]


QWEN3_06B = (1024, 2048, 3072, 4096)  # hidden, attention width, intermediate, qkv


@gpu
@pytest.mark.parametrize("has_next", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_decode_tail_gpu_barriers_equal_staged_launches(bias, has_next):
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", bias=bias, has_next=has_next)
    fused = _check(1, w, torch.bfloat16, device="cuda", fused=True)
    staged = _check(1, w, torch.bfloat16, device="cuda", fused=False)
    for x, y in zip(fused, staged, strict=True):  # same tiles, same order: the same bits
        assert torch.equal(x, y)


@gpu
def test_decode_tail_gpu_back_to_back_launches():
    """200 one-launch tails queued back to back on new inputs (each launch must find the barrier counters
    zeroed by the one before) equal the staged launches."""
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    inputs = [_randn(1, 2048, dtype=torch.bfloat16, device="cuda", seed=s) for s in range(200)]
    res = _randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=2)
    fused = [decode_layer_tail(a, res, w) for a in inputs]
    for a, (out, out_res) in zip(inputs, fused, strict=True):
        expect, expect_res = decode_layer_tail(a, res, w, fused=False)
        assert torch.equal(out, expect) and torch.equal(out_res, expect_res)


@gpu
def test_decode_tail_gpu_staged_takes_small_batches():
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", bias=True)
    _check(3, w, torch.bfloat16, device="cuda", fused=False)
    with pytest.raises(ValueError, match="row"):
        _check(3, w, torch.bfloat16, device="cuda", fused=True)


@gpu
def test_decode_tail_gpu_cuda_graph_replays():
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    a = _randn(1, 2048, dtype=torch.bfloat16, device="cuda", seed=1)
    res = _randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=2)
    decode_layer_tail(a, res, w)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, out_res = decode_layer_tail(a, res, w)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (3, 4, 5):  # new inputs each replay; the barrier counters must come back zeroed
        a.copy_(_randn(1, 2048, dtype=torch.bfloat16, device="cuda", seed=seed))
        graph.replay()
        expect, expect_res = decode_layer_tail(a, res, w, fused=False)
        assert torch.equal(out, expect) and torch.equal(out_res, expect_res)


def test_decode_tail_takes_only_what_fits_in_registers():
    from kernels.decode_tail import fits

    cpu = torch.device("cpu")  # planned for the H200's 132 SMs
    small = _weights(*QWEN3_06B, torch.bfloat16)
    assert fits(1, torch.bfloat16, small, cpu)
    assert not fits(2, torch.bfloat16, small, cpu)  # the engine's batch 1 only
    assert not fits(1, torch.float32, _weights(*QWEN3_06B, torch.float32), cpu)  # fp32 stays per op
    # an 8B shape: a program's gate_up rows (28672 / 264 -> 128 x 4096) cannot sit in registers
    e = lambda *shape: torch.empty(*shape, dtype=torch.bfloat16)
    big = ref.TailWeights(e(4096, 4096), None, e(4096), 1e-6, e(28672, 4096), None, e(4096, 14336), None,
                          e(4096), 1e-6, e(6144, 4096), None)  # fmt: skip
    assert not fits(1, torch.bfloat16, big, cpu)


@gpu
def test_decode_tail_gpu_trace():
    """The traced launch (bench.tail_timeline) gives the same bits; every program's points are in order,
    and no program leaves a barrier before every program has ended the stage before it."""
    from kernels.decode_tail import TRACE_POINTS

    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    a = _randn(1, 2048, dtype=torch.bfloat16, device="cuda", seed=1)
    res = _randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=2)
    trace = torch.zeros((4096, TRACE_POINTS.value), dtype=torch.int64, device="cuda")
    got = decode_layer_tail(a, res, w, trace=trace)
    expect = decode_layer_tail(a, res, w, fused=False)
    assert all(torch.equal(x, y) for x, y in zip(got, expect, strict=True))
    t = trace[trace[:, 0] > 0].cpu()
    assert t.shape[0] >= torch.cuda.get_device_properties(0).multi_processor_count
    assert bool((t.diff(dim=1) >= 0).all())
    for end, leave in ((2, 3), (5, 6), (8, 9)):  # stage end, barrier exit
        assert int(t[:, leave].min()) >= int(t[:, end].max())
