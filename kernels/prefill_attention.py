"""Paged prefill/extend attention: causal, GQA, a cached prefix, optional split-K over long contexts.

Each sequence's new tokens are the last positions of its context, so a cached prefix, chunked prefill
and decode are all special cases; the online softmax and the split merge are kernels.attention_tiles'.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from kernels._jit import kernel, next_pow2, sm_count
from kernels.attention_tiles import (
    LOG2E,
    _alibi,
    _attend_tile,
    _check_cache,
    _config_key,
    _config_key_for,
    _dot_precision,
    _window,
    merge_splits,
)

# Tile configurations; module-level so that `python -m bench.kernels --sweep` can try others on the GPU.
# Chosen without spills on sm_90 (tests/kernels/compile_sm90.py checks): fp32 runs its dots on FMA
# units (no TF32) and needs 8 warps to hold its tiles in registers.
PREFILL_CONFIGS = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    "16bit": (64, 64, 4, 3),
    "fp32": (32, 16, 8, 2),
    "interpret": (16, 16, 4, 1),
}


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
    sequences change between replays (runner.batch_graphs) launches one program per listed tile."""
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
        num_splits = choose_prefill_splits(grid_m * grid_b * h, bound, sm_count(q.device))
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
        merge_splits(part_out, part_lse, out, num_splits)
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
