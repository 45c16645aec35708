"""kernels.decode_tail_attn: the next layer's batch-1 attention as the TMA tail's fifth stage, vs the tail
and the fused decode attention launched apart (kernels.paged_attention) and vs reference.attend_next.
Gluon has no interpreter: on the CPU the plan, the checks and the reference are tested (the kernel is
compiled for sm_90 by tests/kernels/compile_sm90.py); the GPU tests run it."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch as ops
from kernels import reference as ref
from tests.kernels.paged import capture, gpu, make_paged
from tests.kernels.test_decode_tail import QWEN3_06B, _close, _weights
from tests.kernels.test_gemv import _randn

tma = pytest.importorskip("kernels.decode_tail_tma")
attn_stage = pytest.importorskip("kernels.decode_tail_attn")


def _next(ctx: int, heads=(16, 8, 128), norm=True, dtype=torch.bfloat16, device="cpu", seed=0, slot_ok=True):
    """A NextAttention of one sequence whose context (the new token included) is ctx keys long."""
    h, hk, d = heads
    _, kc, vc, bt, _, sl = make_paged([ctx], [1], h, hk, d, 16, dtype, seed=seed)
    pos = sl.long() - 1
    slot = bt.long()[0, pos // 16] * 16 + pos % 16 if slot_ok else torch.full((1,), -1)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2).float() / d))
    w = [
        (1 + 0.1 * torch.randn(d, generator=torch.Generator().manual_seed(seed + i))).to(dtype)
        for i in (1, 2)
    ]
    n = ref.NextAttention(
        h, hk, d, w[0] if norm else None, w[1] if norm else None, 1e-6, d**-0.5, pos,
        ref.rope_cos_sin(inv_freq, 4096), kc, vc, slot, bt, sl,
    )  # fmt: skip
    return n._replace(
        **{k: getattr(n, k).to(device) for k in n._fields if isinstance(getattr(n, k), torch.Tensor)}
    )


def _cloned(n: ref.NextAttention) -> ref.NextAttention:
    return n._replace(k_cache=n.k_cache.clone(), v_cache=n.v_cache.clone())


def test_plan_splits_each_kv_head_over_the_programs():
    n = _next(100)
    assert attn_stage.plan(n, 128, 4096) == attn_stage.AttnPlan(16, 2)  # 8 KV heads x 16 splits, 2 q heads
    assert attn_stage.plan(n._replace(num_heads=8, num_kv_heads=4), 128, 2048) == attn_stage.AttnPlan(32, 2)
    assert attn_stage.plan(n, 128, 4096 + 128) is None  # the qkv row is not q, k and v of these heads
    assert (
        attn_stage.plan(n._replace(num_kv_heads=3, num_heads=12), 128, 18 * 128) is None
    )  # 3 does not divide
    assert attn_stage.plan(n._replace(num_kv_heads=1, num_heads=2), 128, 4 * 128) is None  # 128 splits
    assert attn_stage.plan(n._replace(k_norm=None), 128, 4096) is None  # one norm without the other


def test_fits_needs_one_sequence_in_the_models_dtype():
    n = _next(100)
    assert attn_stage.fits(n, torch.bfloat16)
    assert not attn_stage.fits(n, torch.float16)
    assert not attn_stage.fits(n._replace(cos_sin=n.cos_sin.double()), torch.bfloat16)
    assert not attn_stage.fits(n._replace(seq_lens=n.seq_lens.repeat(2)), torch.bfloat16)
    assert not attn_stage.fits(n._replace(block_tables=n.block_tables.long()), torch.bfloat16)


def test_reference_is_the_fused_decode_launch():
    """reference.attend_next (norm, RoPE, store, attention) against the fused decode kernel the engine
    runs on CUDA when the stage does not (called directly: interpreted on the CPU, float32)."""
    from kernels.paged_attention import NewTokenQK, paged_decode_attention

    n = _next(40, heads=(4, 2, 32), dtype=torch.float32, seed=3)
    qkv = _randn(1, 8 * 32, dtype=torch.float32, seed=4)
    a, b = _cloned(n), _cloned(n)
    expect = ref.attend_next(qkv, a)
    q, k, v = qkv.split([128, 64, 64], dim=-1)
    new = NewTokenQK(k.view(1, 2, 32), v.view(1, 2, 32), b.q_norm, b.k_norm, b.eps, b.positions, b.cos_sin,
                     b.slot_mapping)  # fmt: skip
    got = paged_decode_attention(q.view(1, 4, 32), b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale,
                                 num_splits=3, new_token=new)  # fmt: skip
    torch.testing.assert_close(got.view(1, -1), expect, atol=1e-4, rtol=1e-4)
    # the new K (normed and rotated in another order) within float32 rounding, V as given
    torch.testing.assert_close(b.k_cache, a.k_cache, atol=1e-5, rtol=1e-5)
    assert torch.equal(a.v_cache, b.v_cache) and not torch.equal(a.k_cache, n.k_cache)


def test_cpu_takes_neither_the_stage_nor_the_tma_tail():
    w = _weights(*QWEN3_06B, torch.bfloat16)
    a = torch.zeros(1, 2048, dtype=torch.bfloat16)
    assert not ops.tail_may_attend(a)
    assert ops.decode_layer_tail_attend(a, torch.zeros(1, 1024, dtype=torch.bfloat16), w, _next(10)) is None


def _apart(a, res, w, n):
    """The tail, then the fused decode attention over its qkv: what the engine ran before the stage."""
    qkv, res2 = tma.decode_layer_tail(a, res, w)
    return ops.attend_next(qkv, n), res2, qkv


def _inputs(seed=1):
    a = _randn(1, 2048, dtype=torch.bfloat16, device="cuda", seed=seed)
    return a, _randn(1, 1024, dtype=torch.bfloat16, device="cuda", seed=2) * 4


@gpu
@pytest.mark.parametrize("ctx", [1, 5, 64, 100, 768, 1023, 2500])
@pytest.mark.parametrize("norm", [True, False])
def test_gpu_matches_the_tail_and_attention_apart(ctx, norm):
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    n = _next(ctx, norm=norm, device="cuda", seed=ctx)
    a, res = _inputs()
    assert tma.attends(a, w, n)
    fused, apart = _cloned(n), _cloned(n)
    got, got_res = tma.decode_layer_tail(a, res, w, attn=fused)
    expect, expect_res, qkv = _apart(a, res, w, apart)
    assert torch.equal(got_res, expect_res)  # stages 1-4 are the same launch's
    _close(got, expect, torch.bfloat16, "attention vs the fused decode launch")
    # the new token's K/V were stored as the decode launch stores them; nothing else was written
    assert torch.equal(fused.k_cache, apart.k_cache) and torch.equal(fused.v_cache, apart.v_cache)
    f32 = n._replace(k_cache=n.k_cache.float(), v_cache=n.v_cache.float(), q_norm=None, k_norm=None)
    if norm:  # the reference in float32 from the same qkv (its norm weights in float32 too)
        f32 = f32._replace(q_norm=n.q_norm.float(), k_norm=n.k_norm.float())
    _close(got, ref.attend_next(qkv.float(), f32), torch.bfloat16, "attention vs reference")


@gpu
def test_gpu_padding_slot_stores_nothing():
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    n = _next(300, device="cuda", slot_ok=False)
    before = _cloned(n)
    tma.decode_layer_tail(*_inputs(), w, attn=n)
    assert torch.equal(n.k_cache, before.k_cache) and torch.equal(n.v_cache, before.v_cache)


@gpu
def test_gpu_back_to_back_launches_and_graph_replays():
    """100 launches queued back to back (each must find the barrier and arrival counters zeroed), then a
    CUDA graph replayed with new inputs and a longer context, each against a lone launch."""
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    n = _next(704, device="cuda")  # 44 blocks: the replays' contexts stay inside them
    res = _inputs()[1]
    inputs = [_inputs(seed)[0] for seed in range(100)]
    outs = [tma.decode_layer_tail(a, res, w, attn=n)[0] for a in inputs]
    for a, out in zip(inputs[::9], outs[::9], strict=True):
        assert torch.equal(out, tma.decode_layer_tail(a, res, w, attn=n)[0])
    a = inputs[0].clone()
    graph, (out, out_res) = capture(lambda: tma.decode_layer_tail(a, res, w, attn=n))
    for seed, ctx in ((3, 704), (4, 689), (5, 700)):
        a.copy_(inputs[seed])
        n.seq_lens.fill_(ctx)
        n.positions.fill_(ctx - 1)
        n.slot_mapping.copy_(n.block_tables.long()[0, (ctx - 1) // 16] * 16 + (ctx - 1) % 16)
        graph.replay()
        expect, expect_res = tma.decode_layer_tail(inputs[seed], res, w, attn=n)
        assert torch.equal(out, expect) and torch.equal(out_res, expect_res)


@gpu
def test_gpu_dispatch_runs_the_stage_unless_switched_off(monkeypatch):
    w = _weights(*QWEN3_06B, torch.bfloat16, device="cuda")
    n = _next(200, device="cuda")
    a, res = _inputs()
    monkeypatch.setattr(tma, "ATTENTION", True)  # the engine's switch (off by default)
    assert ops.tail_may_attend(a)
    got = ops.decode_layer_tail_attend(a, res, w, n)
    assert got is not None and torch.equal(got[0], tma.decode_layer_tail(a, res, w, attn=n)[0])
    assert ops.decode_layer_tail_attend(a, res, w._replace(qkv_next=None, norm1_next=None), n) is None
    monkeypatch.setattr(tma, "ATTENTION", False)
    assert not ops.tail_may_attend(a) and ops.decode_layer_tail_attend(a, res, w, n) is None
