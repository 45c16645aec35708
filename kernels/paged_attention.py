"""Paged attention over the block-tiled KV cache: prefill/extend and split-K decode.

Cache layout (reference.py): k_cache, v_cache (num_blocks, block_size, num_kv_heads, head_dim);
position p of sequence i lives in slot block_tables[i, p // block_size] * block_size + p % block_size.
Both kernels keep an online softmax in float32 (base-2 exponent, scale folded with log2(e)) over
tiles of BLOCK_N key positions gathered through the block table, so no attention matrix is built and
BLOCK_N is independent of the cache block size.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import arrival_counters, is_interpreting, kernel, next_pow2
from kernels.rmsnorm import row_rstd

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


@kernel
def _prefill_kernel(
    q_ptr,  # (num_tokens, num_heads, head_dim), last dim contiguous
    k_cache_ptr,  # (num_blocks * block_size, num_kv_heads, head_dim) contiguous
    v_cache_ptr,
    out_ptr,  # (num_tokens, num_heads, head_dim), last dim contiguous; written only if NUM_SPLITS == 1
    part_out_ptr,  # (num_tokens, num_heads, NUM_SPLITS, head_dim) float32, normalized per split
    part_lse_ptr,  # (num_tokens, num_heads, NUM_SPLITS) float32, log2-sum-exp2 per split
    block_tables_ptr,  # (batch, max_blocks) int32, row stride stride_bt
    cu_q_ptr,  # (batch + 1,) int32
    seq_lens_ptr,  # (batch,) int32
    alibi_ptr,  # (num_heads,) float32; unused unless HAS_ALIBI
    tile_map_ptr,  # TILE_MAP: (2, num_tiles) int32 rows [sequence | query tile]; sequence < 0: no tile
    scale_log2,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    window,  # sliding window in positions; unused unless HAS_WINDOW
    num_tiles,  # TILE_MAP: the map's row length
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # cache block size
    BLOCK_M: tl.constexpr,  # query tokens per program
    BLOCK_N: tl.constexpr,  # key positions per tile
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,  # > 1: split-K over the tile's keys (few query tiles, long contexts)
    HAS_WINDOW: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    DOT_PREC: tl.constexpr,
    TILE_MAP: tl.constexpr,  # program axis 0 walks a host-built map of (sequence, query tile)
):
    if TILE_MAP:
        seq = tl.load(tile_map_ptr + tl.program_id(0))
        if seq < 0:
            return
        mb = tl.load(tile_map_ptr + num_tiles + tl.program_id(0))
    else:
        mb = tl.program_id(0)
        seq = tl.program_id(1)
    head = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if mb * BLOCK_M >= q_len:
        return
    ctx = tl.load(seq_lens_ptr + seq)
    kvh = head // GROUP

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < q_len
    q_pos = ctx - q_len + offs_m  # (BLOCK_M,) absolute positions of the queries
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # (BLOCK_M, BLOCK_D)

    # keys needed by this query tile: up to its last query (causal), from its first query's window
    hi = tl.minimum(ctx, ctx - q_len + (mb + 1) * BLOCK_M)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - q_len + mb * BLOCK_M - window + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(alibi_ptr + head).to(tl.float32) * 1.4426950408889634

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    if NUM_SPLITS > 1:  # this program's share of [lo, hi), in whole tiles
        per_split = tl.cdiv(tl.cdiv(hi - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = lo + split * per_split
        hi = tl.minimum(lo + per_split, hi)
    # keys before the tile's first query are visible to every row: no mask there (without a window)
    mid = lo
    if not HAS_WINDOW:
        mid = tl.minimum(tl.maximum(((ctx - q_len + mb * BLOCK_M + 1) // BLOCK_N) * BLOCK_N, lo), hi)
        for start in range(lo, mid, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, bt_row, start, hi, q_pos, kvh, d, d_mask,
                scale_log2, slope, window, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
                False, HAS_WINDOW, HAS_ALIBI, DOT_PREC,
            )  # fmt: skip
    for start in range(mid, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, bt_row, start, hi, q_pos, kvh, d, d_mask,
            scale_log2, slope, window, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
            True, HAS_WINDOW, HAS_ALIBI, DOT_PREC,
        )  # fmt: skip

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    md_mask = m_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        out_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=md_mask)
    else:
        row = (q_rows * (NUM_KV_HEADS * GROUP) + head) * NUM_SPLITS + split  # (BLOCK_M,)
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=md_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(part_lse_ptr + row, lse, mask=m_mask)


@triton.jit
def _new_v(v_new_ptr, b, stride_vb, kvh, d, d_mask, rs, HEAD_DIM: tl.constexpr, ROW_SCALE: tl.constexpr):
    """The new token's v (BLOCK_D,) of KV head kvh; ROW_SCALE: times rs, rounded to its dtype."""
    v = tl.load(v_new_ptr + b.to(tl.int64) * stride_vb + kvh * HEAD_DIM + d, mask=d_mask)
    if ROW_SCALE:
        v = (v.to(tl.float32) * rs).to(v_new_ptr.dtype.element_ty)
    return v


@triton.jit
def _held_entries(bt_row, t0, hi, BLOCK_SIZE: tl.constexpr, BLOCK_T: tl.constexpr):
    """Block-table entries t0 .. t0 + BLOCK_T - 1 of a row (BLOCK_T,), those past the blocks of keys < hi
    not read."""
    t = t0 + tl.arange(0, BLOCK_T)
    return tl.load(bt_row + t, mask=t < tl.cdiv(hi, BLOCK_SIZE), other=0)


@kernel
def _decode_kernel(
    q_ptr,  # (batch, num_heads, head_dim), last dim contiguous
    k_cache_ptr,  # (num_blocks * block_size, num_kv_heads, head_dim) contiguous
    v_cache_ptr,
    out_ptr,  # (batch, num_heads, head_dim) last dim contiguous; written only if NUM_SPLITS == 1
    part_out_ptr,  # (batch, num_heads, NUM_SPLITS, head_dim) float32, normalized per split
    part_lse_ptr,  # (batch, num_heads, NUM_SPLITS) float32, log2-sum-exp2 of the split's scores
    block_tables_ptr,  # (batch, max_blocks) int32
    seq_lens_ptr,  # (batch,) int32
    alibi_ptr,  # (num_heads,) float32
    k_new_ptr,  # FUSE_QK: (batch, num_kv_heads, head_dim) the new token's raw k, last dim contiguous
    v_new_ptr,  # FUSE_QK: (batch, num_kv_heads, head_dim) its v
    qw_ptr,  # FUSE_QK and HAS_NORM: (head_dim,) q norm weight
    kw_ptr,  # (head_dim,) k norm weight
    pos_ptr,  # FUSE_QK: (batch,) int positions
    cs_ptr,  # FUSE_QK: (max_positions, head_dim) float32 [cos | sin]
    slot_ptr,  # FUSE_QK: (batch,) int cache slots; < 0 = padding
    counter_ptr,  # FUSED_REDUCE: (batch * num_kv_heads,) int32 zeros, left zeroed
    order_ptr,  # ORDERED: (batch,) int32, the batch rows in the order their programs are dispatched
    h_ptr,  # ROW_SCALE: (batch, hidden) the residual stream the qkv projection read un-normalized
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_bt,
    stride_kb,
    stride_vb,
    stride_hb,
    hidden,
    window,
    eps,
    eps_h,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,  # >= GROUP (and >= 16 for tl.dot): the query heads of one KV head
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,  # >= NUM_SPLITS
    HAS_WINDOW: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    FUSE_QK: tl.constexpr,  # q/k norm + RoPE + K/V store of the new token first (qk_norm_rope_store_kv)
    HAS_NORM: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,  # the last split of each (sequence, KV head) to finish merges them all
    DOT_PREC: tl.constexpr,
    HEAD_MAJOR: tl.constexpr,  # grid (num_kv_heads, batch, NUM_SPLITS): a sequence's heads together
    ORDERED: tl.constexpr,  # the grid's sequence index i runs sequence order[i]
    PDL: tl.constexpr,  # launched with programmatic dependent launch (kernels.pdl)
    PEEL: tl.constexpr,  # FUSE_QK: the first tile asked for before the new token's work (batch 1 split)
    ROW_SCALE: tl.constexpr,  # FUSE_QK: q, k and v times 1 / rms(h) first (NewTokenQK.row_scale)
    BLOCK_H: tl.constexpr,  # >= hidden (ROW_SCALE)
    BLOCK_T: tl.constexpr,  # > 0: the block-table row held in registers (not peeled launches)
    TABLE_PART: tl.constexpr,  # BLOCK_T < the row's width: BLOCK_T entries from each chunk's first block
    NORM_CANCELS: tl.constexpr,  # ROW_SCALE and HAS_NORM (16-bit): q and k skip the row scale
):
    """One (sequence, KV head, split) per program: grid (batch, num_kv_heads, NUM_SPLITS), or
    (num_kv_heads, batch, NUM_SPLITS) HEAD_MAJOR; ORDERED, the grid's batch index goes through order."""
    if HEAD_MAJOR:
        b = tl.program_id(1)
        kvh = tl.program_id(0)
    else:
        b = tl.program_id(0)  # sequence
        kvh = tl.program_id(1)  # KV head
    pdl.release(PDL)
    if ORDERED:
        b = tl.load(order_ptr + b)
    split = tl.program_id(2)  # key range
    ctx = tl.load(seq_lens_ptr + b)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    # each sequence splits its own key range evenly, in whole tiles: the split count is fixed on the
    # host, the split size is read on the device (no host sync, CUDA-graph safe)
    per_split = tl.cdiv(tl.cdiv(ctx - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    s_lo = lo + split * per_split
    s_hi = tl.minimum(s_lo + per_split, ctx)

    g = tl.arange(0, BLOCK_G)
    g_mask = g < GROUP
    heads = kvh * GROUP + g  # (BLOCK_G,)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    gd_mask = g_mask[:, None] & d_mask[None, :]
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh  # (BLOCK_G, 1)
    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    bt_regs = None
    if BLOCK_T > 0:  # written before the step: read before the wait and the new token's work
        bt_regs = _held_entries(bt_row, s_lo // BLOCK_SIZE if TABLE_PART else 0, s_hi, BLOCK_SIZE, BLOCK_T)
    if PEEL:  # the first tile's K/V asked for before the new token's q/k work (they do not depend on it)
        k0, v0, offs0 = _tile_kv(k_cache_ptr, v_cache_ptr, bt_row, s_lo, s_hi, kvh, d, d_mask, NUM_KV_HEADS,
                                 HEAD_DIM, BLOCK_SIZE, BLOCK_N, True)  # fmt: skip
    if FUSE_QK:
        # rounded exactly as kernels.qk_norm_rope: norm (to the dtype), times the weight (to the dtype),
        # rotate in float32, round; `partner` is each lane's rotate-half source d +- head_dim / 2
        half = HEAD_DIM // 2
        partner = (d + half) % HEAD_DIM
        sign = tl.where(d < half, -1.0, 1.0)[None, :]
        pos = tl.load(pos_ptr + b).to(tl.int64)
        cos = tl.load(cs_ptr + pos * HEAD_DIM + d % half, mask=d_mask, other=0.0)[None, :]
        sin = tl.load(cs_ptr + pos * HEAD_DIM + half + d % half, mask=d_mask, other=0.0)[None, :]
        dt = q_ptr.dtype.element_ty
        pdl.wait(PDL)  # q, k and v come from the kernel before
        qa = tl.load(q_rows + d[None, :], mask=gd_mask, other=0.0).to(tl.float32)
        qb = tl.load(q_rows + partner[None, :], mask=gd_mask, other=0.0).to(tl.float32)
        k_row = k_new_ptr + b.to(tl.int64) * stride_kb + kvh * HEAD_DIM
        ka = tl.load(k_row + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]  # (1, BLOCK_D)
        kb = tl.load(k_row + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        rs = 1.0
        if ROW_SCALE:  # the layer's input RMSNorm (its weight folded into the projection), rounded to dt
            rs = row_rstd(h_ptr, b, stride_hb, hidden, eps_h, BLOCK_H)
            if not NORM_CANCELS:  # else only v takes it: q's and k's norms next cancel it
                qa = (qa * rs).to(dt).to(tl.float32)
                qb = (qb * rs).to(dt).to(tl.float32)
                ka = (ka * rs).to(dt).to(tl.float32)
                kb = (kb * rs).to(dt).to(tl.float32)
        if HAS_NORM:
            rq = 1.0 / tl.sqrt(tl.sum(qa * qa, axis=1) / HEAD_DIM + eps)[:, None]
            wa = tl.load(qw_ptr + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            wb = tl.load(qw_ptr + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            qa = (wa * (qa * rq).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            qb = (wb * (qb * rq).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            rk = 1.0 / tl.sqrt(tl.sum(ka * ka, axis=1) / HEAD_DIM + eps)[:, None]
            ua = tl.load(kw_ptr + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            ub = tl.load(kw_ptr + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            ka = (ua * (ka * rk).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            kb = (ub * (kb * rk).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        q = (qa * cos + sign * qb * sin).to(dt)  # (BLOCK_G, BLOCK_D)
        # the split holding the new position stores its K/V, then reads them back with the rest (PEEL:
        # takes them from registers into the first tile, already asked for)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        owner = (slot >= 0) & (s_lo <= ctx - 1) & (ctx - 1 < s_hi)
        ct = k_cache_ptr.dtype.element_ty
        if PEEL:
            k_new = tl.sum((ka * cos + sign * kb * sin).to(dt), axis=0).to(ct)  # (BLOCK_D,)
            v_new = _new_v(v_new_ptr, b, stride_vb, kvh, d, d_mask, rs, HEAD_DIM, ROW_SCALE).to(ct)
            if owner:
                dst = slot * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM + d
                tl.store(k_cache_ptr + dst, k_new, mask=d_mask)
                tl.store(v_cache_ptr + dst, v_new, mask=d_mask)
            tl.debug_barrier()  # a later tile of this split may read the stored row back
            is_new = (offs0 == ctx - 1)[:, None]
            k0 = tl.where(is_new, k_new[None, :], k0)
            v0 = tl.where(is_new, v_new[None, :], v0)
        else:
            if owner:
                k_new = tl.sum((ka * cos + sign * kb * sin).to(dt), axis=0)  # (BLOCK_D,)
                v_new = _new_v(v_new_ptr, b, stride_vb, kvh, d, d_mask, rs, HEAD_DIM, ROW_SCALE)
                dst = slot * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM + d
                tl.store(k_cache_ptr + dst, k_new.to(ct), mask=d_mask)
                tl.store(v_cache_ptr + dst, v_new.to(ct), mask=d_mask)
            tl.debug_barrier()
    else:
        pdl.wait(PDL)
        q = tl.load(q_rows + d[None, :], mask=gd_mask, other=0.0)  # (BLOCK_G, BLOCK_D)
    slopes = 0.0
    if HAS_ALIBI:  # (BLOCK_G, 1)
        slopes = tl.load(alibi_ptr + heads, mask=g_mask, other=0.0).to(tl.float32)[:, None]
        slopes = slopes * 1.4426950408889634
    q_pos = tl.full((BLOCK_G,), 0, dtype=tl.int32) + (ctx - 1)  # every head queries the last position

    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    first = s_lo
    if PEEL:
        acc, m_i, l_i = _fold_tile(q, acc, m_i, l_i, k0, v0, offs0, s_hi, q_pos, scale_log2, slopes, window,
                                   True, HAS_WINDOW, HAS_ALIBI, DOT_PREC)  # fmt: skip
        first = s_lo + BLOCK_N
    # the window is already applied through s_lo: every tile, the ragged last one included, masked in one
    # software pipeline, so the ragged tile's loads are in flight with the others
    if TABLE_PART:
        # the row's BLOCK_T entries from a key's block cover CHUNK keys from that key on: the split in
        # chunks, each a software-pipelined loop over its tiles, the next chunk's entries read after it
        CHUNK = (BLOCK_T - 1) * BLOCK_SIZE // BLOCK_N * BLOCK_N
        for c_lo in range(first, s_hi, CHUNK):
            for start in range(c_lo, tl.minimum(c_lo + CHUNK, s_hi), BLOCK_N):
                acc, m_i, l_i = _attend_tile(
                    q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, bt_row, start, s_hi, q_pos, kvh, d, d_mask,
                    scale_log2, slopes, window, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
                    True, False, HAS_ALIBI, DOT_PREC, bt_regs, BLOCK_T, c_lo // BLOCK_SIZE,
                )  # fmt: skip
            bt_regs = _held_entries(bt_row, (c_lo + CHUNK) // BLOCK_SIZE, s_hi, BLOCK_SIZE, BLOCK_T)
    else:
        for start in range(first, s_hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, bt_row, start, s_hi, q_pos, kvh, d, d_mask,
                scale_log2, slopes, window, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCK_N,
                True, False, HAS_ALIBI, DOT_PREC, bt_regs, BLOCK_T,
            )  # fmt: skip

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # empty range (split past the end): zeros
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=gd_mask,
        )
    else:
        row = (b.to(tl.int64) * (NUM_KV_HEADS * GROUP) + heads) * NUM_SPLITS + split  # (BLOCK_G,)
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=gd_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)
        if FUSED_REDUCE:
            # release this split's partials; the split that arrives last merges all of them
            tl.debug_barrier()
            arrived = tl.atomic_add(counter_ptr + b * NUM_KV_HEADS + kvh, 1, sem="acq_rel", scope="gpu")
            if arrived == NUM_SPLITS - 1:
                tl.debug_barrier()
                tl.store(counter_ptr + b * NUM_KV_HEADS + kvh, 0)  # zeroed for the next launch
                for gi in tl.static_range(GROUP):
                    _merge_splits(
                        part_out_ptr, part_lse_ptr, out_ptr, b.to(tl.int64), kvh * GROUP + gi, stride_ob,
                        stride_oh, NUM_KV_HEADS * GROUP, HEAD_DIM, NUM_SPLITS, BLOCK_S, BLOCK_D,
                    )  # fmt: skip


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


# Tile configurations; module-level so that `python -m bench.kernels --sweep` can try others on the GPU.
# Chosen without spills on sm_90 (tests/kernels/compile_sm90.py checks): fp32 runs its dots on FMA
# units (no TF32) and needs 8 warps to hold its tiles in registers.
PREFILL_CONFIGS = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    "16bit": (64, 64, 4, 3),
    "fp32": (32, 16, 8, 2),
    "interpret": (16, 16, 4, 1),
}
DECODE_CONFIGS = {  # (BLOCK_N, num_warps, num_stages)
    "16bit": (64, 4, 3),  # few (sequence, KV head) programs: split-K over short tiles
    # a full wave of programs without splits (batch x KV heads >= SMs), the block-table row read per tile
    "16bit_wide": (128, 4, 3),
    # the same with the block-table row in registers: two shared buffers a tile, so 64-key tiles keep
    # three programs an SM
    "16bit_wide_table": (64, 4, 3),
    "fp32": (32, 8, 2),
    "interpret": (16, 4, 1),
}


# Decode launches (docs/performance.md has the measurements behind each choice):
# - A full wave or more of (sequence, KV head) programs without splits (W2's batches) is dispatched a
#   sequence at a time, its KV heads side by side (they read neighbouring rows of the same cache blocks),
#   the sequences longest first (`order`, one launch of kernels.order per step: AttentionMetadata), so
#   the longest contexts start in the first wave instead of holding the last SMs alone.
# - Split launches at batch 1 with the new token fused are peeled: each split's first K/V tile is asked
#   for before the new token's q/k norm, RoPE and store (and before the PDL wait), the new position's row
#   taken from registers.
# - Launches that are not peeled read their sequence's block-table row (up to TABLE_REGS_MAX entries)
#   into registers once and every tile gathers its blocks from there, so a tile's K/V addresses wait for
#   no load of the loop's own and Triton's software pipeline double-buffers the tiles. 512 entries keep
#   the row at 4 registers a thread. A wider table (the engine's graphs size it by max_model_len) holds
#   TABLE_REGS_MAX entries from each split's first block; a longer split walks its keys in chunks,
#   reading the next chunk's entries after each.
# - Folded 16-bit models with a q/k norm: the fused launch multiplies only v by the row scale (1 / rms of
#   the residual row), since q's and k's RMSNorm cancel it (exact but for the norm's eps and one rounding
#   to the dtype), so q's and k's norms wait on no reduction of the residual row.
TABLE_REGS_MAX = 512
# software pipeline stages of a peeled launch: its other tiles are not pipelined, so the peeled tile
# stays in registers without spills
PEEL_STAGES = 1
# (BLOCK_N, num_warps) of a peeled 16-bit launch: at batch 1's usual contexts one tile a split, and a
# program small enough (registers, 20 KB of shared memory on sm_90 with triton 3.6; `python -m
# tests.kernels.compile_sm90` prints both) to stay resident beside a layer-tail program
# (kernels.decode_tail_tma)
PEEL_TILE = (32, 4)


def wants_order(batch: int, num_kv_heads: int, device: torch.device) -> bool:
    """Whether a decode batch of this size is dispatched longest first (pass `order`)."""
    return _wide(batch, num_kv_heads, device)


def longest_first(seq_lens: torch.Tensor) -> torch.Tensor:  # (batch,) int32
    """The batch rows by descending length, ties in index order: the `order` the decode attention takes
    (one launch of kernels.order on the device, no host sync, CUDA-graph safe)."""
    from kernels.order import longest_first as rank_order

    return rank_order(seq_lens)


def _wide(batch: int, num_kv_heads: int, device: torch.device) -> bool:
    return batch * num_kv_heads >= _sm_count(device)


def wide_config_key(table_regs: bool) -> str:
    """DECODE_CONFIGS' key of a 16-bit wide launch, its block-table row in registers or read per tile."""
    return "16bit_wide_table" if table_regs else "16bit_wide"


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


def paged_prefill_attention(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim): new tokens of all sequences, concatenated
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    cu_seqlens_q: torch.Tensor,  # (batch + 1,) int32
    seq_lens: torch.Tensor,  # (batch,) int32: context length incl. the new tokens
    max_seqlen_q: int,  # python int >= the longest q_len (sizes the grid; no host sync)
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,  # (num_heads,)
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    tile_map: torch.Tensor | None = None,  # (2, num_tiles) int32: prefill_tile_map's, on q's device
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
    """Same semantics as reference.paged_attention: each sequence's q_len new tokens are the last q_len
    positions of its context (cached prefix, chunked prefill and decode are all special cases).

    Grid (query tiles, batch, heads x splits). With few query tiles and a long context the keys are split
    (`num_splits`, else chosen from `max_seq_len` or the block table's capacity, python ints) and a reduce
    kernel merges the splits, as in decode. No host sync; CUDA-graph safe. With `tile_map` the grid is
    (the map's tiles, 1, heads x splits) and max_seqlen_q only has to be positive: a captured step whose
    sequences change between replays (engine.batch_graphs) launches one program per listed tile."""
    if q.dim() != 3:
        raise ValueError(f"q must be (num_tokens, num_heads, head_dim), got {tuple(q.shape)}")
    _check_cache(q, k_cache, v_cache, block_tables)
    batch = block_tables.shape[0]
    if cu_seqlens_q.shape != (batch + 1,) or seq_lens.shape != (batch,):
        raise ValueError("cu_seqlens_q must be (batch + 1,) and seq_lens (batch,)")
    if cu_seqlens_q.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise ValueError("cu_seqlens_q and seq_lens must be int32")
    n, h, d = q.shape
    _, bs, hk, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError("out must match q")
    if n == 0 or batch == 0 or max_seqlen_q <= 0:
        return out
    block_m, block_n, warps, stages = PREFILL_CONFIGS[_config_key(q)]
    q_blocks = triton.cdiv(max_seqlen_q, block_m)
    grid_m, grid_b, num_tiles = q_blocks, batch, 0
    if tile_map is not None:
        if tile_map.dim() != 2 or tile_map.shape[0] != 2 or tile_map.dtype != torch.int32:
            raise ValueError("tile_map must be (2, num_tiles) int32")
        if tile_map.stride(1) != 1 or tile_map.stride(0) != tile_map.shape[1]:
            raise ValueError("tile_map must be contiguous")
        num_tiles = tile_map.shape[1]
        grid_m, grid_b = num_tiles, 1
        if num_tiles == 0:
            return out
    if num_splits is None:
        bound = max_seq_len if max_seq_len is not None else block_tables.shape[1] * bs
        num_splits = choose_prefill_splits(grid_m * grid_b * h, bound, _sm_count(q.device))
    num_splits = int(num_splits)
    if not 1 <= num_splits <= 256:
        raise ValueError("num_splits must be in [1, 256]")
    if num_splits > 1:
        part_out = torch.empty((n, h, num_splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((n, h, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out
    _prefill_kernel[(grid_m, grid_b, h * num_splits)](
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, cu_seqlens_q, seq_lens,
        _alibi(alibi_slopes, h, q), tile_map if tile_map is not None else seq_lens, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        _window(sliding_window), num_tiles,
        NUM_KV_HEADS=hk, GROUP=h // hk, HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=next_pow2(d), NUM_SPLITS=num_splits, HAS_WINDOW=sliding_window is not None,
        HAS_ALIBI=alibi_slopes is not None, DOT_PREC=_dot_precision(q.dtype), TILE_MAP=tile_map is not None,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if num_splits > 1:
        _decode_reduce_kernel[(n, h)](
            part_out, part_lse, out, out.stride(0), out.stride(1),
            NUM_HEADS=h, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits),
            BLOCK_D=next_pow2(d), num_warps=4,
        )  # fmt: skip
    return out


PREFILL_MIN_KEYS_PER_SPLIT = 512
PREFILL_MAX_SPLITS = 16


def prefill_block_m(dtype: torch.dtype, device: torch.device) -> int:
    """The query tile of paged_prefill_attention for q of this dtype on this device."""
    return PREFILL_CONFIGS[_config_key_for(dtype, device)][0]


def prefill_tile_map(q_lens: np.ndarray, block_m: int, num_tiles: int) -> np.ndarray:
    """(2, num_tiles) int32 [sequence | query tile] of every tile of BLOCK_M queries of each sequence
    (q_lens (batch,): its new tokens), sequences in order; the entries past them are -1 (no tile)."""
    tiles = -(-q_lens.astype(np.int64) // block_m)  # (batch,)
    total = int(tiles.sum())
    if total > num_tiles:
        raise ValueError(f"{total} query tiles do not fit a map of {num_tiles}")
    out = np.full((2, num_tiles), -1, dtype=np.int32)
    out[0, :total] = np.repeat(np.arange(q_lens.size), tiles)
    starts = np.cumsum(tiles) - tiles  # (batch,) each sequence's first entry
    out[1, :total] = np.arange(total) - np.repeat(starts, tiles)
    return out


def choose_prefill_splits(programs: int, max_seq_len: int, num_sms: int) -> int:
    """Split-K only when the (query tile, sequence, head) programs leave SMs idle, e.g. a short extend
    after a long cached prefix (a chat turn): then ~2 waves, each split >= 512 keys."""
    if programs >= num_sms:
        return 1
    want = triton.cdiv(2 * num_sms, max(1, programs))
    useful = triton.cdiv(max(1, max_seq_len), PREFILL_MIN_KEYS_PER_SPLIT)
    return max(1, min(want, useful, PREFILL_MAX_SPLITS))


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 128


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Once batch x KV heads fills the SMs, no split (and no reduce launch) at all; below, enough
    (batch, kv_head, split) programs for ~2 waves, each split >= 128 keys. Depends only on python ints,
    so a CUDA graph captured for a batch size keeps its split count (`python -m bench.kernels --sweep`
    times the alternatives)."""
    programs = batch * num_kv_heads
    if programs >= num_sms:
        return 1
    want = triton.cdiv(2 * num_sms, max(1, batch * num_kv_heads))
    useful = triton.cdiv(max(1, max_seq_len), MIN_TOKENS_PER_SPLIT)
    return max(1, min(want, useful, MAX_SPLITS))


class NewTokenQK(NamedTuple):
    """The new token's raw q/k/v and what qk_norm_rope_store_kv needs, for the fused decode path."""

    k: torch.Tensor  # (batch, num_kv_heads, head_dim), last dim contiguous (a view of the qkv output)
    v: torch.Tensor  # (batch, num_kv_heads, head_dim)
    q_norm_weight: torch.Tensor | None  # (head_dim,) of q's dtype; None: no q/k norm
    k_norm_weight: torch.Tensor | None
    eps: float
    positions: torch.Tensor  # (batch,) int
    cos_sin: torch.Tensor  # (max_positions, head_dim) float32, contiguous
    slot_mapping: torch.Tensor  # (batch,) int; < 0 = padding
    # (batch, hidden), last dim contiguous: the residual stream the qkv projection read without its RMSNorm
    # (the norm's weight folded into the projection): q, k and v are first multiplied by 1 / rms(row) and
    # rounded, as reference.row_scaled
    row_scale: torch.Tensor | None = None
    row_eps: float = 0.0


_MAX_COUNTERS = 1 << 16


def _counters(device: torch.device) -> torch.Tensor:
    """Arrival counters of the fused split merge: one per (sequence, KV head)."""
    return arrival_counters("decode_attention", _MAX_COUNTERS, device)


# A launch whose kernel before releases it early (kernels.qkv_new_token: the wide decode steps' qkv
# projection with the new token's work in its epilogue) starts with programmatic dependent launch: its
# programs read their sequence's length, order entry and block-table row (written at the step's start)
# while that kernel ends, and wait before q and the cache.


def paged_decode_attention(
    q: torch.Tensor,  # (batch, num_heads, head_dim): one new token per sequence
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    seq_lens: torch.Tensor,  # (batch,) int32, incl. the new token
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,  # (num_heads,)
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    new_token: NewTokenQK | None = None,
    fused_reduce: bool = True,
    order: torch.Tensor | None = None,  # (batch,) int32: the rows in the order their programs start
    after_release: bool = False,  # the kernel before releases its dependents early (see above)
) -> torch.Tensor:  # (batch, num_heads, head_dim)
    """Split-K decode: grid (batch, num_kv_heads, num_splits); one program handles all query heads of one
    KV head over one contiguous slice of the context; the splits are merged by their log-sum-exp, by
    the split of each (sequence, KV head) that finishes last (`fused_reduce`, one launch) or by a second
    kernel.

    `new_token`: q is the new token's raw q (a view of the qkv output) and the kernel first applies
    the q/k norm and RoPE and writes the new K/V into the cache, exactly as qk_norm_rope_store_kv
    would (one launch where there were two; q itself is left as it is).

    `order`: a permutation of the batch rows (wants_order says when the engine passes one): the
    programs start with the sequence order[0]; the result does not depend on it.

    CUDA-graph safe: no host sync and no data-dependent allocation. The split count is a python int:
    `num_splits` if given, else chosen from `max_seq_len` (a python int upper bound, used only for this
    choice), else from the block table's capacity (max_blocks * block_size). Any seq_lens value is
    handled correctly whatever the split count. A sequence with seq_len 0 (graph padding) gets zeros.
    """
    launch = decode_launch(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, alibi_slopes, out, max_seq_len,
        num_splits, new_token, fused_reduce, order, after_release,
    )  # fmt: skip
    b, hk, num_splits = launch.items
    if b == 0:
        return launch.out
    _decode_kernel[launch.grid](
        *launch.args, **launch.consts, num_warps=launch.warps, num_stages=launch.stages,
        **pdl.launch_kwargs(launch.consts["PDL"]),
    )  # fmt: skip
    if launch.partials is not None:  # the splits merged by a second launch
        out, (part_out, part_lse) = launch.out, launch.partials
        h, d = q.shape[1:]
        _decode_reduce_kernel[(b, h)](
            part_out, part_lse, out, out.stride(0), out.stride(1),
            NUM_HEADS=h, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits),
            BLOCK_D=next_pow2(d), num_warps=4,
        )  # fmt: skip
    return launch.out


class DecodeLaunch(NamedTuple):
    """One decode-attention launch, validated and with its buffers: what _decode_kernel takes."""

    args: tuple
    consts: dict
    items: tuple[int, int, int]  # (batch, num_kv_heads, num_splits) programs
    out: torch.Tensor  # (batch, num_heads, head_dim), written once every program (and merge) has run
    warps: int
    stages: int
    partials: tuple[torch.Tensor, torch.Tensor] | None  # (part_out, part_lse) left for a merge launch

    @property
    def grid(self) -> tuple[int, int, int]:
        """items, or (num_kv_heads, batch, num_splits) for a HEAD_MAJOR launch."""
        b, hk, splits = self.items
        return (hk, b, splits) if self.consts.get("HEAD_MAJOR") else self.items


def decode_launch(
    q: torch.Tensor,  # (batch, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    new_token: NewTokenQK | None = None,
    fused_reduce: bool = True,
    order: torch.Tensor | None = None,
    after_release: bool = False,
) -> DecodeLaunch:
    """paged_decode_attention's checks, split count, tile configuration, buffers and kernel arguments
    (see its docstring); an empty batch gets items (0, ., 0) and nothing else."""
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, num_heads, head_dim), got {tuple(q.shape)}")
    _check_cache(q, k_cache, v_cache, block_tables)
    b, h, d = q.shape
    _, bs, hk, _ = k_cache.shape
    if block_tables.shape[0] != b or seq_lens.shape != (b,) or seq_lens.dtype != torch.int32:
        raise ValueError("block_tables must have batch rows and seq_lens be (batch,) int32")
    if out is None:
        out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError("out must match q")
    nt = new_token
    if nt is not None:
        _check_new_token(q, nt, hk)
    if b == 0:
        return DecodeLaunch((), {}, (0, hk, 0), out, 0, 0, None)
    if num_splits is None:
        bound = max_seq_len if max_seq_len is not None else block_tables.shape[1] * bs
        num_splits = choose_num_splits(b, hk, bound, _sm_count(q.device))
    num_splits = int(num_splits)
    if not 1 <= num_splits <= 1024:
        raise ValueError("num_splits must be in [1, 1024]")
    key = _config_key(q)
    wide = _wide(b, hk, q.device)
    peel = nt is not None and num_splits > 1 and b == 1
    entries = next_pow2(block_tables.shape[1])
    cap = 1 << (max(1, TABLE_REGS_MAX).bit_length() - 1)  # a power of two
    table_regs = not peel
    if key == "16bit" and wide:
        key = wide_config_key(table_regs)
    block_n, warps, stages = DECODE_CONFIGS[key]
    # a part-held row's chunk, (block_t - 1) blocks rounded down to whole tiles, holds at least one tile
    block_t = min(entries, max(cap, next_pow2(-(-block_n // bs) + 1))) if table_regs else 0
    if peel:
        stages = PEEL_STAGES
        if key == "16bit":
            block_n, warps = PEEL_TILE
    fused_reduce = fused_reduce and num_splits > 1 and b * hk <= _MAX_COUNTERS
    if num_splits > 1:
        part_out = torch.empty((b, h, num_splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((b, h, num_splits), dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out
    group = h // hk
    has_norm = nt is not None and nt.q_norm_weight is not None
    hs = nt.row_scale if nt is not None else None
    head_major = num_splits == 1 and wide
    if order is not None and (order.shape != (b,) or order.dtype != torch.int32):
        raise ValueError("order must be (batch,) int32, a permutation of the batch rows")
    args = (
        q, k_cache, v_cache, out, part_out, part_lse, block_tables, seq_lens, _alibi(alibi_slopes, h, q),
        nt.k if nt else q, nt.v if nt else q, nt.q_norm_weight if has_norm else q,
        nt.k_norm_weight if has_norm else q, nt.positions if nt else seq_lens, nt.cos_sin if nt else q,
        nt.slot_mapping if nt else seq_lens, _counters(q.device) if fused_reduce else seq_lens,
        order if order is not None else seq_lens, hs if hs is not None else q, scale * LOG2E, q.stride(0),
        q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        nt.k.stride(0) if nt else 0, nt.v.stride(0) if nt else 0, hs.stride(0) if hs is not None else 0,
        hs.shape[1] if hs is not None else 0, _window(sliding_window), nt.eps if nt else 0.0,
        nt.row_eps if hs is not None else 0.0,
    )  # fmt: skip
    consts = dict(
        NUM_KV_HEADS=hk, GROUP=group, HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_G=max(16, next_pow2(group)),
        BLOCK_N=block_n, BLOCK_D=next_pow2(d), NUM_SPLITS=num_splits, BLOCK_S=next_pow2(num_splits),
        HAS_WINDOW=sliding_window is not None, HAS_ALIBI=alibi_slopes is not None,
        FUSE_QK=nt is not None, HAS_NORM=has_norm, FUSED_REDUCE=fused_reduce,
        DOT_PREC=_dot_precision(q.dtype), HEAD_MAJOR=head_major,
        ORDERED=order is not None, PDL=(b == 1 or (after_release and nt is None))
        and pdl.enabled(q.device),
        PEEL=peel, ROW_SCALE=hs is not None, BLOCK_H=next_pow2(hs.shape[1]) if hs is not None else 1,
        BLOCK_T=block_t, TABLE_PART=0 < block_t < block_tables.shape[1],
        NORM_CANCELS=hs is not None and has_norm and q.dtype != torch.float32,
    )  # fmt: skip
    partials = (part_out, part_lse) if num_splits > 1 and not fused_reduce else None
    return DecodeLaunch(args, consts, (b, hk, num_splits), out, warps, stages, partials)


def _check_new_token(q: torch.Tensor, nt: NewTokenQK, hk: int) -> None:
    b, _, d = q.shape
    if nt.k.shape != (b, hk, d) or nt.v.shape != (b, hk, d):
        raise ValueError(f"new k/v must be ({b}, {hk}, {d}), got {tuple(nt.k.shape)} / {tuple(nt.v.shape)}")
    if nt.k.stride(-1) != 1 or nt.v.stride(-1) != 1 or nt.k.stride(1) != d or nt.v.stride(1) != d:
        raise ValueError("new k/v need contiguous heads (a row of the qkv output)")
    if nt.k.dtype != q.dtype or q.stride(-1) != 1 or d % 2:
        raise ValueError("q and the new k share a dtype; q's last dim is contiguous; head_dim is even")
    hs = nt.row_scale
    if hs is not None and (hs.dim() != 2 or hs.shape[0] != b or hs.stride(-1) != 1):
        raise ValueError(f"row_scale must be ({b}, hidden) with a contiguous last dim, got {tuple(hs.shape)}")
    if (nt.q_norm_weight is None) != (nt.k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight go together")
    for w in (nt.q_norm_weight, nt.k_norm_weight):
        if w is not None and (w.shape != (d,) or not w.is_contiguous() or w.dtype != q.dtype):
            raise ValueError(f"norm weights must be contiguous ({d},) of q's dtype")
    cs = nt.cos_sin
    if cs.dim() != 2 or cs.shape[1] != d or cs.dtype != torch.float32 or not cs.is_contiguous():
        raise ValueError(f"cos_sin must be contiguous (max_positions, {d}) float32")
    if nt.positions.shape != (b,) or nt.slot_mapping.shape != (b,):
        raise ValueError(f"positions and slot_mapping must be ({b},)")
