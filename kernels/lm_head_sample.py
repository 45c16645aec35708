"""The end of a decode step in one launch for small batches (M <= 4, tuned for M == 1): the final
RMSNorm (optional), the lm_head and the token draw.

At batch 1 a decode step ends with logits = x @ W^T over the whole vocabulary (a 311 MB weight stream
in bf16 for Qwen3-0.6B) and then kernels.sampling.sample_tokens over those logits. Here each program
takes blocks of BLOCK_N whole rows of W (K <= MAX_K: a row in registers), asks for its next block
before it works on the current one (a block's loads stay in flight behind the math), computes the
block's logits in fp32, rounds them to x's dtype as the lm_head output is rounded, optionally stores
them, and scores them as sampling._sample_chunk_kernel does: the same Philox counters (row, column //
4) and the same score, logit / T - log(-log U) (the plain logit when T == 0), strict `>` so ties keep
the lowest index. The tokens therefore equal sample_tokens(logits, temperatures, seed) on the logits
this kernel writes.

Program p takes the blocks p, p + P, p + 2P, ... (P = num_programs, a few per SM, all resident) and
writes its best (score, index) per row; the program that arrives last (an arrival counter, left
zeroed) reduces the P partials of every row to the token. No grammar masks: rows with a mask take the
lm_head and sample_tokens separately.

As the end of a step graph the last program also finishes the step, so that no launch follows: it
advances the device seed (`advance_seed`; every program has read it before it arrives) and writes the
tokens into row `counter % slots` of a pinned host ring, advancing the counter (`publish`, as
kernels.publish does in a launch of its own).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._jit import (
    arrival_counters,
    interpret_forced,
    is_interpreting,
    kernel,
    next_pow2,
    recording,
    sm_count,
)
from kernels.publish import ring_target, write_ring_row
from kernels.sampling import _inv_temperature, _race_scores, _uniforms

MAX_M = 4
MAX_K = 4096  # whole rows of W in a program's registers
MAX_PROGRAMS = 4096  # the last program reduces all partials of a row in one (BLOCK_M, BLOCK_P) load


class LmHeadConfig(NamedTuple):
    block_n: int  # rows of W per block: a power of two >= 4 (Philox draws come in fours)
    num_warps: int
    num_programs: int  # P; <= the number of blocks and <= MAX_PROGRAMS


@triton.jit
def _fold_block(lg, off, N, logits_ptr, stride_l, rm, mask_m, key, quads, sampled, inv_t, best_val, best_idx,
                HAS_LOGITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                FAST_LOG: tl.constexpr):  # fmt: skip
    """A block's logits (BLOCK_M, BLOCK_N), columns off.., stored if asked and folded into the lanes'
    bests with sampling's draw for (row, column)."""
    rn = off + tl.arange(0, BLOCK_N)
    mask_n = rn < N
    if HAS_LOGITS:
        tl.store(
            logits_ptr + rm[:, None] * stride_l + rn[None, :], lg, mask=mask_m[:, None] & mask_n[None, :]
        )
    lg = tl.where(mask_n[None, :], lg.to(tl.float32), float("-inf"))
    u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # U[0, 1), one per (row, column)
    for r in tl.static_range(BLOCK_M):
        u = tl.where(rm[:, None] == r, _uniforms(key, r * quads + off // 4, BLOCK_N)[None, :], u)
    score = tl.where(sampled[:, None], _race_scores(lg, inv_t[:, None], u, FAST_LOG), lg)
    better = score > best_val  # strict: a lane keeps its earliest (lowest) index on ties
    return tl.where(better, score, best_val), tl.where(better, rn[None, :], best_idx)


# the seed changes every step: not specialized, as in kernels.sampling
@kernel(do_not_specialize=["seed"])
def _lm_head_sample_kernel(
    x_ptr,  # (M, K), row stride stride_x
    w_ptr,  # (N, K), row stride stride_w
    temp_ptr,  # (M,) float32; 0 = greedy
    logits_ptr,  # (M, N) in x's dtype, row stride stride_l; unused unless HAS_LOGITS
    best_val_ptr,  # (M, num_programs) float32
    best_idx_ptr,  # (M, num_programs) int32
    counter_ptr,  # (1,) int32 zero, left zeroed
    out_ptr,  # (M,) int64 sampled ids
    seed,  # int, or with SEED_PTR a pointer to the (1,) int64 seed on the device
    ring_ptr,  # (SLOTS, ring_n) int64 pinned host ring; unused unless PUBLISH
    pub_ptr,  # (1,) int64 on the device: the ring's launches so far; unused unless PUBLISH
    ring_n,
    r_ptr,  # (M, K) residual, row stride stride_r; unused unless NORM
    nw_ptr,  # (K,) RMSNorm weight; unused unless NORM
    eps,
    stride_r,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_l,
    num_blocks,  # cdiv(N, BLOCK_N)
    num_programs,
    HAS_LOGITS: tl.constexpr,
    SEED_PTR: tl.constexpr,
    ADVANCE_SEED: tl.constexpr,  # the last program stores seed + 1 (SEED_PTR)
    PUBLISH: tl.constexpr,  # the last program writes the tokens into the host ring
    SLOTS: tl.constexpr,
    NORM: tl.constexpr,  # the lm_head reads rms_norm(x + residual)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # >= K
    BLOCK_P: tl.constexpr,  # >= num_programs
    FAST_LOG: tl.constexpr,  # as kernels.sampling's
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, BLOCK_N)
    mask_m = rm < M
    inside_k = rk < K
    quads = (N + 3) // 4  # Philox counters per row: row r, column c draws from counter r * quads + c // 4
    # the first block's weights (BLOCK_N, BLOCK_K): they depend on no kernel before
    rn = pid * BLOCK_N + rows
    w_next = tl.load(w_ptr + rn.to(tl.int64)[:, None] * stride_w + rk[None, :],
                     mask=(rn < N)[:, None] & inside_k[None, :], other=0.0)  # fmt: skip
    if SEED_PTR:
        seed_now = tl.load(seed)
        key = seed_now.to(tl.int32)
    else:
        key = seed
    t = tl.load(temp_ptr + rm, mask=mask_m, other=0.0)  # (BLOCK_M,)
    sampled = t > 0.0
    inv_t = _inv_temperature(t, sampled)  # (BLOCK_M,)
    x_in = mask_m[:, None] & inside_k[None, :]
    x = tl.load(x_ptr + rm[:, None] * stride_x + rk[None, :], mask=x_in, other=0.0)  # (BLOCK_M, BLOCK_K)
    if NORM:  # x = rms_norm(x + residual), rounded as reference.fused_add_rms_norm rounds
        r = tl.load(r_ptr + rm[:, None] * stride_r + rk[None, :], mask=x_in, other=0.0)
        h = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=1) / K + eps)  # (BLOCK_M,)
        h = (h * rstd[:, None]).to(x_ptr.dtype.element_ty)
        nw = tl.load(nw_ptr + rk, mask=inside_k, other=0.0)
        x = (nw.to(tl.float32)[None, :] * h.to(tl.float32)).to(x_ptr.dtype.element_ty)
    xf = x.to(tl.float32)
    best_val = tl.full((BLOCK_M, BLOCK_N), float("-inf"), dtype=tl.float32)
    best_idx = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for blk in range(pid, num_blocks, num_programs):
        w = w_next
        rn = (blk + num_programs) * BLOCK_N + rows  # the next block, asked before this one's math
        w_next = tl.load(w_ptr + rn.to(tl.int64)[:, None] * stride_w + rk[None, :],
                         mask=(rn < N)[:, None] & inside_k[None, :], other=0.0)  # fmt: skip
        lg = tl.sum(xf[:, None, :] * w.to(tl.float32)[None, :, :], axis=2).to(x_ptr.dtype.element_ty)
        best_val, best_idx = _fold_block(lg, blk * BLOCK_N, N, logits_ptr, stride_l, rm, mask_m, key,
                                         quads, sampled, inv_t, best_val, best_idx, HAS_LOGITS, BLOCK_M,
                                         BLOCK_N, FAST_LOG)  # fmt: skip
    top = tl.max(best_val, axis=1)  # (BLOCK_M,)
    idx = tl.min(tl.where(best_val == top[:, None], best_idx, 2147483647), axis=1)
    idx = tl.where(top == float("-inf"), pid * BLOCK_N, idx)  # all -inf: the first index, as argmax
    tl.store(best_val_ptr + rm * num_programs + pid, top, mask=mask_m)
    tl.store(best_idx_ptr + rm * num_programs + pid, idx, mask=mask_m)
    # release this program's bests; the last program to arrive reduces them all
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == num_programs - 1:
        tl.store(counter_ptr, 0)  # zeroed for the next launch
        rp = tl.arange(0, BLOCK_P)
        at = rm[:, None] * num_programs + rp[None, :]  # (BLOCK_M, BLOCK_P)
        inside = mask_m[:, None] & (rp < num_programs)[None, :]
        vals = tl.load(best_val_ptr + at, mask=inside, other=float("-inf"), cache_modifier=".cg")
        idxs = tl.load(best_idx_ptr + at, mask=inside, other=2147483647, cache_modifier=".cg")
        best = tl.max(vals, axis=1)
        token = tl.min(tl.where(vals == best[:, None], idxs, 2147483647), axis=1)  # ties: the lowest index
        tl.store(out_ptr + rm, token.to(tl.int64), mask=mask_m)
        if ADVANCE_SEED:
            tl.store(seed, seed_now + 1)
        if PUBLISH:
            write_ring_row(ring_ptr, pub_ptr, ring_n, rm, token.to(tl.int64), mask_m, SLOTS)


def choose_config(
    m: int, n: int, device: torch.device, block_n=None, num_warps=None, num_programs=None
) -> LmHeadConfig:
    """The given values, the rest by default. Interpreter: blocks of 16 rows, 8 programs. GPU: at M = 1
    blocks of 4 rows over 2 warps, 8 programs an SM (`python -m bench.kernels --sweep-lm-head` times the
    others); M = 2..4: 4 warps, 4 programs an SM (the engine takes this kernel at M = 1 only)."""
    interp = not recording() and (device.type == "cpu" or interpret_forced())
    pick = lambda given, default: default if given is None else given
    block_n = pick(block_n, 16 if interp else 4)
    num_warps = pick(num_warps, 4 if interp or m > 1 else 2)
    if block_n < 4 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 4 (Philox draws come in fours), got {block_n}")
    most = min(triton.cdiv(n, block_n), MAX_PROGRAMS)
    if num_programs is None:
        sms = sm_count(device) if device.type == "cuda" else 132
        num_programs = min(most, 8 if interp else (8 if m == 1 else 4) * sms)
    if not 1 <= num_programs <= most:
        raise ValueError(f"num_programs must be in [1, {most}] for block_n {block_n}, got {num_programs}")
    return LmHeadConfig(block_n, num_warps, num_programs)


def lm_head_sample(
    x: torch.Tensor,  # (M, K), M <= 4, K <= MAX_K; float32/float16/bfloat16
    weight: torch.Tensor,  # (N, K) in x's dtype
    temperatures: torch.Tensor,  # (M,) float32 on x's device; 0 = greedy
    seed: int | torch.Tensor,  # or a (1,) int64 device tensor holding it (read at run time)
    out: torch.Tensor | None = None,  # (M,) int64 to write the tokens into (a graph's static buffer)
    logits_out: torch.Tensor | None = None,  # (M, N) in x's dtype: the logits, as F.linear(x, weight)
    *,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_programs: int | None = None,
    residual: torch.Tensor | None = None,  # (M, K): the lm_head reads rms_norm(x + residual) ...
    norm: tuple[torch.Tensor, float] | None = None,  # ... with this (K,) weight and eps
    advance_seed: bool = False,  # the seed tensor is incremented once the draw has read it
    publish: tuple[torch.Tensor, torch.Tensor] | None = None,  # (ring (slots, n >= M) int64, counter (1,))
) -> torch.Tensor:  # (M,) int64: out, or a new tensor
    """sample_tokens(F.linear(x, weight), temperatures, seed) in one launch (CUDA-graph safe); with
    residual and norm, of F.linear(fused_add_rms_norm(x, residual, *norm)[0], weight). advance_seed
    and publish (as kernels.publish.publish_tokens, the ring pinned host memory on CUDA) end the step
    in the same launch."""
    out = _checked(x, weight, temperatures, seed, out, logits_out)
    seed_ptr = isinstance(seed, torch.Tensor)
    if advance_seed and not seed_ptr:
        raise ValueError("advance_seed needs the seed as a (1,) int64 device tensor")
    ring, pub = out, out  # dummy pointers unless PUBLISH
    if publish is not None:
        ring, pub = ring_target(*publish, x.shape[0], x.device), publish[1]
    (m, k), n = x.shape, weight.shape[0]
    cfg = choose_config(m, n, x.device, block_n, num_warps, num_programs)
    has_norm = norm is not None
    if has_norm != (residual is not None):
        raise ValueError("residual and norm go together")
    if has_norm:
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
            raise ValueError(f"residual must be {tuple(x.shape)} {x.dtype} with a contiguous last dim")
        if norm[0].shape != (k,) or norm[0].dtype != x.dtype or not norm[0].is_contiguous():
            raise ValueError(f"the norm weight must be ({k},) {x.dtype}, contiguous")
    best_val = torch.empty((m, cfg.num_programs), dtype=torch.float32, device=x.device)
    best_idx = torch.empty((m, cfg.num_programs), dtype=torch.int32, device=x.device)
    _lm_head_sample_kernel[(cfg.num_programs,)](
        x, weight, temperatures, logits_out if logits_out is not None else x, best_val, best_idx,
        arrival_counters("lm_head_sample", 1, x.device), out, seed if seed_ptr else int(seed) & 0x7FFFFFFF,
        ring, pub, publish[0].shape[1] if publish is not None else 0,
        residual if has_norm else x, norm[0] if has_norm else x, norm[1] if has_norm else 0.0,
        residual.stride(0) if has_norm else 0,
        m, n, k, x.stride(0), weight.stride(0), logits_out.stride(0) if logits_out is not None else 0,
        triton.cdiv(n, cfg.block_n), cfg.num_programs, HAS_LOGITS=logits_out is not None, SEED_PTR=seed_ptr,
        ADVANCE_SEED=advance_seed, PUBLISH=publish is not None,
        SLOTS=publish[0].shape[0] if publish is not None else 1, NORM=has_norm,
        BLOCK_M=next_pow2(m), BLOCK_N=cfg.block_n, BLOCK_K=next_pow2(k),
        BLOCK_P=next_pow2(cfg.num_programs), FAST_LOG=not is_interpreting(x), num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


def _checked(x, weight, temperatures, seed, out, logits_out) -> torch.Tensor:  # (M,) int64: out or new
    if x.dim() != 2 or x.stride(-1) != 1 or not 1 <= x.shape[0] <= MAX_M or not 1 <= x.shape[1] <= MAX_K:
        raise ValueError(
            f"x must be (M <= {MAX_M}, K <= {MAX_K}) with a contiguous last dim, got {tuple(x.shape)}"
        )
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    (m, k), dev = x.shape, x.device
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] != k or weight.stride(-1) != 1:
        raise ValueError(
            f"weight must be (N >= 1, {k}) with a contiguous last dim, got {tuple(weight.shape)}"
        )
    if weight.dtype != x.dtype or weight.device != dev:
        raise ValueError(f"weight must be {x.dtype} on {dev}, got {weight.dtype} on {weight.device}")
    if temperatures.shape != (m,) or temperatures.dtype != torch.float32 or temperatures.device != dev:
        raise ValueError(f"temperatures must be ({m},) float32 on x's device")
    if isinstance(seed, torch.Tensor) and (
        seed.shape != (1,) or seed.dtype != torch.int64 or seed.device != dev
    ):
        raise ValueError("a seed tensor must be (1,) int64 on x's device")
    n = weight.shape[0]
    if logits_out is not None and (
        logits_out.shape != (m, n) or logits_out.dtype != x.dtype or logits_out.stride(-1) != 1
        or logits_out.device != dev
    ):  # fmt: skip
        raise ValueError(f"logits_out must be ({m}, {n}) {x.dtype} with a contiguous last dim on x's device")
    if out is None:
        return torch.empty((m,), dtype=torch.int64, device=dev)
    if out.shape != (m,) or out.dtype != torch.int64 or not out.is_contiguous() or out.device != dev:
        raise ValueError(f"out must be ({m},) int64, contiguous, on x's device")
    return out
