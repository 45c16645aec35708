"""kernels.decode_tail (o projection, norm + gate_up, SiLU + down, next norm + qkv in one launch) vs
reference.decode_layer_tail. The interpreter runs one launch per stage; the GPU tests check the one
launch with grid barriers, which must give the same bits as the staged launches."""

from __future__ import annotations

import pytest
import torch

from kernels import decode_tail
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
@pytest.mark.parametrize("has_next", [True, False])
def test_decode_tail_gpu_l2_prefetch_changes_nothing(has_next, monkeypatch):
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", bias=False, has_next=has_next)
    plain = _check(1, w, torch.bfloat16, device="cuda", fused=True)
    monkeypatch.setattr(decode_tail, "L2_PREFETCH", True)
    fetched = _check(1, w, torch.bfloat16, device="cuda", fused=True)
    for x, y in zip(plain, fetched, strict=True):
        assert torch.equal(x, y)


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


def _layer_case(dtype, ctx: int, device="cpu", bias=False, has_next=True):
    from tests.kernels.test_decode_fused import _case

    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _case(dtype, [ctx], device=device)
    w = _weights(48, q.shape[1] * q.shape[2], 40, 128, dtype, device=device, bias=bias, has_next=has_next)
    res = _randn(1, 48, dtype=dtype, device=device, seed=2) * 4
    return (q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots), w, res


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("ctx", "has_next"), [(300, True), (23, False)])
def test_decode_layer_matches_attention_then_tail(dtype, ctx, has_next):
    """Stage 0 (the fused decode attention, its programs' work spread over the tail's grid: 4 splits of 2
    KV heads over 4 programs at ctx 300) then the tail, against paged_decode_attention + the reference
    tail; the new K/V lands in the cache the same way."""
    from kernels.decode_tail import decode_layer
    from kernels.paged_attention import NewTokenQK
    from tests.kernels.test_decode_fused import SCALE, _fused

    case, w, res = _layer_case(dtype, ctx, has_next=has_next)
    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = case
    attn, kc_want, vc_want = _fused(*case, max_seq_len=512)
    want, want_res = ref.decode_layer_tail(attn.reshape(1, -1), res, w)
    kc_got, vc_got = kc.clone(), vc.clone()
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
    got, got_res = decode_layer(q, kc_got, vc_got, bt, sl, SCALE, nt, res, w, max_seq_len=512)
    _close(got, want, dtype, "out")
    _close(got_res, want_res, dtype, "residual")
    assert torch.equal(kc_got, kc_want) and torch.equal(vc_got, vc_want)


@gpu
@pytest.mark.parametrize("has_next", [True, False])
def test_decode_layer_gpu_one_launch_equals_staged(has_next):
    from kernels.decode_tail import decode_layer
    from kernels.paged_attention import NewTokenQK
    from tests.kernels.test_decode_fused import SCALE, _case

    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _case(torch.bfloat16, [700], "cuda", h=16, hk=8,
                                                            d=128)  # fmt: skip
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", has_next=has_next)
    res = _randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=2)
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
    outs = []
    for fused in (True, False):
        kc2, vc2 = kc.clone(), vc.clone()
        outs.append((*decode_layer(q, kc2, vc2, bt, sl, SCALE, nt, res, w, max_seq_len=4096, fused=fused),
                     kc2, vc2))  # fmt: skip
    for x, y in zip(*outs, strict=True):  # same programs, same order: the same bits
        assert torch.equal(x, y)


def test_dispatch_leaves_cpu_tensors_to_the_attention_then_the_tail(monkeypatch):
    from kernels import dispatch

    case, w, res = _layer_case(torch.float32, 40)
    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = case
    qkv = torch.cat([q.reshape(1, -1), k.reshape(1, -1), v.reshape(1, -1)], dim=-1)
    args = (qkv, 4, 2, 16, wq, wk, 1e-6, pos, cs, (kc, vc), slots, bt, sl, None, 0.25, None, res, w)
    monkeypatch.setattr(dispatch, "DECODE_LAYER", True)
    assert dispatch.decode_layer(*args) is None  # CPU tensors: the attention and the tail run apart
