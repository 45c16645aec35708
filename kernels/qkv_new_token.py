"""The qkv projection of a decode step's new tokens with their whole pre-attention work in its epilogue:
q = x @ W_q^T, k and v likewise, from the residual stream x read un-normalized (the layer's input RMSNorm
folded into W, models.llama's fold_norms), then per head the q/k RMSNorm and RoPE, k and v times
1 / rms(x's row) where no q/k norm cancels it, k and v written into their cache slots and q returned
(matches reference.qkv_new_token). The decode attention after it only walks the cache
(kernels.decode_attention without a NewTokenQK): the wide decode steps' attention launch no longer runs
the new token's chain of loads and reductions before its first tile.

One program computes one head (head_dim columns, as two halves: RoPE pairs column j with j + half) for
BLOCK_M rows, so each norm's sum stays inside the program; the rows' sums of squares for 1 / rms are
taken from the same x tiles the matrix product reads (the diagonal of x x^T, a second product in the
loop), and TMA copies those tiles in on sm_90."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import is_interpreting, kernel, next_pow2
from kernels.qk_norm_rope import check_new_token_args


@kernel
def _qkv_new_token_kernel(
    x_ptr,  # (M, K): the residual stream, rows contiguous
    w_ptr,  # (num_heads + 2 * num_kv_heads) * head_dim, K): the folded qkv weight, contiguous
    q_ptr,  # (M, num_heads, head_dim) out: q after its norm and RoPE
    qw_ptr,  # (head_dim,) q norm weight; unused unless HAS_NORM
    kw_ptr,  # (head_dim,)
    pos_ptr,  # (M,) int
    cs_ptr,  # (max_positions, head_dim) float32: [cos | sin]
    k_cache_ptr,  # (num_slots, num_kv_heads, head_dim) contiguous
    v_cache_ptr,
    slot_ptr,  # (M,) int; < 0 = padding, not written
    x_desc,  # TMA: x's tensor descriptor, boxes of (BLOCK_M, BLOCK_K); else unused
    w_desc,  # TMA: the weight's, boxes of (2 * HALF, BLOCK_K); else unused
    M,
    stride_xm,
    eps,  # the q/k norms'
    row_eps,  # the folded input norm's
    K: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2, a power of two
    HAS_NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TMA: tl.constexpr,  # the product's tiles copied in by TMA (x_desc, w_desc), not gathered by pointers
    RELEASE: tl.constexpr,  # the decode attention after it may start now (kernels.pdl; it waits for q, k, v)
):
    pdl.release(RELEASE)
    head = tl.program_id(0)  # 0..H-1 q, H..H+HK-1 k, then v
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rm = rows < M
    rows64 = rows.to(tl.int64)
    j = tl.arange(0, HALF)
    jj = tl.arange(0, 2 * HALF)
    kk = tl.arange(0, BLOCK_K)
    x_p = x_ptr + rows64[:, None] * stride_xm + kk[None, :]  # (BLOCK_M, BLOCK_K)
    w_p = w_ptr + (head * 2 * HALF + jj).to(tl.int64)[:, None] * K + kk[None, :]  # (2 * HALF, BLOCK_K)
    # 1 / rms of x's rows, for v (and q, k without a norm that cancels it), from the diagonal of x x^T: a
    # second product in the loop over the same x tiles (a sum of x * x over those tiles inside the
    # pipelined loop came out wrong for some tiles on sm_90)
    gram = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, 2 * HALF), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if TMA:  # rows past M come in as zeros
            x = x_desc.load([tl.program_id(1) * BLOCK_M, k0])
            w = w_desc.load([head * 2 * HALF, k0])
        else:
            x = tl.load(x_p + k0, mask=rm[:, None], other=0.0)
            w = tl.load(w_p + k0)
        acc = tl.dot(x, tl.trans(w), acc)
        gram = tl.dot(x, tl.trans(x), gram)
    # the head's two halves (RoPE pairs column j with j + HALF)
    acc1, acc2 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
    i = tl.arange(0, BLOCK_M)
    rs = 1.0 / tl.sqrt(tl.sum(tl.where(i[:, None] == i[None, :], gram, 0.0), axis=1) / K + row_eps)

    dt = q_ptr.dtype.element_ty
    ct = k_cache_ptr.dtype.element_ty
    # the projection's output rounded as the GEMM's would be, then the work on it in float32
    x1 = acc1.to(dt).to(tl.float32)
    x2 = acc2.to(dt).to(tl.float32)
    slot = tl.load(slot_ptr + rows, mask=rm, other=-1).to(tl.int64)
    if head >= NUM_HEADS + NUM_KV_HEADS:  # v: row-scaled, into the cache
        hv = head - NUM_HEADS - NUM_KV_HEADS
        v1 = (x1 * rs[:, None]).to(dt)
        v2 = (x2 * rs[:, None]).to(dt)
        dst = v_cache_ptr + slot[:, None] * (NUM_KV_HEADS * 2 * HALF) + hv * 2 * HALF + j[None, :]
        sm = (slot >= 0)[:, None]
        tl.store(dst, v1.to(ct), mask=sm)
        tl.store(dst + HALF, v2.to(ct), mask=sm)
    else:
        is_q = head < NUM_HEADS
        if HAS_NORM:  # the per-head norm cancels the row scale (up to its eps)
            rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
            n1 = tl.where(is_q, tl.load(qw_ptr + j), tl.load(kw_ptr + j)).to(tl.float32)
            n2 = tl.where(is_q, tl.load(qw_ptr + HALF + j), tl.load(kw_ptr + HALF + j)).to(tl.float32)
            n1, n2 = n1[None, :], n2[None, :]
            x1 = (n1 * (x1 * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            x2 = (n2 * (x2 * rstd[:, None]).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        else:
            x1 = (x1 * rs[:, None]).to(dt).to(tl.float32)
            x2 = (x2 * rs[:, None]).to(dt).to(tl.float32)
        pos = tl.load(pos_ptr + rows, mask=rm, other=0).to(tl.int64)
        cos = tl.load(cs_ptr + pos[:, None] * (2 * HALF) + j[None, :])  # (BLOCK_M, HALF)
        sin = tl.load(cs_ptr + pos[:, None] * (2 * HALF) + HALF + j[None, :])
        r1 = (x1 * cos - x2 * sin).to(dt)
        r2 = (x2 * cos + x1 * sin).to(dt)
        if is_q:
            dst = q_ptr + rows64[:, None] * (NUM_HEADS * 2 * HALF) + head * 2 * HALF + j[None, :]
            tl.store(dst, r1, mask=rm[:, None])
            tl.store(dst + HALF, r2, mask=rm[:, None])
        else:
            hk = head - NUM_HEADS
            dst = k_cache_ptr + slot[:, None] * (NUM_KV_HEADS * 2 * HALF) + hk * 2 * HALF + j[None, :]
            sm = (slot >= 0)[:, None]
            tl.store(dst, r1.to(ct), mask=sm)
            tl.store(dst + HALF, r2.to(ct), mask=sm)


# The product's tiles reach shared memory by TMA (tensor descriptors of x and the weight, one bulk copy a
# tile) where x's rows are 16-byte aligned on sm_90 or later; other x take per-thread copies by pointers,
# the fallback that keeps such views correct.
# (BLOCK_M, BLOCK_K, warps, stages) by the rows of the step: one program a head and BLOCK_M rows
CONFIGS = {1 << 30: (64, 64, 4, 6)}
INTERPRET_CONFIG = (16, 64, 4, 1)


def supports(hidden: int, head_dim: int) -> bool:
    """Whether the GPU configurations take this shape: heads of twice a power of two, hidden a multiple
    of every configuration's BLOCK_K."""
    half = head_dim // 2
    return (
        head_dim % 2 == 0
        and half > 0
        and next_pow2(half) == half
        and all(hidden % c[1] == 0 for c in CONFIGS.values())
    )


def pick_config(m: int, interpret: bool) -> tuple[int, int, int, int]:
    if interpret:
        return INTERPRET_CONFIG
    return next(c for top, c in sorted(CONFIGS.items()) if m <= top)


def _tma_aligned(x: torch.Tensor) -> bool:
    """Whether x can be a TMA source: 16-byte aligned rows, on a Hopper-or-later GPU (or the CPU's
    interpreter, which emulates the copies)."""
    aligned = (x.stride(0) * x.element_size()) % 16 == 0 and x.data_ptr() % 16 == 0
    return aligned and (x.device.type != "cuda" or hopper_or_later(x.device.index))


@functools.cache
def hopper_or_later(index: int | None) -> bool:
    """TMA copies, and the shared memory the configurations ask for (144 KB a program), are sm_90's."""
    return torch.cuda.get_device_capability(index)[0] >= 9


def _descriptors(x: torch.Tensor, weight: torch.Tensor, bm: int, bk: int, head_dim: int):
    """Tensor descriptors of x (boxes of bm rows) and the weight (boxes of one head's rows), bk columns
    each; TMA needs 16-byte aligned rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [head_dim, bk])


def qkv_new_token(
    x: torch.Tensor,  # (M, K): the residual stream, un-normalized
    weight: torch.Tensor,  # ((num_heads + 2 * num_kv_heads) * head_dim, K), the input norm folded in
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None,  # (head_dim,) or None (no q/k norm)
    k_norm_weight: torch.Tensor | None,
    eps: float,  # the q/k norms'
    row_eps: float,  # the folded input norm's
    positions: torch.Tensor,  # (M,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (M,) int; < 0 = padding
    config: tuple[int, int, int, int] | None = None,  # (BLOCK_M, BLOCK_K, warps, stages)
) -> torch.Tensor:  # (M, num_heads, head_dim): q, normed and rotated
    """One launch: reference.qkv_new_token (k and v into the cache, q returned)."""
    m, kdim = x.shape
    d = cos_sin.shape[1]
    heads = num_heads + 2 * num_kv_heads
    if weight.shape != (heads * d, kdim) or not weight.is_contiguous():
        raise ValueError(f"weight {tuple(weight.shape)} must be contiguous ({heads * d}, {kdim})")
    if x.stride(-1) != 1 or x.dtype != weight.dtype:
        raise ValueError("x must have contiguous rows of weight's dtype")
    if d % 2 or next_pow2(d // 2) != d // 2:
        raise ValueError(f"head_dim {d} must be twice a power of two")
    norms, caches = (q_norm_weight, k_norm_weight), (k_cache, v_cache)
    check_new_token_args(x.dtype, m, num_kv_heads, d, *norms, positions, cos_sin, *caches, slot_mapping)
    q = torch.empty(m, num_heads, d, dtype=x.dtype, device=x.device)
    bm, bk, warps, stages = config or pick_config(m, is_interpreting(x))
    if kdim % bk:
        raise ValueError(f"K {kdim} must be a multiple of BLOCK_K {bk}")
    if m:
        has_norm, tma = q_norm_weight is not None, _tma_aligned(x)
        x_desc, w_desc = _descriptors(x, weight, bm, bk, d) if tma else (x, weight)
        _qkv_new_token_kernel[(heads, triton.cdiv(m, bm))](
            x, weight, q, q_norm_weight if has_norm else cos_sin, k_norm_weight if has_norm else cos_sin,
            positions, cos_sin, k_cache, v_cache, slot_mapping, x_desc, w_desc, m, x.stride(0), eps, row_eps,
            K=kdim, NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=d // 2, HAS_NORM=has_norm,
            BLOCK_M=bm, BLOCK_K=bk, TMA=tma, RELEASE=pdl.enabled(x.device),
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
    return q
