"""Paged split-K decode attention: one new token per sequence, the new token's q/k work optionally fused.

The kernel and its launcher; the launch's checks, split count, tile configuration and arguments are
kernels.decode_launch's, the online softmax and the split merge kernels.attention_tiles'.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import pdl
from kernels._jit import kernel
from kernels.attention_tiles import _attend_tile, _fold_tile, _merge_splits, _tile_kv, merge_splits
from kernels.decode_launch import NewTokenQK, decode_launch
from kernels.rmsnorm import row_rstd


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
        merge_splits(*launch.partials, launch.out, num_splits)
    return launch.out
