"""The pieces shared by the paged attention kernels (kernels.prefill_attention, kernels.decode_attention).

Cache layout (reference.py): k_cache, v_cache (num_blocks, block_size, num_kv_heads, head_dim);
position p of sequence i lives in slot block_tables[i, p // block_size] * block_size + p % block_size.
Both kernels keep an online softmax in float32 (base-2 exponent, scale folded with log2(e)) over
tiles of BLOCK_N key positions gathered through the block table, so no attention matrix is built and
BLOCK_N is independent of the cache block size. Here: the tile steps of that softmax, the log-sum-exp
merge of split-K partials, and the host-side checks and choices both launchers make.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._jit import is_interpreting, kernel, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _tile_offsets(bt_row, start, hi, kvh, d, d_mask, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, bt_regs=None,
                  BLOCK_T: tl.constexpr = 0, t0=None):  # fmt: skip
    """(positions (BLOCK_N,), cache offsets and mask (BLOCK_N, BLOCK_D)) of keys [start, start + BLOCK_N)
    through the block table (MASKED: keys >= hi masked); BLOCK_T > 0: its row already in registers
    (bt_regs (BLOCK_T,): entries t0, t0 + 1, ... of it, or from the first without t0), so the cache
    addresses wait for no load of the tile's own."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED or BLOCK_T > 0:
        n_mask = offs_n < hi
        if BLOCK_T > 0:
            entry = offs_n // BLOCK_SIZE
            if t0 is not None:  # the tiles start at or past block t0 (their chunk's first)
                entry = entry - t0
            blk = tl.gather(bt_regs, tl.minimum(entry, BLOCK_T - 1), 0).to(tl.int64)
        else:
            blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
    else:
        blk = tl.load(bt_row + offs_n // BLOCK_SIZE).to(tl.int64)
        kv_mask = d_mask[None, :]
    slot = blk * BLOCK_SIZE + offs_n % BLOCK_SIZE  # (BLOCK_N,)
    kv_off = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM + d[None, :]  # (BLOCK_N, BLOCK_D)
    return offs_n, kv_off, kv_mask


@triton.jit
def _softmax_step(q, k, m_i, l_i, offs_n, hi, q_pos, scale_log2, slope, window, MASKED: tl.constexpr,
                  HAS_WINDOW: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """The online softmax over one tile of keys k (BLOCK_N, BLOCK_D): (p, alpha, new max, new sum)."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale_log2  # (BLOCK_M, BLOCK_N)
    if HAS_ALIBI:
        s += slope * (offs_n[None, :] - q_pos[:, None]).to(tl.float32)
    if MASKED:
        allowed = (offs_n[None, :] <= q_pos[:, None]) & (offs_n < hi)[None, :]
        if HAS_WINDOW:
            allowed = allowed & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # rows with nothing allowed yet keep m = -inf; subtract 0 there to avoid inf - inf
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@triton.jit
def _attend_tile(
    q,  # (BLOCK_M, BLOCK_D)
    acc,  # (BLOCK_M, BLOCK_D) float32, unnormalized output
    m_i,  # (BLOCK_M,) running max of the base-2 scores
    l_i,  # (BLOCK_M,) running sum of exp2(score - m_i)
    k_cache_ptr,
    v_cache_ptr,
    bt_row,  # this sequence's block-table row
    start,  # first key position of the tile
    hi,  # keys >= hi are out of range
    q_pos,  # (BLOCK_M,) query positions
    kvh,
    d,
    d_mask,
    scale_log2,
    slope,  # ALiBi slope * log2(e): scalar (one head) or (rows, 1) (a head per row)
    window,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the tile is in range and visible to every row
    HAS_WINDOW: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    DOT_PREC: tl.constexpr,
    bt_regs=None,
    BLOCK_T: tl.constexpr = 0,
    t0=None,
):
    """One BLOCK_N tile of keys folded into the online softmax, its values asked for once the scores are
    computed (a helper: interpreted or compiled with its caller, see kernels._jit)."""
    offs_n, kv_off, kv_mask = _tile_offsets(bt_row, start, hi, kvh, d, d_mask, NUM_KV_HEADS, HEAD_DIM,
                                            BLOCK_SIZE, BLOCK_N, MASKED, bt_regs, BLOCK_T, t0)  # fmt: skip
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    p, alpha, m_new, l_i = _softmax_step(q, k, m_i, l_i, offs_n, hi, q_pos, scale_log2, slope, window, MASKED,
                                         HAS_WINDOW, HAS_ALIBI, DOT_PREC)  # fmt: skip
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _tile_kv(k_cache_ptr, v_cache_ptr, bt_row, start, hi, kvh, d, d_mask, NUM_KV_HEADS: tl.constexpr,
             HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
             MASKED: tl.constexpr):  # fmt: skip
    """K and V (BLOCK_N, BLOCK_D) of keys [start, start + BLOCK_N) asked for together (the peeled tile:
    MASKED keys >= hi read as zeros), and the keys' positions."""
    offs_n, kv_off, kv_mask = _tile_offsets(bt_row, start, hi, kvh, d, d_mask, NUM_KV_HEADS, HEAD_DIM,
                                            BLOCK_SIZE, BLOCK_N, MASKED)  # fmt: skip
    k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
    return k, v, offs_n


@triton.jit
def _fold_tile(q, acc, m_i, l_i, k, v, offs_n, hi, q_pos, scale_log2, slope, window, MASKED: tl.constexpr,
               HAS_WINDOW: tl.constexpr, HAS_ALIBI: tl.constexpr, DOT_PREC: tl.constexpr):  # fmt: skip
    """A tile of keys and values already in registers (_tile_kv) folded into the online softmax."""
    p, alpha, m_new, l_i = _softmax_step(q, k, m_i, l_i, offs_n, hi, q_pos, scale_log2, slope, window, MASKED,
                                         HAS_WINDOW, HAS_ALIBI, DOT_PREC)  # fmt: skip
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _merge_splits(
    part_out_ptr,  # (batch, num_heads, NUM_SPLITS, head_dim) float32
    part_lse_ptr,  # (batch, num_heads, NUM_SPLITS) float32
    out_ptr,  # (batch, num_heads, head_dim)
    b,
    h,
    stride_ob,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One head's split-K partials merged by their log-sum-exp (a helper of both decode paths)."""
    s = tl.arange(0, BLOCK_S)
    s_mask = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    row0 = (b * NUM_HEADS + h) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + row0 + s, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # 0 for empty splits
    o_ptrs = part_out_ptr + (row0 + s)[:, None] * HEAD_DIM + d[None, :]
    o = tl.load(o_ptrs, mask=s_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
    den = tl.sum(w, axis=0)
    res = tl.sum(w[:, None] * o, axis=0) / tl.where(den == 0.0, 1.0, den)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty), mask=d_mask)


@kernel
def _decode_reduce_kernel(
    part_out_ptr,  # (batch, num_heads, NUM_SPLITS, head_dim) float32
    part_lse_ptr,  # (batch, num_heads, NUM_SPLITS) float32
    out_ptr,  # (batch, num_heads, head_dim)
    stride_ob,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    _merge_splits(
        part_out_ptr, part_lse_ptr, out_ptr, tl.program_id(0).to(tl.int64), tl.program_id(1), stride_ob,
        stride_oh, NUM_HEADS, HEAD_DIM, NUM_SPLITS, BLOCK_S, BLOCK_D,
    )  # fmt: skip


def merge_splits(part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor, num_splits: int) -> None:
    """The split-K partials of every (row, head) of out (rows, num_heads, head_dim) merged into it by a
    second launch (prefill's splits; decode's when the last split does not merge them)."""
    rows, h, d = out.shape
    _decode_reduce_kernel[(rows, h)](
        part_out, part_lse, out, out.stride(0), out.stride(1),
        NUM_HEADS=h, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits),
        BLOCK_D=next_pow2(d), num_warps=4,
    )  # fmt: skip


def _config_key(q: torch.Tensor) -> str:
    return _config_key_for(q.dtype, q.device)


def _config_key_for(dtype: torch.dtype, device: torch.device) -> str:
    if is_interpreting(device):
        return "interpret"
    return "fp32" if dtype == torch.float32 else "16bit"


def _check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor):
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"k_cache/v_cache must be equal (num_blocks, block_size, num_kv_heads, head_dim), "
            f"got {tuple(k_cache.shape)} / {tuple(v_cache.shape)}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous")
    h, d = q.shape[1], q.shape[2]
    hk = k_cache.shape[2]
    if k_cache.shape[3] != d or h % hk:
        raise ValueError(f"q heads/dim ({h}, {d}) do not fit the cache's ({hk}, {k_cache.shape[3]})")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"cache dtype {k_cache.dtype} != q dtype {q.dtype}")
    if q.stride(-1) != 1:
        raise ValueError("q needs a contiguous last dim")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError("block_tables must be (batch, max_blocks) int32")


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 inputs: exact fp32 products (TF32 would be ~1e-3 off); 16-bit inputs ignore the setting
    return "ieee" if dtype == torch.float32 else "tf32"


def _alibi(alibi_slopes: torch.Tensor | None, num_heads: int, like: torch.Tensor) -> torch.Tensor:
    if alibi_slopes is None:
        return like
    if alibi_slopes.shape != (num_heads,):
        raise ValueError(f"alibi_slopes must be ({num_heads},)")
    return alibi_slopes.float().contiguous()


def _window(sliding_window: int | None) -> int:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError("sliding_window must be >= 1")
    return 0 if sliding_window is None else int(sliding_window)
