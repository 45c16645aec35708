"""kernels.gemv_norm.add_rms_norm_gemv ((residual add +) RMSNorm folded into the GEMV) vs
reference.add_rms_norm_linear; dispatch.add_rms_norm_linear's choice of path."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch as ops
from kernels import reference as ref
from kernels.gemv import GemvConfig
from kernels.gemv_norm import add_rms_norm_gemv
from tests.kernels.paged import gpu
from tests.kernels.test_gemv import RTOL, _randn

EPS = 1e-6
FMA = GemvConfig("fma", 4, 16, 1, 4, 1)  # tiny tiles keep the interpreter fast
DOT = GemvConfig("dot", 16, 16, 1, 4, 1)


def _inputs(m, n, k, dtype, device="cpu", residual=True, bias=False):
    x = _randn(m, k, dtype=dtype, device=device)
    res = _randn(m, k, dtype=dtype, device=device, seed=4) * 4 if residual else None
    nw = (1 + 0.2 * _randn(k, dtype=torch.float32, seed=5)).to(dtype).to(device)
    w = _randn(n, k, dtype=dtype, device=device, seed=1)
    b = _randn(n, dtype=dtype, device=device, seed=2) if bias else None
    return x, res, nw, w, b


def _check(x, res, nw, w, b, config=None):
    m, n = x.shape[0], w.shape[0]
    x0, res0 = x.clone(), None if res is None else res.clone()
    # the reference norm in the dtype (its rounding), then the product in float64
    h, expect_res = (ref.rms_norm(x, nw, EPS), x) if res is None else ref.fused_add_rms_norm(x, res, nw, EPS)
    expect = ref.linear(h.double(), w.double(), None if b is None else b.double())
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=x.device)  # every element must be written
    got, got_res = add_rms_norm_gemv(x, res, nw, EPS, w, b, config=config, out=out)
    assert got.data_ptr() == out.data_ptr()
    err = (got.double() - expect).abs().max().item() / expect.abs().max().item()
    assert err < RTOL[x.dtype], (tuple(w.shape), m, config, err)
    assert torch.equal(got_res, expect_res)
    assert torch.equal(got_res, ref.add_rms_norm_linear(x0, res0, nw, EPS, w, b)[1])
    assert torch.equal(x, x0) and (res is None or torch.equal(res, res0))  # the inputs are not modified
    if res is None:
        assert got_res is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", range(1, 9))
def test_add_rms_norm_gemv(dtype, m):
    # K = 50: ragged against BLOCK_K = 16; residual and bias in every combination over m
    x, res, nw, w, b = _inputs(m, 30, 50, dtype, residual=m % 2 == 1, bias=m % 4 < 2)
    _check(x, res, nw, w, b, config=FMA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("m", "n", "k", "residual", "bias"), [(1, 8, 1500, True, False), (2, 12, 1100, False, True)]
)
def test_add_rms_norm_gemv_long_rows(dtype, m, n, k, residual, bias):
    # several (ragged) steps of the sum-of-squares pass: its tile is 2048 elements over all rows
    _check(*_inputs(m, n, k, dtype, residual=residual, bias=bias), config=FMA)


@pytest.mark.parametrize("residual", [True, False])
def test_add_rms_norm_gemv_auto_config_and_even(residual):
    # the launcher's own config (interpreter tiles), and an EVEN shape (no masks on W)
    _check(*_inputs(3, 20, 40, torch.float16, residual=residual, bias=True))
    _check(*_inputs(1, 16, 64, torch.float32, residual=residual), config=FMA)


def test_add_rms_norm_gemv_dot_path_runs_unfused():
    _check(*_inputs(5, 32, 48, torch.float32, bias=True), config=DOT)
    _check(*_inputs(5, 32, 48, torch.float32, residual=False), config=DOT)


def test_add_rms_norm_gemv_rejects_bad_inputs():
    x, res, nw, w, _ = _inputs(2, 4, 8, torch.float32)
    with pytest.raises(ValueError):
        add_rms_norm_gemv(x, res[:1], nw, EPS, w)
    with pytest.raises(ValueError):
        add_rms_norm_gemv(x, res.half(), nw, EPS, w)
    with pytest.raises(ValueError):
        add_rms_norm_gemv(x, res, nw[:4], EPS, w)
    with pytest.raises(ValueError):
        add_rms_norm_gemv(x, res, nw.half(), EPS, w)
    with pytest.raises(ValueError):
        add_rms_norm_gemv(x, res, nw, EPS, torch.randn(4, 7))


@pytest.mark.parametrize("residual", [True, False])
def test_dispatch_add_rms_norm_linear_off_cuda_is_the_unfused_reference(residual, monkeypatch):
    """The references' norms, then dispatch.linear: float32 rows take oneDNN's packed product
    (kernels.onednn, equal up to the summation order); with it off, F.linear bit for bit."""
    from kernels import onednn

    x, res, nw, w, b = _inputs(3, 12, 16, torch.float32, residual=residual, bias=True)
    if residual:
        h, expect_res = ref.fused_add_rms_norm(x, res, nw, EPS)
    else:
        h, expect_res = ref.rms_norm(x, nw, EPS), x
    want = torch.nn.functional.linear(h, w, b)
    y, new_res = ops.add_rms_norm_linear(x, res, nw, EPS, w, b)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(new_res, expect_res)
    monkeypatch.setattr(onednn, "_available", lambda: False)  # no oneDNN: F.linear
    y, new_res = ops.add_rms_norm_linear(x, res, nw, EPS, w, b)
    assert torch.equal(y, want) and torch.equal(new_res, expect_res)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@gpu
def test_gpu_add_rms_norm_gemv_qwen_shapes(dtype):
    for n, k in [(4096, 1024), (6144, 1024), (1000, 1000)]:
        for m in range(1, 9):
            for residual in (True, False):
                _check(*_inputs(m, n, k, dtype, device="cuda", residual=residual, bias=m == 3))


@gpu
def test_gpu_dispatch_add_rms_norm_linear():
    for m in (1, 2):  # M = 1: the fused GEMV; M = 2: fused_add_rms_norm (in place) + cuBLAS
        x, res, nw, w, b = _inputs(m, 4096, 1024, torch.bfloat16, device="cuda", bias=True)
        h, expect_res = ref.fused_add_rms_norm(x, res, nw, EPS)
        expect = ref.linear(h.float(), w.float(), b.float())
        y, new_res = ops.add_rms_norm_linear(x.clone(), res.clone(), nw, EPS, w, b)
        assert torch.equal(new_res, expect_res)
        assert (y.float() - expect).abs().max().item() < 1e-2 * expect.abs().max().item()


@gpu
def test_gpu_add_rms_norm_linear_cuda_graph_replay():
    x, res, nw, w, b = _inputs(1, 6144, 1024, torch.bfloat16, device="cuda")
    static_x, static_res = x.clone(), res.clone()
    ops.add_rms_norm_linear(static_x, static_res, nw, EPS, w, b)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, new_res = ops.add_rms_norm_linear(static_x, static_res, nw, EPS, w, b)
    for seed in (7, 8):
        static_x.copy_(_randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=seed))
        static_res.copy_(_randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=seed + 10))
        graph.replay()
        expect_y, expect_res = add_rms_norm_gemv(static_x, static_res, nw, EPS, w, b)
        assert torch.equal(new_res, expect_res) and torch.equal(y, expect_y)
        h, _ = ref.fused_add_rms_norm(static_x, static_res, nw, EPS)
        expect = ref.linear(h.float(), w.float())
        assert (y.float() - expect).abs().max().item() < 1e-2 * expect.abs().max().item()


def _embed_case(m, n, k, dtype, device="cpu", bias=False, vocab=40):
    table = _randn(vocab, k, dtype=dtype, device=device, seed=6) * 3
    ids = torch.tensor([(7 * i + 3) % vocab for i in range(m)], dtype=torch.int64, device=device)
    _, _, nw, w, b = _inputs(m, n, k, dtype, device=device, residual=False, bias=bias)
    return ids, table, nw, w, b


def _check_embed(ids, table, nw, w, b, **kw):
    """embed_rms_norm_gemv against its unfused reference: exact where the product's rounding agrees."""
    from kernels.gemv_norm import embed_rms_norm_gemv

    x = table[ids]
    expect = ref.linear(ref.rms_norm(x, nw, EPS).double(), w.double(), None if b is None else b.double())
    got, got_res = embed_rms_norm_gemv(ids, table, nw, EPS, w, b, **kw)
    err = (got.double() - expect).abs().max().item() / expect.abs().max().item()
    assert err < RTOL[table.dtype], (tuple(w.shape), ids.shape[0], kw, err)
    assert torch.equal(got_res, x)  # the gathered rows are the residual stream
    # the same bits as the ungathered launch on those rows
    want, _ = add_rms_norm_gemv(x, None, nw, EPS, w, b, config=kw.get("config"))
    if not kw.get("preload"):
        assert torch.equal(got, want)
    return got


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_embed_rms_norm_gemv_gathers_the_rows(dtype, m):
    # K = 50 ragged against BLOCK_K = 16; ids out of order; with and without bias
    _check_embed(*_embed_case(m, 30, 50, dtype, bias=m == 2), config=FMA)


@pytest.mark.parametrize("m", [1, 3])
def test_embed_rms_norm_gemv_preloaded_weights(m):
    # the whole weight slice read before the (PDL) wait: the same bits as the same one-chunk tiles
    # loaded inside the K loop
    ids, table, nw, w, b = _embed_case(m, 32, 64, torch.float32)
    early = _check_embed(ids, table, nw, w, b, config=GemvConfig("fma", 4, 64, 1, 4, 1), preload=True)
    in_loop = _check_embed(ids, table, nw, w, b, config=GemvConfig("fma", 4, 64, 1, 4, 1))
    assert torch.equal(early, in_loop)
    with pytest.raises(ValueError, match="preload needs"):
        _check_embed(*_embed_case(1, 30, 64, torch.float32), config=GemvConfig("fma", 4, 64, 1, 4, 1),
                     preload=True)  # fmt: skip


def test_embed_rms_norm_gemv_dot_path_and_bad_inputs():
    from kernels.gemv_norm import embed_rms_norm_gemv

    _check_embed(*_embed_case(5, 32, 48, torch.float32, bias=True), config=DOT)
    ids, table, nw, w, _ = _embed_case(2, 8, 16, torch.float32)
    with pytest.raises(ValueError, match="ids must be"):
        embed_rms_norm_gemv(ids.int(), table, nw, EPS, w)
    with pytest.raises(ValueError, match="norm_weight"):
        embed_rms_norm_gemv(ids, table, nw[:4], EPS, w)


def test_dispatch_embed_rms_norm_linear_off_cuda(monkeypatch):
    from kernels import onednn

    ids, table, nw, w, b = _embed_case(3, 12, 16, torch.float32, bias=True)
    y, res = ops.embed_rms_norm_linear(ids, table, nw, EPS, w, b)
    x = torch.nn.functional.embedding(ids, table)
    assert torch.equal(res, x)
    want = torch.nn.functional.linear(ref.rms_norm(x, nw, EPS), w, b)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)  # oneDNN's product (kernels.onednn)
    monkeypatch.setattr(onednn, "_available", lambda: False)  # no oneDNN: F.linear
    assert torch.equal(ops.embed_rms_norm_linear(ids, table, nw, EPS, w, b)[0], want)


@gpu
def test_gpu_embed_rms_norm_linear_in_a_graph_after_the_input_launch():
    # the engine's batch-1 head: a launch writes the id, the fused gather + norm + qkv follows it with
    # PDL (weights read before its wait); replayed with new ids: the gathered rows, and the product of
    # the launch without PDL on the same tiles, bit for bit
    from kernels.gemv_norm import embed_rms_norm_gemv

    ids, table, nw, w, _ = _embed_case(1, 4096, 1024, torch.bfloat16, device="cuda", vocab=151936)
    src = torch.tensor([5, 151935, 77], dtype=torch.int64, device="cuda")
    at = torch.zeros(1, dtype=torch.int64, device="cuda")
    ops.embed_rms_norm_linear(ids, table, nw, EPS, w)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.index_select(src, 0, at, out=ids)  # the kernel before writes the id
        y, res = ops.embed_rms_norm_linear(ids, table, nw, EPS, w)
    for i in range(3):
        at.fill_(i)
        graph.replay()
        torch.cuda.synchronize()
        x = table[src[i : i + 1]]
        want, _ = embed_rms_norm_gemv(src[i : i + 1], table, nw, EPS, w, preload=True)
        assert torch.equal(res, x) and torch.equal(y, want)
        expect = ref.linear(ref.rms_norm(x, nw, EPS).float(), w.float())
        assert (y.float() - expect).abs().max().item() < 1e-2 * expect.abs().max().item()
