"""The stream-K decode attention (kernels.decode_lean) vs the reference: plain and with the new token's
q/k norm, RoPE and K/V store fused (interpreter on CPU; GPU tests below)."""

from __future__ import annotations

import pytest
import torch

from kernels import decode_lean
from kernels import reference as ref
from kernels._jit import arrival_counters
from kernels.decode_lean import lean_decode_attention, tile_map
from kernels.paged_attention import NewTokenQK
from tests.kernels.paged import ATOL, GPU_ATOL, gpu, make_paged, max_err
from tests.kernels.test_decode_fused import _case, _reference

H, HK, D = 4, 2, 16
SCALE = D**-0.5
CTX = [1, 20, 75, 33, 160, 7]


def test_tile_map():
    sl = torch.tensor([0, 1, 16, 17, 40], dtype=torch.int32)
    m = tile_map(sl, 2, 16, 64)
    # tiles of 16 keys per KV head, at least one: 1, 1, 1, 2, 3; times 2 KV heads, accumulated
    assert m.cum.tolist() == [0, 2, 4, 6, 10, 16]
    want = [(b * 2 + h) << 12 | t for b, n in enumerate([1, 1, 1, 2, 3]) for h in range(2) for t in range(n)]
    assert m.tiles[:16].tolist() == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("programs", [1, 3, 7, 40, 200])
def test_matches_reference(dtype, programs):
    """Any grid: one program for everything, ranges that cut pairs into two or several pieces, and more
    programs than tiles (empty ranges)."""
    q, kc, vc, bt, _, sl = make_paged(CTX, [1] * len(CTX), H, HK, D, 16, dtype)
    out = lean_decode_attention(q, kc, vc, bt, sl, SCALE, num_programs=programs)
    assert max_err(out, ref.decode_attention(q, kc, vc, bt, sl, SCALE)) < ATOL[dtype]
    assert not arrival_counters("decode_lean", 1, q.device).any()  # every launch leaves them zeroed


@pytest.mark.parametrize("programs", [2, 5, 64])
def test_fused_new_token_matches_reference(programs):
    """q/k norm + RoPE applied in every piece of a pair, the new K/V stored once by the piece that holds
    the new position; a padding row (length 0) gets zeros."""
    ctx = [30, 0, 90, 1, 47]
    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _case(torch.float32, ctx)
    want, want_k, want_v = _reference(q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots)
    kc2, vc2 = kc.clone(), vc.clone()
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
    out = lean_decode_attention(q, kc2, vc2, bt, sl, SCALE, new_token=nt, num_programs=programs)
    assert max_err(out, want) < ATOL[torch.float32]
    assert torch.equal(kc2, want_k) and torch.equal(vc2, want_v)
    assert torch.all(out[1] == 0)


def test_tiles_argument_and_bad_input():
    q, kc, vc, bt, _, sl = make_paged(CTX, [1] * len(CTX), H, HK, D, 16, torch.float32)
    tiles = tile_map(sl, HK, decode_lean.block_keys(q), bt.shape[1] * 16)
    out = lean_decode_attention(q, kc, vc, bt, sl, SCALE, tiles=tiles, num_programs=5)
    assert max_err(out, ref.decode_attention(q, kc, vc, bt, sl, SCALE)) < ATOL[torch.float32]
    with pytest.raises(ValueError, match="tile_map"):
        lean_decode_attention(q[:-1], kc, vc, bt[:-1], sl[:-1], SCALE, tiles=tiles)
    with pytest.raises(ValueError, match="seq_lens"):
        lean_decode_attention(q, kc, vc, bt, sl.long(), SCALE)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_matches_reference_in_cuda_graph(dtype):
    """bf16 and fp32 on the GPU at the configured grid, W2-like ragged contexts, replayed from a CUDA graph
    after the lengths change (the tile offsets rebuilt inside the graph)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(3)
    ctx = torch.randint(1, 2048, (96,), generator=gen).tolist()
    q, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), 16, 8, 128, 16, dtype, "cuda")
    out = torch.empty_like(q)

    def step():
        tiles = tile_map(sl, 8, decode_lean.block_keys(q), bt.shape[1] * 16)
        lean_decode_attention(q, kc, vc, bt, sl, 128**-0.5, out=out, tiles=tiles)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for lens in (ctx, [max(1, c - 700) for c in ctx], [c if i % 3 else 0 for i, c in enumerate(ctx)]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        live = sl > 0
        want = ref.decode_attention(q[live], kc, vc, bt[live], sl[live], 128**-0.5).to(dtype)
        assert max_err(out[live], want) < GPU_ATOL[dtype]
        assert torch.all(out[~live] == 0)
