"""rms_norm, fused_add_rms_norm, apply_rope, silu_and_mul vs kernels.reference."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.activation import silu_and_mul
from kernels.rmsnorm import fused_add_rms_norm, rms_norm
from kernels.rope import apply_rope
from tests.kernels.paged import gpu, max_err

# max abs error: fp32 differs only by summation order; 16-bit results may differ by one rounding step
ATOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
EPS = 1e-6


def _randn(*shape, dtype, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _check_rms(dtype, device, hidden):
    x = _randn(5, hidden, dtype=dtype, device=device) * 3
    w = _randn(hidden, dtype=dtype, device=device, seed=1)
    res = _randn(5, hidden, dtype=dtype, device=device, seed=2)
    assert max_err(rms_norm(x, w, EPS), ref.rms_norm(x, w, EPS)) < ATOL[dtype]
    exp_out, exp_res = ref.fused_add_rms_norm(x, res, w, EPS)
    xi, ri = x.clone(), res.clone()
    out, new_res = fused_add_rms_norm(xi, ri, w, EPS)
    assert out.data_ptr() == xi.data_ptr() and new_res.data_ptr() == ri.data_ptr()  # in place
    assert max_err(new_res, exp_res) == 0
    assert max_err(out, exp_out) < ATOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [64, 100])
def test_rms_norm(dtype, hidden):
    _check_rms(dtype, "cpu", hidden)


def test_rms_norm_strided_rows_and_promotion():
    x = _randn(4, 96, dtype=torch.float16)[:, :64]  # row stride 96
    w = _randn(64, dtype=torch.float32, seed=1)
    out = rms_norm(x, w, EPS)
    assert out.dtype == torch.float32
    assert max_err(out, ref.rms_norm(x, w, EPS)) < 1e-5


def _check_rope(dtype, device, h, hk, d):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    cos_sin = ref.rope_cos_sin(inv_freq, 64, attention_scaling=1.1).to(device)
    qkv = _randn(7, h + 2 * hk, d, dtype=dtype, device=device)
    q, k = qkv[:, :h], qkv[:, h : h + hk]  # strided views of a fused qkv output
    pos = torch.tensor([0, 1, 5, 63, 2, 2, 40], device=device)
    exp_q, exp_k = ref.apply_rope(q, k, pos, cos_sin)
    v_before = qkv[:, h + hk :].clone()
    out_q, out_k = apply_rope(q, k, pos, cos_sin)
    assert out_q.data_ptr() == q.data_ptr()  # in place
    assert max_err(out_q, exp_q) < ATOL[dtype] and max_err(out_k, exp_k) < ATOL[dtype]
    assert torch.equal(qkv[:, h + hk :], v_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("h", "hk", "d"), [(4, 2, 16), (3, 3, 12)])
def test_rope(dtype, h, hk, d):
    _check_rope(dtype, "cpu", h, hk, d)


def _check_silu(dtype, device, inter):
    x = _randn(3, 2 * inter, dtype=dtype, device=device) * 4
    assert max_err(silu_and_mul(x), ref.silu_and_mul(x)) < ATOL[dtype]
    # a gate_up of the un-normalized residual stream: each row times 1 / rms(h's row) first
    spread = torch.tensor([[0.5], [3.0], [20.0]], dtype=dtype, device=device)
    h = _randn(3, 96, dtype=dtype, device=device, seed=5) * spread
    want = ref.silu_and_mul(ref.row_scaled(x, h, EPS))
    size = max(1.0, float(want.abs().max()))  # outputs up to ~50: the tolerance relative to them
    assert max_err(silu_and_mul(x, row_scale=(h, EPS)), want) < ATOL[dtype] * size
    assert max_err(want, ref.silu_and_mul(x)) > 10 * ATOL[dtype] * size  # the scale matters


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("inter", [32, 300])
def test_silu_and_mul(dtype, inter):
    _check_silu(dtype, "cpu", inter)


def test_launchers_reject_bad_shapes():
    with pytest.raises(ValueError):
        rms_norm(torch.randn(2, 8), torch.randn(7), EPS)
    with pytest.raises(ValueError):
        silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="row_scale"):
        silu_and_mul(torch.randn(2, 8), row_scale=(torch.randn(3, 8), EPS))
    with pytest.raises(ValueError):
        apply_rope(torch.randn(2, 2, 8), torch.randn(2, 1, 8), torch.tensor([0, 1]), torch.randn(4, 8).half())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@gpu
def test_gpu_pointwise(dtype):
    _check_rms(dtype, "cuda", 1024)
    _check_rope(dtype, "cuda", 16, 8, 128)
    _check_silu(dtype, "cuda", 3072)


def _check_qk_norm_rope_store(dtype, device, h, hk, d, with_norm):
    from kernels.qk_norm_rope import qk_norm_rope_store_kv

    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    cos_sin = ref.rope_cos_sin(inv_freq, 64).to(device)
    qkv = _randn(6, h + 2 * hk, d, dtype=dtype, device=device) * 2
    q, k, v = qkv[:, :h], qkv[:, h : h + hk], qkv[:, h + hk :]  # strided views of a fused qkv output
    qw = _randn(d, dtype=dtype, device=device, seed=4) if with_norm else None
    kw = _randn(d, dtype=dtype, device=device, seed=5) if with_norm else None
    pos = torch.tensor([0, 3, 63, 7, 8, 9], device=device)
    slots = torch.tensor([5, -1, 0, 31, 17, -1], device=device)
    caches = [_randn(2, 16, hk, d, dtype=dtype, device=device, seed=s) for s in (6, 7)]
    expect_caches = [c.clone() for c in caches]
    exp_q, exp_k = ref.qk_norm_rope_store_kv(
        q.clone(), k.clone(), v, qw, kw, EPS, pos, cos_sin, *expect_caches, slots
    )
    out_q, out_k = qk_norm_rope_store_kv(q, k, v, qw, kw, EPS, pos, cos_sin, *caches, slots)
    assert out_q.data_ptr() == q.data_ptr()  # in place
    assert max_err(out_q, exp_q) < ATOL[dtype] and max_err(out_k, exp_k) < ATOL[dtype]
    assert max_err(caches[0], expect_caches[0]) < ATOL[dtype]
    assert torch.equal(caches[1], expect_caches[1])  # v is copied as is


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope_store(dtype, with_norm):
    _check_qk_norm_rope_store(dtype, "cpu", 4, 2, 16, with_norm)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@gpu
def test_gpu_qk_norm_rope_store(dtype):
    _check_qk_norm_rope_store(dtype, "cuda", 16, 8, 128, True)
