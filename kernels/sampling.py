"""Temperature sampling fused into one pass over the logits (matches reference.sample_tokens in law).

The engine's sampler draws argmax_i(p_i / E_i), E_i ~ Exp(1), p = softmax(logits / T) (the exponential
race). Since softmax only rescales by a row constant, that equals argmax_i(logits_i / T - ln E_i): no
softmax, no probability tensor, no noise tensor. Here E_i = -ln(U_i) with U_i from Philox keyed by
(seed, row * ceil(vocab / 4) + i // 4), each counter giving four draws, and a row with T == 0 is
greedy (plain argmax of its logits, ties to the lowest index, as torch.argmax). The scores are taken in
base 2 (_race_scores): divided by ln 2 and shifted by a constant, they rank the tokens alike, and
compiled kernels take the hardware's approximate log2 for both logarithms. With a grammar mask
the pass also bans the tokens whose bit is 0 in the row's bitmask (reference.apply_token_bitmask_ then
the same draw): rows name a row of a shared mask table, so a mask many requests share is uploaded once
and the logits are never rewritten.

One launch: programs of (row, chunk of the vocabulary) write their best (score, index), and the
row's program that arrives last (an arrival counter per row, left zeroed) picks the row's best over
its chunks (ties to the lowest index). Batches past the counters take a second launch for that.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import arrival_counters, is_interpreting, kernel, next_pow2


# the seed changes every step: specialized like other ints (== 1, % 16 == 0), a seed that happened to be
# a multiple of 16 compiled a second variant in the middle of serving
@kernel(do_not_specialize=["seed"])
def _sample_chunk_kernel(
    logits_ptr,  # (batch, vocab), row stride stride_l
    temp_ptr,  # (batch,) float32; 0 = greedy
    best_val_ptr,  # (batch, num_chunks) float32
    best_idx_ptr,  # (batch, num_chunks) int32
    vocab,
    stride_l,
    num_chunks,
    chunk,  # vocabulary entries per program, a multiple of BLOCK
    seed,  # SEED_PTR: a pointer to the (1,) int64 seed on the device (CUDA graphs replay it)
    mask_ptr,  # (table rows, words) int32 bitmasks; unused unless HAS_MASK
    mask_row_ptr,  # (batch,) int32: each row's mask in the table, -1 = none
    stride_m,
    counter_ptr,  # FUSED_REDUCE: (>= batch,) int32 zeros, left zeroed
    out_ptr,  # FUSED_REDUCE: (batch,) int64 sampled ids
    BLOCK: tl.constexpr,
    HAS_MASK: tl.constexpr,
    SEED_PTR: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    BLOCK_C: tl.constexpr,  # >= num_chunks
    FAST_LOG: tl.constexpr,  # the approximate hardware log2 (compiled kernels; _log2)
):
    row = tl.program_id(0)
    c = tl.program_id(1)
    if HAS_MASK:
        m_row = tl.load(mask_row_ptr + row).to(tl.int64)
        m_base = mask_ptr + tl.maximum(m_row, 0) * stride_m
    if SEED_PTR:
        key = tl.load(seed).to(tl.int32)
    else:
        key = seed
    t = tl.load(temp_ptr + row)
    sampled = t > 0.0
    inv_t = _inv_temperature(t, sampled)
    best_val = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    best_idx = tl.zeros((BLOCK,), dtype=tl.int32)
    start = c * chunk
    base = logits_ptr + row.to(tl.int64) * stride_l
    for off in range(start, start + chunk, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        mask = cols < vocab
        lg = tl.load(base + cols, mask=mask, other=float("-inf")).to(tl.float32)
        if HAS_MASK:
            words = tl.load(m_base + cols // 32, mask=mask, other=-1)  # a row of -1 reads table row 0
            lg = tl.where((((words >> (cols % 32)) & 1) != 0) | (m_row < 0), lg, float("-inf"))
        u = _uniforms(key, row * ((vocab + 3) // 4) + off // 4, BLOCK)  # U[0, 1), one per column
        score = tl.where(sampled, _race_scores(lg, inv_t, u, FAST_LOG), lg)
        better = score > best_val  # strict: a lane keeps its earliest (lowest) index on ties
        best_val = tl.where(better, score, best_val)
        best_idx = tl.where(better, cols, best_idx)
    top = tl.max(best_val, axis=0)
    idx = tl.min(tl.where(best_val == top, best_idx, 2147483647), axis=0)
    idx = tl.where(top == float("-inf"), start, idx)  # all -inf: the chunk's first index, as argmax
    tl.store(best_val_ptr + row * num_chunks + c, top)
    tl.store(best_idx_ptr + row * num_chunks + c, idx)
    if FUSED_REDUCE:
        # release this chunk's best; the row's last chunk to arrive reduces them all
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
        if arrived == num_chunks - 1:
            tl.store(counter_ptr + row, 0)  # zeroed for the next launch
            _pick_row(best_val_ptr, best_idx_ptr, out_ptr, row, num_chunks, BLOCK_C)


@triton.jit
def _pick_row(best_val_ptr, best_idx_ptr, out_ptr, row, num_chunks, BLOCK_C: tl.constexpr):
    """The row's token from its chunks' bests: the highest score; chunks are in index order, so the
    lowest index among tied chunks is the row's first maximum (a helper of both reductions)."""
    offs = tl.arange(0, BLOCK_C)
    inside = offs < num_chunks
    at = row * num_chunks + offs
    vals = tl.load(best_val_ptr + at, mask=inside, other=float("-inf"), cache_modifier=".cg")
    idxs = tl.load(best_idx_ptr + at, mask=inside, other=2147483647, cache_modifier=".cg")
    best = tl.max(vals, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(vals == best, idxs, 2147483647), axis=0).to(tl.int64))


LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e) = 1 / ln 2


@triton.jit
def _inv_temperature(t, sampled):
    """log2(e) / T for _race_scores (1 where the row is greedy)."""
    return LOG2E / tl.where(sampled, t, 1.0)


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2(x); FAST: the hardware's approximate instruction (relative error < 2^-22; -inf at 0, +inf
    at +inf), a quarter of the library call's cost at a wide batch's 39 M draws a step."""
    if FAST:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)  # fmt: skip
    return tl.log2(x)


@triton.jit
def _neg_log2_uniform(u, FAST: tl.constexpr):
    """-log2(u) for u in [0, 1) to ~1e-5 relative (exact in the interpreter). Near 1 the result is tiny
    (~1e-7 at 1 - 2^-24) while the approximate log2's absolute error is ~2^-22 there: for u > 1 - 2^-6
    it comes from v = 1 - u (exact) by the series -ln(1 - v) = v + v^2/2 + v^3/3 + v^4/4 + ..., whose
    next term is below 2^-26 of the sum."""
    if FAST:
        v = 1.0 - u
        series = (v + v * v * (0.5 + v * (0.3333333333333333 + v * 0.25))) * LOG2E
        return tl.where(v < 0.015625, series, -_log2(u, True))
    return -tl.log2(u)


@triton.jit
def _race_scores(lg, inv_t, u, FAST: tl.constexpr):
    """The exponential race's scores in base 2: lg * log2(e) / T - log2(-log2 U) equals
    (lg / T - ln(-ln U)) / ln 2 plus a constant, so the winner is the same. inv_t = log2(e) / T;
    U == 0 scores -inf (that token cannot win). Shared by kernels.lm_head_sample, whose draws must
    equal sample_tokens' on the same logits."""
    return lg * inv_t - _log2(_neg_log2_uniform(u, FAST), FAST)


@triton.jit
def _uniforms(key, first, BLOCK: tl.constexpr):
    """(BLOCK,) uniforms in [0, 1) for BLOCK consecutive columns: one Philox counter (first, first + 1,
    ...) yields four draws, so a row's counters are (row, column // 4) and never overlap another's."""
    r0, r1, r2, r3 = tl.randint4x(key, first + tl.arange(0, BLOCK // 4))
    return tl.uint_to_uniform_float(tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), (BLOCK,)))


@kernel
def _sample_reduce_kernel(
    best_val_ptr,  # (batch, num_chunks) float32
    best_idx_ptr,  # (batch, num_chunks) int32
    out_ptr,  # (batch,) int64
    num_chunks,
    BLOCK: tl.constexpr,  # >= num_chunks
):
    _pick_row(best_val_ptr, best_idx_ptr, out_ptr, tl.program_id(0), num_chunks, BLOCK)


def sample_tokens(
    logits: torch.Tensor,  # (batch, vocab) float32/bf16/fp16
    temperatures: torch.Tensor,  # (batch,) float32 on logits' device; 0 = greedy
    seed: int | torch.Tensor,  # or a (1,) int64 device tensor holding it (read at run time)
    num_chunks: int | None = None,
    mask: torch.Tensor | None = None,  # (table rows, >= ceil(vocab / 32)) int32 bitmasks
    mask_rows: torch.Tensor | None = None,  # (batch,) int32: row of `mask` per logits row, -1 = none
    out: torch.Tensor | None = None,  # (batch,) int64 to write the tokens into (a graph's static buffer)
) -> torch.Tensor:  # (batch,) int64: out, or a new tensor
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be (batch, vocab), last dim contiguous, got {tuple(logits.shape)}")
    batch, vocab = logits.shape
    if temperatures.shape != (batch,) or temperatures.dtype != torch.float32:
        raise ValueError("temperatures must be (batch,) float32")
    if (mask is None) != (mask_rows is None):
        raise ValueError("mask and mask_rows go together")
    if mask is not None:
        if mask.dtype != torch.int32 or mask.dim() != 2 or mask.stride(-1) != 1 or mask.shape[1] * 32 < vocab:
            raise ValueError(f"mask must be (rows, >= {(vocab + 31) // 32}) int32, got {tuple(mask.shape)}")
        if mask_rows.shape != (batch,) or mask_rows.dtype != torch.int32:
            raise ValueError("mask_rows must be (batch,) int32")
    if out is None:
        out = torch.empty((batch,), dtype=torch.int64, device=logits.device)
    elif out.shape != (batch,) or out.dtype != torch.int64 or not out.is_contiguous():
        raise ValueError(f"out must be ({batch},) int64, contiguous")
    if batch == 0:
        return out
    interp = is_interpreting(logits)
    block = max(16, min(next_pow2(vocab), 256 if interp else 1024))  # a multiple of 4 (see _uniforms)
    if num_chunks is None:
        # programs of 2 blocks: 75 per row of the 152k vocabulary, so batch 1 spreads over the SMs and
        # batch 32 has ~2400 programs in flight (fewer, larger chunks starve the wide batches)
        num_chunks = 1 if interp else triton.cdiv(vocab, 2 * block)
    chunk = triton.cdiv(triton.cdiv(vocab, num_chunks), block) * block
    num_chunks = triton.cdiv(vocab, chunk)
    best_val = torch.empty((batch, num_chunks), dtype=torch.float32, device=logits.device)
    best_idx = torch.empty((batch, num_chunks), dtype=torch.int32, device=logits.device)
    seed_ptr = isinstance(seed, torch.Tensor)
    if seed_ptr and (seed.shape != (1,) or seed.dtype != torch.int64 or seed.device != logits.device):
        raise ValueError("a seed tensor must be (1,) int64 on the logits' device")
    if not seed_ptr:
        seed = int(seed) & 0x7FFFFFFF
    counters = _counters(logits.device)
    fused = batch <= counters.shape[0]
    _sample_chunk_kernel[(batch, num_chunks)](
        logits, temperatures.contiguous(), best_val, best_idx, vocab, logits.stride(0), num_chunks, chunk,
        seed, mask if mask is not None else temperatures, mask_rows if mask is not None else temperatures,
        mask.stride(0) if mask is not None else 0, counters, out, BLOCK=block, HAS_MASK=mask is not None,
        SEED_PTR=seed_ptr, FUSED_REDUCE=fused, BLOCK_C=next_pow2(num_chunks), FAST_LOG=not interp,
        num_warps=4,
    )  # fmt: skip
    if not fused:
        _sample_reduce_kernel[(batch,)](
            best_val, best_idx, out, num_chunks, BLOCK=next_pow2(num_chunks), num_warps=1
        )
    return out


MAX_FUSED_ROWS = 4096


def _counters(device: torch.device) -> torch.Tensor:
    """Per-row arrival counters of the in-kernel reduction."""
    return arrival_counters("sampling", MAX_FUSED_ROWS, device)
