"""kernels.gemv (decode-sized matmul) vs reference.linear; dispatch.linear's choice of path."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch as ops
from kernels import reference as ref
from kernels.gemv import GemvConfig, gemv, use_gemv
from tests.kernels.paged import gpu

# relative to max |y|: fp32 differs only by summation order; fp16 output rounding is ~5e-4
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _randn(*shape, dtype, device="cpu", seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)


def _check(m, n, k, dtype, device="cpu", bias=False, config=None):
    x = _randn(m, k, dtype=dtype, device=device)
    w = _randn(n, k, dtype=dtype, device=device, seed=1)
    b = _randn(n, dtype=dtype, device=device, seed=2) if bias else None
    expect = ref.linear(x.double(), w.double(), None if b is None else b.double())
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # every element must be written
    got = gemv(x, w, b, config=config, out=out)
    assert got.data_ptr() == out.data_ptr()
    err = (got.double() - expect).abs().max().item() / expect.abs().max().item()
    assert err < RTOL[dtype], (m, n, k, config, err)


# tiny tiles keep the interpreter fast; EVEN (unmasked) and ragged N/K both run
FMA = GemvConfig("fma", 4, 16, 1, 4, 1)
DOT = GemvConfig("dot", 16, 16, 1, 4, 1)
DOT_SPLIT = GemvConfig("dot", 16, 16, 3, 4, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("m", "n", "k", "config"),
    [(1, 32, 64, FMA), (3, 30, 50, FMA), (1, 20, 40, None), (5, 32, 64, DOT), (17, 30, 50, DOT),
     (4, 32, 96, DOT_SPLIT), (2, 20, 70, DOT_SPLIT)],
)  # fmt: skip
def test_gemv(dtype, m, n, k, config):
    _check(m, n, k, dtype, bias=m % 2 == 0, config=config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "n", "k", "config"), [(1, 32, 64, FMA), (3, 30, 50, FMA), (5, 32, 64, DOT)])
def test_gemv_silu_mul(dtype, m, n, k, config):
    gate_up = _randn(m, 2 * k, dtype=dtype, seed=3) * 3
    w = _randn(n, k, dtype=dtype, seed=1)
    expect = ref.linear(ref.silu_and_mul(gate_up).double(), w.double())
    got = gemv(gate_up, w, config=config, silu_mul=True)
    err = (got.double() - expect).abs().max().item() / expect.abs().max().item()
    assert err < RTOL[dtype]


def test_gemv_rejects_bad_inputs():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(ValueError):
        gemv(x, torch.randn(4, 7))
    with pytest.raises(ValueError):
        gemv(x, w.half())
    with pytest.raises(ValueError):
        gemv(x, w, torch.randn(3))
    assert gemv(torch.randn(0, 8), w).shape == (0, 4)


def test_dispatch_linear_falls_back_off_cuda(monkeypatch):
    """Off CUDA: F.linear, or for float32 rows oneDNN's packed product (kernels.onednn), equal up to the
    summation order; with that switched off, F.linear bit for bit."""
    from kernels import onednn

    x, w, b = torch.randn(3, 5, 8), torch.randn(4, 8), torch.randn(4)
    assert torch.equal(ops.linear(x, w, b), torch.nn.functional.linear(x, w, b))  # 3-D: F.linear
    gu = torch.randn(3, 16)
    want = ref.linear(ref.silu_and_mul(gu), w, b)
    torch.testing.assert_close(ops.silu_and_mul_linear(gu, w, b), want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(onednn, "_available", lambda: False)  # no oneDNN: F.linear
    assert torch.equal(ops.silu_and_mul_linear(gu, w, b), want)
    assert use_gemv(1, 4096, 1024) and not use_gemv(0, 4096, 1024) and not use_gemv(4096, 4096, 1024)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@gpu
def test_gpu_gemv_qwen_shapes(dtype):
    for n, k in [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (1000, 1000)]:
        for m in (1, 2, 5, 8, 16, 32, 64):
            _check(m, n, k, dtype, device="cuda", bias=m == 5)


@gpu
def test_gpu_dispatch_linear():
    x = _randn(1, 1024, dtype=torch.bfloat16, device="cuda")
    w = _randn(4096, 1024, dtype=torch.bfloat16, device="cuda", seed=1)
    expect = torch.nn.functional.linear(x.float(), w.float())
    assert (ops.linear(x, w).float() - expect).abs().max().item() < 1e-2 * expect.abs().max().item()
    gu = _randn(1, 6144, dtype=torch.bfloat16, device="cuda", seed=2)
    wd = _randn(1024, 3072, dtype=torch.bfloat16, device="cuda", seed=3)
    expect = torch.nn.functional.linear(ref.silu_and_mul(gu).float(), wd.float())
    got = ops.silu_and_mul_linear(gu, wd)
    assert (got.float() - expect).abs().max().item() < 1e-2 * expect.abs().max().item()
    x32, w32 = x.float(), w.float()  # fp32 stays on cuBLAS: bit-equal to F.linear
    assert torch.equal(ops.linear(x32, w32), torch.nn.functional.linear(x32, w32))
