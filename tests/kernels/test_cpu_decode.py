"""kernels.cpu_decode: the CPU's decode attention with per-step tables, against the references."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_decode, dispatch
from kernels import reference as ref


def _case(lens, seed=0, nb=24, bs=4, h=6, hk=2, d=16):
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    kc, vc = torch.randn(nb, bs, hk, d, generator=g), torch.randn(nb, bs, hk, d, generator=g)
    width = max(-(-n // bs) for n in lens)
    perm = torch.randperm(nb, generator=g)[: b * width].view(b, width).to(torch.int32)
    pos = torch.tensor([n - 1 for n in lens])
    slots = torch.stack([perm[i, p // bs].long() * bs + p % bs for i, p in enumerate(pos.tolist())])
    q, k, v = (torch.randn(b, n, d, generator=g) for n in (h, hk, hk))
    cos_sin = ref.rope_cos_sin(1.0 / (1e4 ** (torch.arange(0, d, 2).float() / d)), 64)
    return q, k, v, pos, cos_sin, kc, vc, slots, perm, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("lens", [[9], [13, 5, 13], [16, 16]])
@pytest.mark.parametrize("window", [None, 6])
def test_matches_reference(lens, window):
    q, k, v, pos, cs, kc, vc, slots, tables, seq = _case(lens)
    kc2, vc2 = kc.clone(), vc.clone()
    got = cpu_decode.rope_store_decode_attention(q, k, v, pos, cs, kc, vc, slots, tables, seq, 0.25, window)
    qr, _ = ref.qk_norm_rope_store_kv(q, k, v, None, None, 0.0, pos, cs, kc2, vc2, slots)
    want = ref.decode_attention(qr, kc2, vc2, tables, seq, 0.25, window)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the same K/V stored, bit for bit
    assert (got - want).abs().max() <= 1e-5


def test_tables_built_once_per_step():
    q, k, v, pos, cs, kc, vc, slots, tables, seq = _case([7, 3])
    a = cpu_decode.step_tables(pos, cs, slots, tables, seq, 4, None)
    assert cpu_decode.step_tables(pos, cs, slots, tables, seq, 4, None) is a  # the next layer's
    assert a.mask is not None and a.max_len == 7 and a.slots_valid
    b = cpu_decode.step_tables(pos.clone(), cs, slots, tables, seq, 4, None)  # the next step's tensors
    assert b is not a and torch.equal(b.cos, a.cos)


def test_padding_slots_are_not_written():
    q, k, v, pos, cs, kc, vc, slots, tables, seq = _case([5, 9])
    slots[1] = -1
    before = kc.clone()
    cpu_decode.rope_store_decode_attention(q, k, v, pos, cs, kc, vc, slots, tables, seq, 0.25)
    changed = (kc != before).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [slots[0].item() // 4]


def test_dispatch_takes_it_on_the_cpu():
    q, k, v, pos, cs, kc, vc, slots, tables, seq = _case([11])
    kc2, vc2 = kc.clone(), vc.clone()
    got = dispatch.qk_norm_rope_decode_attention(
        q, k, v, None, None, 0.0, pos, cs, kc, vc, slots, tables, seq, 0.25
    )
    want = cpu_decode.rope_store_decode_attention(q, k, v, pos, cs, kc2, vc2, slots, tables, seq, 0.25)
    assert torch.equal(got, want)
    x, w = torch.randn(3, 32), torch.randn(32)
    assert torch.equal(dispatch.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    r = torch.randn(3, 32)
    got_h, got_r = dispatch.fused_add_rms_norm(x, r, w, 1e-6)
    want_h, want_r = ref.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(got_h, want_h) and torch.equal(got_r, want_r)


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_engine_tokens_equal_the_reference_path(tmp_path, monkeypatch, arch):
    """The engine's greedy tokens (mixed prompt lengths, so masked decode batches; Mistral's sliding
    window shorter than the contexts) are the same with the per-step tables as with the references."""
    from engine import LLM, SamplingParams
    from kernels import dispatch_pointwise
    from models.tiny import build_checkpoint

    extra = {"sliding_window": 24} if arch == "mistral" else {}
    path = build_checkpoint(tmp_path, arch, vocab_size=512, **extra)
    prompts = [[(5 * i + 11 * j) % 500 + 1 for j in range(3 + 9 * i)] for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    lean = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=64).generate(prompts, params)

    def by_reference(q, k, v, positions, cos_sin, kc, vc, slots, tables, lens, scale, window=None):
        q, _ = ref.qk_norm_rope_store_kv(q, k, v, None, None, 0.0, positions, cos_sin, kc, vc, slots)
        return ref.decode_attention(q, kc, vc, tables, lens, scale, window)

    monkeypatch.setattr(cpu_decode, "rope_store_decode_attention", by_reference)
    monkeypatch.setattr(dispatch_pointwise, "_cpu_float32", lambda x, w: False)
    want = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=64).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in lean] == [o.outputs[0].token_ids for o in want]


def test_bfloat16_keeps_its_dtype_and_matches_reference():
    # the float32 RoPE tables must not promote a bf16 step (o_proj then refused the float32 rows)
    q, k, v, pos, cs, kc, vc, slots, tables, seq = _case([13, 5])
    q, k, v, kc, vc = (t.to(torch.bfloat16) for t in (q, k, v, kc, vc))
    kc2, vc2 = kc.clone(), vc.clone()
    got = cpu_decode.rope_store_decode_attention(q, k, v, pos, cs, kc, vc, slots, tables, seq, 0.25)
    qr, _ = ref.qk_norm_rope_store_kv(q, k, v, None, None, 0.0, pos, cs, kc2, vc2, slots)
    want = ref.decode_attention(qr, kc2, vc2, tables, seq, 0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
