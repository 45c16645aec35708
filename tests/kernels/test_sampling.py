"""kernels.sampling: the fused temperature sampler draws from softmax(logits / T); greedy rows are exact."""

from __future__ import annotations

import pytest
import torch

from kernels import dispatch as ops
from kernels import reference as ref
from kernels.sampling import sample_tokens
from tests.kernels.paged import gpu


def _chi2_ok(tokens: torch.Tensor, probs: torch.Tensor) -> bool:
    # Pearson chi-square over the tokens of expected count >= 5; 99.99th percentile of chi2(df <= 12) < 40
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    keep = expected >= 5
    stat = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    assert counts[~keep].sum() <= expected[~keep].sum() * 3 + 10
    return stat < 40.0


def _check_law(device, rows, chunks=None):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0, float("-inf"), 1.5], device=device)
    temp = 0.7
    probs = torch.softmax(logits / temp, dim=-1).cpu()
    batch = logits.expand(rows, -1).contiguous()  # every row draws its own noise
    temps = torch.full((rows,), temp, device=device)
    tokens = sample_tokens(batch, temps, seed=123, num_chunks=chunks).cpu()
    assert tokens.dtype == torch.int64 and int((tokens == 6).sum()) == 0  # -inf never drawn
    assert _chi2_ok(tokens, probs)
    few = slice(0, 16)
    again = sample_tokens(batch[few], temps[few], seed=123, num_chunks=chunks).cpu()
    assert torch.equal(tokens[few], again)  # same seed, same draw
    other = sample_tokens(batch[few], temps[few], seed=124, num_chunks=chunks).cpu()
    assert not torch.equal(tokens[few], other)


def test_sampling_law_matches_softmax():
    _check_law("cpu", 400)  # the interpreter runs ~100 programs/s: the GPU test draws 20k


def test_sampling_law_with_chunks():
    _check_law("cpu", 100, chunks=3)  # chunk boundaries inside the row: the row reduction picks right


def test_reference_sampler_law():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0, float("-inf"), 1.5]]).expand(3000, -1)
    tokens = ref.sample_tokens(logits, torch.full((3000,), 0.7), gen)
    assert _chi2_ok(tokens, torch.softmax(logits[0] / 0.7, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_greedy_rows_are_argmax(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 300, generator=g) * 3).to(dtype)
    logits[1, 7] = logits[1, 250] = logits[1].max() + 1  # a tie: lowest index, as torch.argmax
    logits[3] = float("-inf")  # all masked: index 0, as torch.argmax
    temps = torch.tensor([0.0, 0.0, 0.8, 0.0, 1.0])
    got = sample_tokens(logits, temps, seed=5, num_chunks=2)
    greedy = temps == 0
    assert torch.equal(got[greedy], logits.float().argmax(dim=-1)[greedy])
    assert got[1] == 7 and got[3] == 0
    assert torch.equal(ops.sample_tokens(logits.float(), temps, 5)[greedy], logits.float().argmax(-1)[greedy])


@gpu
def test_gpu_sampling():
    _check_law("cuda", 20000)
    logits = torch.randn(64, 151936, device="cuda") * 4
    greedy = torch.zeros(64, device="cuda")
    assert torch.equal(sample_tokens(logits, greedy, seed=1), logits.argmax(dim=-1))
    hot = torch.full((64,), 0.6, device="cuda")
    assert torch.equal(ops.sample_tokens(logits, hot, 3), sample_tokens(logits, hot, 3))


def test_seed_is_not_specialized():
    # a per-step seed must not pick compiled variants (a multiple of 16 would compile a new one)
    from triton.runtime.jit import JITFunction

    from kernels.sampling import _sample_chunk_kernel

    jf = JITFunction(_sample_chunk_kernel.fn, **_sample_chunk_kernel.jit_kwargs)
    assert [p.name for p in jf.params if p.do_not_specialize] == ["seed"]


def _mask_table(vocab: int, rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32 + 1  # one word wider than needed, as the engine's tables may be
    table = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int32)
    table[0] = 0
    table[0, 0] = 0b100  # only token 2 allowed
    return table


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_masked_greedy_rows_match_apply_then_argmax(dtype):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(5, 300, generator=g) * 3).to(dtype)
    table = _mask_table(300, 4, 2)
    rows = torch.tensor([2, -1, 0, 3, 1], dtype=torch.int32)
    before = logits.clone()
    got = sample_tokens(logits, torch.zeros(5), seed=9, num_chunks=3, mask=table, mask_rows=rows)
    expect = logits.float().clone()
    for i, r in enumerate(rows.tolist()):
        if r >= 0:
            ref.apply_token_bitmask_(expect[i : i + 1], table[r : r + 1])
    assert torch.equal(got, expect.argmax(dim=-1))
    assert got[2] == 2  # the one allowed token
    assert torch.equal(logits, before)  # the logits themselves are not rewritten
    # the reference path (CPU tensors through dispatch without Triton) applies the same masks
    assert torch.equal(ops.masked_by_rows(logits.float(), table, rows).argmax(-1), got)


def test_masked_sampling_law():
    # sampled rows draw from softmax over the allowed tokens only
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0, 0.3, 1.5]).expand(300, -1).contiguous()
    table = torch.tensor([[0b10101101]], dtype=torch.int32)  # tokens 0, 2, 3, 5, 7
    allowed = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1], dtype=torch.bool)
    rows = torch.zeros(300, dtype=torch.int32)
    tokens = sample_tokens(logits, torch.full((300,), 0.7), seed=4, mask=table, mask_rows=rows)
    assert allowed[tokens].all()
    probs = torch.softmax(torch.where(allowed, logits[0] / 0.7, float("-inf")), dim=-1)
    assert _chi2_ok(tokens, probs)


def test_mask_arguments_are_checked():
    logits, temps = torch.zeros(2, 64), torch.zeros(2)
    with pytest.raises(ValueError, match="together"):
        sample_tokens(logits, temps, 1, mask=torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="mask must be"):
        sample_tokens(logits, temps, 1, mask=torch.zeros(1, 1, dtype=torch.int32), mask_rows=torch.zeros(2))


@gpu
def test_gpu_masked_sampling():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 151936, generator=g) * 4).to(torch.bfloat16).cuda()
    table = _mask_table(151936, 8, 5).cuda()
    rows = torch.randint(-1, 8, (64,), generator=g, dtype=torch.int32).cuda()
    got = sample_tokens(logits, torch.zeros(64, device="cuda"), seed=1, mask=table, mask_rows=rows)
    assert torch.equal(got, ops.masked_by_rows(logits.float(), table, rows).argmax(dim=-1))
    hot = sample_tokens(logits, torch.full((64,), 0.8, device="cuda"), seed=2, mask=table, mask_rows=rows)
    allowed = ops.masked_by_rows(logits.float(), table, rows).gather(1, hot[:, None]) > float("-inf")
    assert allowed.all()


def test_in_kernel_reduction_equals_the_second_launch(monkeypatch):
    from kernels import sampling

    g = torch.Generator().manual_seed(8)
    logits = torch.randn(5, 300, generator=g) * 2
    temps = torch.tensor([0.0, 0.8, 0.0, 1.0, 0.5])
    fused = sample_tokens(logits, temps, seed=3, num_chunks=3)
    assert int(sampling._counters(logits.device).abs().sum()) == 0  # left zeroed for the next launch
    # a batch past the counters reduces in a second launch: the same draw
    from kernels import _jit

    monkeypatch.setitem(_jit._COUNTERS, ("sampling", "cpu", None), torch.zeros(2, dtype=torch.int32))
    assert torch.equal(sample_tokens(logits, temps, seed=3, num_chunks=3), fused)


def test_seed_from_a_device_tensor_equals_the_int_seed():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 200, generator=g)
    temps = torch.full((4,), 0.9)
    want = sample_tokens(logits, temps, seed=77, num_chunks=2)
    assert torch.equal(sample_tokens(logits, temps, torch.tensor([77]), num_chunks=2), want)
    with pytest.raises(ValueError, match="seed tensor"):
        sample_tokens(logits, temps, torch.tensor([77], dtype=torch.int32))


@gpu
def test_fast_neg_log2_of_uniforms_is_accurate_near_one():
    # the compiled sampler's -log2(U) (approximate hardware log2, the series near 1) against float64,
    # over every float32 in (1 - 2^-6, 1) (spacing 2^-24: the series' side), a spread of others
    # from the smallest draws up to 0.99, and 1 - 2^-6 itself (the first on the log2 side)
    import triton
    import triton.language as tl

    from kernels.sampling import _log2, _neg_log2_uniform

    @triton.jit
    def probe(u_ptr, e_ptr, g_ptr, n, BLOCK: tl.constexpr):
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        u = tl.load(u_ptr + at, mask=at < n, other=0.5)
        e = _neg_log2_uniform(u, True)
        tl.store(e_ptr + at, e, mask=at < n)
        tl.store(g_ptr + at, _log2(e, True), mask=at < n)

    near_one = 1.0 - torch.arange(1, 2**18, dtype=torch.float64) * 2.0**-24
    spread = torch.linspace(2.0**-32, 0.99, 100_000, dtype=torch.float64)
    spread = torch.cat([spread, torch.tensor([1.0 - 2.0**-6], dtype=torch.float64)])
    u = torch.cat([near_one, spread]).float().cuda()
    e, g = torch.empty_like(u), torch.empty_like(u)
    probe[(triton.cdiv(u.numel(), 1024),)](u, e, g, u.numel(), BLOCK=1024)
    truth = -torch.log2(u.double())
    rel = ((e.double() - truth).abs() / truth).cpu()
    assert bool(torch.isfinite(e).all()) and bool((e > 0).all())
    assert rel.max().item() < 2e-5, rel.max().item()
    assert rel[: near_one.numel()].max().item() < 1e-6  # the series' side, where the scores peak
    assert (g.double() - torch.log2(truth)).abs().max().item() < 5e-5  # the Gumbel term in base 2
