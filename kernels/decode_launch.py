"""The decode attention's launch: its checks, split count, tile configuration, buffers and arguments.

kernels.decode_attention launches what decode_launch returns; the engine's graphs and the benchmarks
read the same choices (wants_order, choose_num_splits, DECODE_CONFIGS) from here.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from kernels import pdl
from kernels._jit import arrival_counters, next_pow2, sm_count
from kernels.attention_tiles import LOG2E, _alibi, _check_cache, _config_key, _dot_precision, _window

# Tile configurations, chosen as kernels.prefill_attention's PREFILL_CONFIGS.
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
    return batch * num_kv_heads >= sm_count(device)


def wide_config_key(table_regs: bool) -> str:
    """DECODE_CONFIGS' key of a 16-bit wide launch, its block-table row in registers or read per tile."""
    return "16bit_wide_table" if table_regs else "16bit_wide"


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
        num_splits = choose_num_splits(b, hk, bound, sm_count(q.device))
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
