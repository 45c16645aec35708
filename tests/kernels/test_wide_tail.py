"""kernels.wide_tail (a decode layer's tail for wide batches in four GEMM launches with fused norms, SiLU
and residual adds) vs reference.decode_layer_tail, in the interpreter (fp32, fp16) and on the GPU (bf16,
CUDA graphs, partial sums of squares handed between launches)."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.wide_tail import WideConfig, choose_config, decode_layer_tail, fits
from tests.kernels.paged import gpu
from tests.kernels.test_decode_tail import QWEN3_06B, _check, _close, _weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "bias", "has_next"), [(20, False, True), (16, True, True), (33, True, False)])
def test_wide_tail_matches_reference(dtype, m, bias, has_next):
    # I = 40 and A = 48 are ragged against the interpreter's 16 x 16 x 32 tiles (masked K and N)
    w = _weights(64, 48, 40, 96, dtype, bias=bias, has_next=has_next)
    _check(m, w, dtype, fn=decode_layer_tail)


def test_wide_tail_configs_agree():
    """Other tiles split the rows and the partial sums of squares differently: same values (fp32)."""
    w = _weights(64, 64, 48, 96, torch.float32)
    every = ("o", "gate_up", "down", "qkv")
    small = dict.fromkeys(every, WideConfig(16, 16, 16, 4, 1))
    wide = dict.fromkeys(every, WideConfig(32, 32, 64, 4, 1))
    # K cut in 2 or 4 slices (down's K = 48 takes 3 x 16: it falls back to one slice at split 2 and 4)
    split2 = dict.fromkeys(every, WideConfig(16, 32, 16, 4, 1, 2))
    split4 = dict.fromkeys(every, WideConfig(16, 16, 16, 4, 1, 4))
    out1 = _check(24, w, torch.float32, fn=decode_layer_tail, configs=small)
    for cfg in (wide, split2, split4, split4):  # twice: the arrival counters come back zeroed
        out2 = _check(24, w, torch.float32, fn=decode_layer_tail, configs=cfg)
        for x, y in zip(out1, out2, strict=True):
            _close(x, y, torch.float32, "configs")


def test_wide_tail_rejects_mismatched_shapes():
    w = _weights(32, 32, 48, 64, torch.float32)
    with pytest.raises(ValueError, match="shapes"):
        decode_layer_tail(torch.zeros(16, 16), torch.zeros(16, 32), w)
    with pytest.raises(ValueError, match="expected"):
        decode_layer_tail(torch.zeros(16, 32), torch.zeros(8, 32), w)


def test_wide_tail_fits_wide_16_bit_batches_only():
    w16 = _weights(*QWEN3_06B, torch.bfloat16)
    assert fits(16, torch.bfloat16, w16) and fits(256, torch.bfloat16, w16)
    assert not fits(8, torch.bfloat16, w16)  # the small-batch launches keep those
    assert not fits(4096, torch.bfloat16, w16)  # prefill stays on cuBLAS
    assert not fits(64, torch.float32, _weights(*QWEN3_06B, torch.float32))  # fp32 stays per op


def test_wide_tail_default_tiles_cover_the_batch():
    for m in (16, 40, 64, 128, 256):
        for n, k, silu in ((1024, 2048, False), (3072, 1024, True), (1024, 3072, False), (4096, 1024, False)):
            cfg = choose_config(m, n, k, silu)
            assert cfg.block_m >= 16 and cfg.block_n >= 16 and k % cfg.block_k == 0


@gpu
@pytest.mark.parametrize("split", [2, 4])
def test_wide_tail_gpu_split_k_equals_one_slice_order(split):
    """Split-K sums its slices in a fixed order: two runs give the same bits, close to one slice."""
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", bias=True)
    cfg = dict.fromkeys(("o", "gate_up", "down", "qkv"), WideConfig(32, 64, 128, 4, 3, split))
    one = _check(48, w, torch.bfloat16, device="cuda", fn=decode_layer_tail)
    first = _check(48, w, torch.bfloat16, device="cuda", fn=decode_layer_tail, configs=cfg)
    again = _check(48, w, torch.bfloat16, device="cuda", fn=decode_layer_tail, configs=cfg)
    for x, y, z in zip(one, first, again, strict=True):
        assert torch.equal(y, z)
        _close(x, y, torch.bfloat16, "split vs one slice")


@gpu
@pytest.mark.parametrize("m", [16, 40, 256])
@pytest.mark.parametrize(("bias", "has_next"), [(False, True), (True, False)])
def test_wide_tail_gpu_bf16(m, bias, has_next):
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda", bias=bias, has_next=has_next)
    _check(m, w, torch.bfloat16, device="cuda", fn=decode_layer_tail)


@gpu
@pytest.mark.parametrize("use_pdl", [False, True])
def test_wide_tail_gpu_cuda_graph_replays(use_pdl):
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    a = torch.randn(64, 2048, dtype=torch.bfloat16, device="cuda")
    res = torch.randn(64, 1024, dtype=torch.bfloat16, device="cuda")
    decode_layer_tail(a, res, w, use_pdl=use_pdl)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, out_res = decode_layer_tail(a, res, w, use_pdl=use_pdl)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):  # new inputs each replay
        a.copy_(torch.randn_like(a))
        graph.replay()
        expect, expect_res = decode_layer_tail(a, res, w, use_pdl=False)
        assert torch.equal(out, expect) and torch.equal(out_res, expect_res)
        expect_ref = ref.decode_layer_tail(a, res.clone(), w)
        _close(out, expect_ref[0], torch.bfloat16, "graph vs reference")
