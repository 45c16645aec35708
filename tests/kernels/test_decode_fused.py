"""The fused decode launch (q/k norm + RoPE + K/V store + split-K attention + in-kernel split merge) vs
the reference chain qk_norm_rope_store_kv -> decode_attention (interpreter on CPU; GPU tests below)."""

from __future__ import annotations

import pytest
import torch

from kernels import decode_launch
from kernels import reference as ref
from kernels.decode_attention import paged_decode_attention
from kernels.decode_launch import NewTokenQK
from tests.kernels.paged import ATOL, GPU_ATOL, gpu, make_paged, max_err

H, HK, D = 4, 2, 16
SCALE = D**-0.5


def _cos_sin(max_pos: int, d: int) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    f = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat((f.cos(), f.sin()), dim=-1).contiguous()


def _case(dtype, ctx, device="cpu", norm=True, h=H, hk=HK, d=D, block_size=16, seed=0):
    """A decode batch whose new token (position ctx - 1) is not in the cache yet; q/k/v are views of one
    (batch, (h + 2 hk) * d) qkv row, as the model hands them over."""
    q0, kc, vc, bt, _, sl = make_paged(ctx, [1] * len(ctx), h, hk, d, block_size, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    b = len(ctx)
    qkv = torch.randn(b, (h + 2 * hk) * d, generator=gen).to(dtype).to(device)
    q, k, v = qkv.split([h * d, hk * d, hk * d], dim=-1)
    q, k, v = q.view(b, h, d), k.view(b, hk, d), v.view(b, hk, d)
    wq = wk = None
    if norm:
        wq = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype).to(device)
        wk = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype).to(device)
    pos = (sl.long() - 1).clamp(min=0)
    slots = torch.tensor(
        [int(bt[i, p // block_size]) * block_size + p % block_size if c > 0 else -1 for i, (p, c) in
         enumerate(zip(pos.tolist(), ctx, strict=True))], dtype=torch.int64, device=device,
    )  # fmt: skip
    return q, k, v, wq, wk, pos, _cos_sin(4096, d).to(device), kc, vc, bt, sl, slots


def _reference(q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots, window=None):
    kc, vc = kc.clone(), vc.clone()
    live = sl > 0
    qr, _ = ref.qk_norm_rope_store_kv(q.clone(), k.clone(), v, wq, wk, 1e-6, pos, cs, kc, vc, slots)
    out = torch.zeros_like(q)
    out[live] = ref.decode_attention(qr[live], kc, vc, bt[live], sl[live], SCALE, window).to(q.dtype)
    return out, kc, vc


def _fused(q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots, window=None, **kw):
    kc, vc = kc.clone(), vc.clone()
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
    out = paged_decode_attention(q, kc, vc, bt, sl, SCALE, window, new_token=nt, **kw)
    return out, kc, vc


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("batch_one", [False, True])
@pytest.mark.parametrize("table", ["whole", "part"])
def test_fused_decode_matches_reference(dtype, num_splits, norm, batch_one, table, monkeypatch):
    """batch_one with splits: the launch is peeled (each split's first tile asked for before the new
    token's work, the new row patched in from registers, the block-table row read per tile); 70 keys in 3
    splits of 16-key tiles run a peeled tile and a loop. table: the block-table row held in registers
    whole, or ("part") two entries of it at a time, each 16-key chunk's entries read after the chunk
    before."""
    if table == "part":
        monkeypatch.setattr(decode_launch, "TABLE_REGS_MAX", 2)
    ctx = [70] if batch_one else [37, 5, 70]
    case = _case(dtype, ctx, norm=norm)
    out, kc, vc = _fused(*case, num_splits=num_splits)
    want, kc_ref, vc_ref = _reference(*case)
    assert max_err(out, want) < ATOL[dtype]
    assert max_err(kc, kc_ref) < ATOL[dtype] and torch.equal(vc, vc_ref)
    assert torch.equal(case[0], _case(dtype, ctx, norm=norm)[0])  # raw q is left as it is


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("peel", [False, True])
def test_fused_decode_window_and_padding_row(dtype, peel):
    # row 1 is CUDA-graph padding: seq_len 0, slot -1 (peel: batch 1 in 2 splits, the window alone)
    ctx = [40] if peel else [40, 0, 23]
    case = _case(dtype, ctx)
    out, kc, vc = _fused(*case, window=9, num_splits=2)
    want, kc_ref, vc_ref = _reference(*case, window=9)
    assert max_err(out, want) < ATOL[dtype]
    assert peel or torch.all(out[1] == 0)
    assert max_err(kc, kc_ref) < ATOL[dtype] and torch.equal(vc, vc_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_fused_decode_row_scale(dtype, norm, num_splits):
    """q/k/v of a qkv projection that read the residual stream without its RMSNorm (the norm's weight
    folded into the projection): the launch multiplies them by 1 / rms(h's row) first, as
    reference.row_scaled, before the q/k norm, RoPE, store and attention. 16-bit with a q/k norm: only v
    takes the scale, which the q/k norm cancels, within the dtype's tolerance."""
    ctx = [37, 5, 70]
    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _case(dtype, ctx, norm=norm)
    gen = torch.Generator().manual_seed(9)
    h = (torch.randn(len(ctx), 48, generator=gen) * torch.tensor([[0.3], [4.0], [30.0]])).to(dtype)
    kc0, vc0 = kc.clone(), vc.clone()
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots, h, 1e-5)
    out = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=num_splits, new_token=nt)
    scaled = [ref.row_scaled(t, h, 1e-5) for t in (q, k, v)]
    want, kc_ref, vc_ref = _reference(*scaled, wq, wk, pos, cs, kc0, vc0, bt, sl, slots)
    assert max_err(out, want) < ATOL[dtype]
    assert max_err(kc, kc_ref) < ATOL[dtype] and max_err(vc, vc_ref) < ATOL[dtype]
    plain, _, vc_plain = _reference(q, k, v, wq, wk, pos, cs, kc0, vc0, bt, sl, slots)
    assert max_err(vc_plain, vc_ref) > 10 * ATOL[dtype]  # the scale reached the stored v
    with pytest.raises(ValueError, match="row_scale"):
        bad = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots, h[:2], 1e-5)
        paged_decode_attention(q, kc, vc, bt, sl, SCALE, new_token=bad)


def test_in_kernel_merge_equals_merge_kernel():
    q, kc, vc, bt, _, sl = make_paged([90, 33, 64], [1, 1, 1], H, HK, D, 16, torch.float32)
    merged = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=4, fused_reduce=True)
    separate = paged_decode_attention(q, kc, vc, bt, sl, SCALE, num_splits=4, fused_reduce=False)
    assert max_err(merged, separate) < 1e-6
    assert max_err(merged, ref.decode_attention(q, kc, vc, bt, sl, SCALE)) < ATOL[torch.float32]


def test_rejects_bad_new_token():
    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _case(torch.float32, [10])
    with pytest.raises(ValueError):
        paged_decode_attention(
            q, kc, vc, bt, sl, SCALE, new_token=NewTokenQK(k, v, wq, None, 1e-6, pos, cs, slots)
        )
    with pytest.raises(ValueError):
        bad = NewTokenQK(k[:, :1], v, wq, wk, 1e-6, pos, cs, slots)
        paged_decode_attention(q, kc, vc, bt, sl, SCALE, new_token=bad)


def _gpu_case(ctx):
    return _case(torch.bfloat16, ctx, "cuda", h=16, hk=8, d=128)


@gpu
@pytest.mark.parametrize("ctx", [[300, 1, 1500, 17], [4000] * 3 + [0]])
def test_gpu_fused_equals_two_launches(ctx):
    """bf16 on the GPU: the fused launch against qk_norm_rope_store_kv + the decode kernel + the merge
    kernel (the same roundings except the order of the q/k norm sums)."""
    from kernels.qk_norm_rope import qk_norm_rope_store_kv

    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _gpu_case(ctx)
    scale = 128**-0.5
    kc1, vc1 = kc.clone(), vc.clone()
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
    got = paged_decode_attention(q, kc1, vc1, bt, sl, scale, new_token=nt)
    kc2, vc2 = kc.clone(), vc.clone()
    qr, _ = qk_norm_rope_store_kv(q.clone(), k.clone(), v, wq, wk, 1e-6, pos, cs, kc2, vc2, slots)
    want = paged_decode_attention(qr, kc2, vc2, bt, sl, scale, fused_reduce=False)
    assert torch.equal(vc1, vc2) and max_err(kc1, kc2) < GPU_ATOL[torch.bfloat16]
    assert max_err(got, want) < GPU_ATOL[torch.bfloat16]


@gpu
def test_gpu_fused_in_cuda_graph():
    q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _gpu_case([100, 700, 1500, 3])
    scale = 128**-0.5
    nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
    out = torch.empty_like(q)
    bound = bt.shape[1] * 16
    paged_decode_attention(q, kc, vc, bt, sl, scale, out=out, max_seq_len=bound, new_token=nt)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, kc, vc, bt, sl, scale, out=out, max_seq_len=bound, new_token=nt)
    for lens in ([100, 700, 1500, 3], [101, 1, 1400, 4], [0, 650, 1501, 16]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        p = (sl.long() - 1).clamp(min=0)
        pos.copy_(p)
        table = bt.tolist()
        pairs = enumerate(zip(p.tolist(), lens, strict=True))
        slots.copy_(torch.tensor([table[i][x // 16] * 16 + x % 16 if n > 0 else -1 for i, (x, n) in pairs]))
        q.normal_()
        k.normal_()
        kc_ref, vc_ref = kc.clone(), vc.clone()
        qr, _ = ref.qk_norm_rope_store_kv(
            q.clone(), k.clone(), v, wq, wk, 1e-6, pos, cs, kc_ref, vc_ref, slots
        )
        graph.replay()
        torch.cuda.synchronize()
        assert max_err(kc, kc_ref) < GPU_ATOL[torch.bfloat16] and torch.equal(vc, vc_ref)
        live = sl > 0
        expect = ref.decode_attention(
            qr[live].float(), kc_ref.float(), vc_ref.float(), bt[live], sl[live], scale
        )
        assert max_err(out[live], expect) < GPU_ATOL[torch.bfloat16]
        assert torch.all(out[~live] == 0)


@gpu
@pytest.mark.parametrize("tile", [(32, 4), (64, 4)])
@pytest.mark.parametrize("heads", [(16, 8), (8, 4)])
def test_gpu_peeled_batch_one_equals_two_launches(tile, heads, monkeypatch):
    """Batch 1 (the peeled launch: first tile asked for early, the new row patched from registers) at
    contexts where a split holds one tile and where it holds several, the new row in the first or a
    later one, against qk_norm_rope_store_kv + the unpeeled decode launch."""
    from kernels.qk_norm_rope import qk_norm_rope_store_kv

    monkeypatch.setattr(decode_launch, "PEEL_TILE", tile)
    h, hk = heads
    scale = 128**-0.5
    bad = []
    for ctx in (1, 40, 100, 300, 600, 1000, 1500, 3000):
        for splits in (2, 8, 32):
            q, k, v, wq, wk, pos, cs, kc, vc, bt, sl, slots = _case(torch.bfloat16, [ctx], "cuda", h=h, hk=hk,
                                                                    d=128, seed=ctx)  # fmt: skip
            kc1, vc1 = kc.clone(), vc.clone()
            nt = NewTokenQK(k, v, wq, wk, 1e-6, pos, cs, slots)
            got = paged_decode_attention(q, kc1, vc1, bt, sl, scale, new_token=nt, num_splits=splits)
            kc2, vc2 = kc.clone(), vc.clone()
            qr, _ = qk_norm_rope_store_kv(q.clone(), k.clone(), v, wq, wk, 1e-6, pos, cs, kc2, vc2, slots)
            want = paged_decode_attention(qr, kc2, vc2, bt, sl, scale, num_splits=splits, fused_reduce=False)
            err = max_err(got, want)
            if not (torch.equal(vc1, vc2) and max_err(kc1, kc2) < GPU_ATOL[torch.bfloat16]) or not err < 2e-2:
                bad.append((ctx, splits, round(err, 4)))
    assert not bad, bad
