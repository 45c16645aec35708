"""Decode attention with the work split evenly over a fixed grid (stream-K over key tiles).

kernels.paged_attention's decode launch gives each (sequence, KV head) pair one program (or a fixed
number of splits): with ragged contexts the last wave runs on a few SMs, and a batch of fewer pairs
than SMs leaves SMs idle unless it is split on the host's guess. Here every pair is cut into tiles of
BLOCK_N keys and all tiles of the step are laid end to end, sequence by sequence and, inside one, KV
head by KV head:

    tiles(b)   = max(1, cdiv(seq_len[b], BLOCK_N))        per KV head of sequence b
    cum[b]     = NUM_KV_HEADS * sum(tiles[:b])             (batch + 1,)
    map[i]     = the (pair, tile) of global tile i         built once per step (tile_map), for all layers
    program c  takes tiles [c * W // P, (c + 1) * W // P)  W = cum[batch], P = min(grid, W) programs

A program walks its range in one software-pipelined loop, across pair boundaries (each tile reads its
pair's q; the running softmax restarts at a pair's first tile), so its K/V reads stay in flight from
one pair to the next. A segment that is a whole pair writes the output; a pair cut by a range end leaves a
partial (normalized output, log2-sum-exp2) in its program's slot (0: the range's first segment, 1: its
last) and counts its arrival; the pair's last piece to arrive merges all pieces in program order (so the
result does not depend on the arrival order) and zeroes the counter again.

With new_token (the engine's fused decode) each segment first applies the q/k RMSNorm and RoPE to its
pair's q, and the segment holding the new position stores the new K/V in the cache before it reads
its tiles, exactly as kernels.paged_attention's fused launch does. A sequence of length 0 (CUDA-graph
padding) gets zeros. No sliding window or ALiBi here: kernels.dispatch keeps those on the other launch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._jit import arrival_counters, is_interpreting, kernel, next_pow2
from kernels.paged_attention import (
    LOG2E,
    NewTokenQK,
    _check_cache,
    _check_new_token,
    _dot_precision,
    _sm_count,
    _tile_offsets,
)

# (BLOCK_N, num_warps, num_stages, programs per SM) by dtype key
LEAN_CONFIGS = {
    "16bit": (128, 4, 3, 1),
    "fp32": (32, 8, 2, 1),
    "interpret": (16, 4, 1, 1),
}
_MAX_COUNTERS = 1 << 16


@triton.jit
def _program_of(p, total, P):
    """The program whose range [c * total // P, (c + 1) * total // P) holds tile p."""
    return ((p + 1) * P + total - 1) // total - 1


@triton.jit
def _query(q_ptr, k_new_ptr, v_new_ptr, qw_ptr, kw_ptr, pos_ptr, cs_ptr, b, kvh, stride_qb, stride_qh,
           stride_kb, stride_vb, eps, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
           BLOCK_D: tl.constexpr, FUSE_QK: tl.constexpr, HAS_NORM: tl.constexpr):  # fmt: skip
    """q (BLOCK_G, BLOCK_D) of the query heads of KV head kvh, and (FUSE_QK) the new token's k and v
    (BLOCK_D,), normalized and rotated as kernels.qk_norm_rope rounds them."""
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    gd_mask = (g < GROUP)[:, None] & d_mask[None, :]
    heads = kvh * GROUP + g
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    if FUSE_QK:
        half = HEAD_DIM // 2
        partner = (d + half) % HEAD_DIM
        sign = tl.where(d < half, -1.0, 1.0)[None, :]
        pos = tl.load(pos_ptr + b).to(tl.int64)
        cos = tl.load(cs_ptr + pos * HEAD_DIM + d % half, mask=d_mask, other=0.0)[None, :]
        sin = tl.load(cs_ptr + pos * HEAD_DIM + half + d % half, mask=d_mask, other=0.0)[None, :]
        dt = q_ptr.dtype.element_ty
        qa = tl.load(q_rows + d[None, :], mask=gd_mask, other=0.0).to(tl.float32)
        qb = tl.load(q_rows + partner[None, :], mask=gd_mask, other=0.0).to(tl.float32)
        k_row = k_new_ptr + b.to(tl.int64) * stride_kb + kvh * HEAD_DIM
        ka = tl.load(k_row + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        kb = tl.load(k_row + partner, mask=d_mask, other=0.0).to(tl.float32)[None, :]
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
        q = (qa * cos + sign * qb * sin).to(dt)
        k_new = tl.sum((ka * cos + sign * kb * sin).to(dt), axis=0)  # (BLOCK_D,)
        v_new = tl.load(v_new_ptr + b.to(tl.int64) * stride_vb + kvh * HEAD_DIM + d, mask=d_mask, other=0.0)
    else:
        q = tl.load(q_rows + d[None, :], mask=gd_mask, other=0.0)
        k_new = tl.zeros((BLOCK_D,), dtype=q.dtype)
        v_new = k_new
    return q, k_new, v_new


@triton.jit
def _merge_pieces(part_out_ptr, part_lse_ptr, out_ptr, cum_ptr, seq_lens_ptr, pair, total, P, stride_ob,
                  stride_oh, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """All pieces of one split pair, in program order, merged by their log-sum-exp into out."""
    b = pair // NUM_KV_HEADS
    kvh = pair % NUM_KV_HEADS
    T = tl.maximum(tl.cdiv(tl.load(seq_lens_ptr + b), BLOCK_N), 1)
    p0 = tl.load(cum_ptr + b) + kvh * T
    c0 = _program_of(p0, total, P)
    c1 = _program_of(p0 + T - 1, total, P)
    starts_before = (c0 * total // P) < p0  # then the pair is c0's last segment (slot 1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    gd_mask = g_mask[:, None] & (d < HEAD_DIM)[None, :]
    m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    den = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for c in range(c0, c1 + 1):
        slot = tl.where((c == c0) & starts_before, 1, 0)
        row = (c * 2 + slot).to(tl.int64) * GROUP + g  # (BLOCK_G,)
        lse = tl.load(part_lse_ptr + row, mask=g_mask, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=gd_mask, other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.exp2(lse - m_safe)
        den = den * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * o
        m = m_new
    res = acc / tl.where(den == 0.0, 1.0, den)[:, None]
    heads = kvh * GROUP + g
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
             res.to(out_ptr.dtype.element_ty), mask=gd_mask)  # fmt: skip


@triton.jit
def _arrive(part_out_ptr, part_lse_ptr, out_ptr, cum_ptr, seq_lens_ptr, counter_ptr, pair, total, P,
            stride_ob, stride_oh, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
            BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """This program's piece of a split pair is stored: count it; the last piece merges them all."""
    b = pair // NUM_KV_HEADS
    kvh = pair % NUM_KV_HEADS
    T = tl.maximum(tl.cdiv(tl.load(seq_lens_ptr + b), BLOCK_N), 1)
    p0 = tl.load(cum_ptr + b) + kvh * T
    pieces = _program_of(p0 + T - 1, total, P) - _program_of(p0, total, P) + 1
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + pair, 1, sem="acq_rel", scope="gpu")
    if arrived == pieces - 1:
        tl.debug_barrier()
        tl.store(counter_ptr + pair, 0)  # zeroed for the next launch
        _merge_pieces(part_out_ptr, part_lse_ptr, out_ptr, cum_ptr, seq_lens_ptr, pair, total, P, stride_ob,
                      stride_oh, NUM_KV_HEADS, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D, BLOCK_N)  # fmt: skip


@kernel
def _tile_map_kernel(
    seq_lens_ptr,  # (batch,) int32
    cum_ptr,  # (batch + 1,) int32, written: TileMap.cum
    map_ptr,  # (>= cum[batch],) int32, written: (b * NUM_KV_HEADS + kvh) << 12 | t for every tile
    batch,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,  # >= batch
    BLOCK_T: tl.constexpr,
):
    """One program per sequence: its offset (the tiles of the sequences before it) and its tiles' map."""
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK_B)
    lens = tl.load(seq_lens_ptr + i, mask=i < b, other=0)
    before = tl.sum(tl.where(i < b, tl.maximum(tl.cdiv(lens, BLOCK_N), 1), 0), axis=0) * NUM_KV_HEADS
    T = tl.maximum(tl.cdiv(tl.load(seq_lens_ptr + b), BLOCK_N), 1)
    if b == 0:
        tl.store(cum_ptr, 0)
    tl.store(cum_ptr + b + 1, before + NUM_KV_HEADS * T)
    for j in range(0, NUM_KV_HEADS * T, BLOCK_T):
        idx = j + tl.arange(0, BLOCK_T)
        kvh = idx // T
        tl.store(map_ptr + before + idx, ((b * NUM_KV_HEADS + kvh) << 12) | (idx - kvh * T),
                 mask=idx < NUM_KV_HEADS * T)  # fmt: skip


@kernel
def _lean_decode_kernel(
    q_ptr,  # (batch, num_heads, head_dim), last dim contiguous
    k_cache_ptr,  # (num_blocks * block_size, num_kv_heads, head_dim) contiguous
    v_cache_ptr,
    out_ptr,  # (batch, num_heads, head_dim), last dim contiguous
    part_out_ptr,  # (P, 2, GROUP, HEAD_DIM) float32: each program's first and last pieces, normalized
    part_lse_ptr,  # (P, 2, GROUP) float32: their log2-sum-exp2
    cum_ptr,  # (batch + 1,) int32: TileMap.cum
    map_ptr,  # (cum[batch],) int32: each tile's (pair << 12 | tile index in its pair)
    block_tables_ptr,  # (batch, max_blocks) int32
    seq_lens_ptr,  # (batch,) int32
    k_new_ptr,  # FUSE_QK: (batch, num_kv_heads, head_dim) the new token's raw k
    v_new_ptr,  # FUSE_QK: its v
    qw_ptr,  # FUSE_QK and HAS_NORM: (head_dim,)
    kw_ptr,
    pos_ptr,  # FUSE_QK: (batch,) positions
    cs_ptr,  # FUSE_QK: (max_positions, head_dim) float32 [cos | sin]
    slot_ptr,  # FUSE_QK: (batch,) cache slots; < 0 = padding
    counter_ptr,  # (batch * num_kv_heads,) int32 zeros, left zeroed
    batch,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_bt,
    stride_kb,
    stride_vb,
    eps,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FUSE_QK: tl.constexpr,
    HAS_NORM: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """One loop over this program's tiles (one software pipeline across pair boundaries): each tile
    reads its pair's q (normalized and rotated again where FUSE_QK) and folds into the running softmax,
    which restarts at each pair's first tile; a pair's last tile (or the range's) writes its result."""
    c = tl.program_id(0)
    total = tl.load(cum_ptr + batch)
    P = tl.minimum(tl.num_programs(0), total)  # every range non-empty; the programs past P have none
    start = (c.to(tl.int64) * total // P).to(tl.int32)
    end = ((c.to(tl.int64) + 1) * total // P).to(tl.int32)
    if c >= P:
        end = start

    g = tl.arange(0, BLOCK_G)
    g_mask = g < GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    gd_mask = g_mask[:, None] & d_mask[None, :]
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    first_split = start * 0 - 1  # the pairs of the range's first and last segments when cut by its ends
    last_split = start * 0 - 1
    for it in range(start, end):
        e = tl.load(map_ptr + it)
        pair = e >> 12
        t = e & 4095
        b = pair // NUM_KV_HEADS
        kvh = pair - b * NUM_KV_HEADS
        ctx = tl.load(seq_lens_ptr + b)
        T = tl.maximum(tl.cdiv(ctx, BLOCK_N), 1)
        q, k_new, v_new = _query(q_ptr, k_new_ptr, v_new_ptr, qw_ptr, kw_ptr, pos_ptr, cs_ptr, b, kvh,
                                 stride_qb, stride_qh, stride_kb, stride_vb, eps, GROUP, HEAD_DIM, BLOCK_G,
                                 BLOCK_D, FUSE_QK, HAS_NORM)  # fmt: skip
        bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
        offs_n, kv_off, kv_mask = _tile_offsets(bt_row, t * BLOCK_N, ctx, kvh, d, d_mask, NUM_KV_HEADS,
                                                HEAD_DIM, BLOCK_SIZE, BLOCK_N, True)  # fmt: skip
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        if FUSE_QK:  # the new position's row from registers; stored below, read by no other program
            is_new = (offs_n == ctx - 1)[:, None]
            k = tl.where(is_new, k_new.to(k.dtype)[None, :], k)
            v = tl.where(is_new, v_new.to(v.dtype)[None, :], v)
        fresh = (t == 0) | (it == start)
        m_i = tl.where(fresh, float("-inf"), m_i)
        l_i = tl.where(fresh, 0.0, l_i)
        acc = tl.where(fresh, 0.0, acc)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale_log2  # (BLOCK_G, BLOCK_N)
        s = tl.where((offs_n < ctx)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
        pair_end = t == T - 1
        if FUSE_QK:
            slot = tl.load(slot_ptr + b).to(tl.int64)
            if pair_end & (slot >= 0) & (ctx > 0):
                ct = k_cache_ptr.dtype.element_ty
                dst = slot * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM + d
                tl.store(k_cache_ptr + dst, k_new.to(ct), mask=d_mask)
                tl.store(v_cache_ptr + dst, v_new.to(ct), mask=d_mask)
        # the pair's first tile is global tile it - t: in this range (the segment is the whole pair), or
        # at or before its start (the segment is the range's first)
        seg_at_start = it - t <= start
        whole = pair_end & (it - t >= start)
        if pair_end | (it == end - 1):
            o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # nothing to attend (length 0): zeros
            if whole:
                heads = kvh * GROUP + g
                tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
                         o.to(out_ptr.dtype.element_ty), mask=gd_mask)  # fmt: skip
            else:
                row = (c.to(tl.int64) * 2 + tl.where(seg_at_start, 0, 1)) * GROUP + g
                tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=gd_mask)
                lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
                tl.store(part_lse_ptr + row, lse, mask=g_mask)
        cut = (pair_end | (it == end - 1)) & ~whole
        first_split = tl.where(cut & seg_at_start, pair, first_split)
        last_split = tl.where(cut & ~seg_at_start, pair, last_split)
    if first_split >= 0:
        _arrive(part_out_ptr, part_lse_ptr, out_ptr, cum_ptr, seq_lens_ptr, counter_ptr, first_split, total,
                P, stride_ob, stride_oh, NUM_KV_HEADS, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D,
                BLOCK_N)  # fmt: skip
    if last_split >= 0:
        _arrive(part_out_ptr, part_lse_ptr, out_ptr, cum_ptr, seq_lens_ptr, counter_ptr, last_split, total,
                P, stride_ob, stride_oh, NUM_KV_HEADS, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D,
                BLOCK_N)  # fmt: skip


def _config(q: torch.Tensor) -> tuple[int, int, int, int]:
    if is_interpreting(q):
        return LEAN_CONFIGS["interpret"]
    return LEAN_CONFIGS["fp32" if q.dtype == torch.float32 else "16bit"]


def block_keys(q: torch.Tensor) -> int:
    """BLOCK_N of a launch for q: the tile size tile_offsets must be built with."""
    return _config(q)[0]


class TileMap(NamedTuple):
    """A step's tiles laid end to end (tile_map): shared by all layers of the step."""

    cum: torch.Tensor  # (batch + 1,) int32: cum[b] = NUM_KV_HEADS * sum(max(1, cdiv(len, BLOCK_N)) before b)
    tiles: torch.Tensor  # (capacity,) int32: global tile -> (b * NUM_KV_HEADS + kvh) << 12 | tile in pair
    block_n: int


def tile_map(seq_lens: torch.Tensor, num_kv_heads: int, block_n: int, max_keys: int) -> TileMap:
    """The tile map of a batch whose sequences hold at most max_keys keys (a python int: the block table's
    capacity), built on the device in one launch (no host sync, CUDA-graph safe)."""
    b = seq_lens.shape[0]
    per_seq = max(1, triton.cdiv(max_keys, block_n))
    if per_seq >= 1 << 12:
        raise ValueError(f"at most {(1 << 12) - 1} tiles of {block_n} keys per sequence")
    cum = torch.empty(b + 1, dtype=torch.int32, device=seq_lens.device)
    tiles = torch.empty(max(1, b * num_kv_heads * per_seq), dtype=torch.int32, device=seq_lens.device)
    if b:
        _tile_map_kernel[(b,)](
            seq_lens, cum, tiles, b, NUM_KV_HEADS=num_kv_heads, BLOCK_N=block_n, BLOCK_B=next_pow2(b),
            BLOCK_T=min(1024, next_pow2(num_kv_heads * per_seq)), num_warps=4,
        )  # fmt: skip
    return TileMap(cum, tiles, block_n)


def programs(device: torch.device, per_sm: int | None = None) -> int:
    """The grid: a few programs per SM (LEAN_CONFIGS), all resident at once."""
    return _sm_count(device) * (per_sm if per_sm is not None else LEAN_CONFIGS["16bit"][3])


def lean_decode_attention(
    q: torch.Tensor,  # (batch, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    seq_lens: torch.Tensor,  # (batch,) int32, incl. the new token
    scale: float,
    out: torch.Tensor | None = None,
    new_token: NewTokenQK | None = None,
    tiles: TileMap | None = None,  # tile_map(seq_lens, num_kv_heads, block_keys(q), capacity) when built
    num_programs: int | None = None,
) -> torch.Tensor:  # (batch, num_heads, head_dim)
    """Same result as kernels.paged_attention.paged_decode_attention (without window or ALiBi), the
    step's key tiles split evenly over num_programs programs. CUDA-graph safe."""
    if q.dim() != 3:
        raise ValueError(f"q must be (batch, num_heads, head_dim), got {tuple(q.shape)}")
    _check_cache(q, k_cache, v_cache, block_tables)
    b, h, d = q.shape
    _, bs, hk, _ = k_cache.shape
    if block_tables.shape[0] != b or seq_lens.shape != (b,) or seq_lens.dtype != torch.int32:
        raise ValueError("block_tables must have batch rows and seq_lens be (batch,) int32")
    if b * hk > _MAX_COUNTERS:
        raise ValueError(f"batch x KV heads must be <= {_MAX_COUNTERS}")
    if out is None:
        out = torch.empty((b, h, d), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError("out must match q")
    nt = new_token
    if nt is not None:
        _check_new_token(q, nt, hk)
    if b == 0:
        return out
    block_n, warps, stages, per_sm = _config(q)
    if tiles is None:
        tiles = tile_map(seq_lens, hk, block_n, block_tables.shape[1] * bs)
    elif tiles.cum.shape != (b + 1,) or tiles.block_n != block_n:
        raise ValueError(f"tiles must be the tile_map of this batch with {block_n}-key tiles")
    p = int(num_programs) if num_programs is not None else programs(q.device, per_sm)
    group = h // hk
    part_out = torch.empty((p, 2, group, d), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((p, 2, group), dtype=torch.float32, device=q.device)
    has_norm = nt is not None and nt.q_norm_weight is not None
    counters = arrival_counters("decode_lean", _MAX_COUNTERS, q.device)
    _lean_decode_kernel[(p,)](
        q, k_cache, v_cache, out, part_out, part_lse, tiles.cum, tiles.tiles, block_tables, seq_lens,
        nt.k if nt else q, nt.v if nt else q, nt.q_norm_weight if has_norm else q,
        nt.k_norm_weight if has_norm else q, nt.positions if nt else seq_lens, nt.cos_sin if nt else q,
        nt.slot_mapping if nt else seq_lens, counters, b, scale * LOG2E, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0), nt.k.stride(0) if nt else 0,
        nt.v.stride(0) if nt else 0, nt.eps if nt else 0.0,
        NUM_KV_HEADS=hk, GROUP=group, HEAD_DIM=d, BLOCK_SIZE=bs, BLOCK_G=max(16, next_pow2(group)),
        BLOCK_N=block_n, BLOCK_D=next_pow2(d), FUSE_QK=nt is not None,
        HAS_NORM=has_norm, DOT_PREC=_dot_precision(q.dtype), num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
