"""Attention over the paged KV cache: one metadata object per step, one dispatch point for kernels.

A step's tokens are laid out decodes first (one token per sequence), then prefill chunks; decodes
use the batched decode kernel, prefill chunks the variable-length kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels import dispatch as ops


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (num_tokens,) int64, -1 = padding
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # (num_decodes, max_blocks) int32
    decode_seq_lens: torch.Tensor | None  # (num_decodes,) int32, incl. the new token
    prefill_block_tables: torch.Tensor | None  # (num_prefills, max_blocks) int32
    prefill_cu_seqlens_q: (
        torch.Tensor | None
    )  # (num_prefills + 1,) int32, offsets from the first prefill token
    prefill_seq_lens: torch.Tensor | None  # (num_prefills,) int32
    prefill_max_q: int = 0
    decode_max_seq_len: int = 0  # python int: bound for split-K kernels (no host sync)
    # (2, num_tiles) int32: the prefill kernel's programs listed per query tile (ops.prefill_tile_map),
    # for a captured step replayed over other sequences (runner.batch_graphs); None: a grid per launch
    prefill_tile_map: torch.Tensor | None = None
    _decode_order: tuple[torch.Tensor | None] | None = field(default=None, init=False, repr=False)

    def decode_order(self, num_kv_heads: int) -> torch.Tensor | None:
        """The decodes' rows longest first where the decode kernel takes them (ops.decode_order: a wide
        batch on Triton's kernels), else None. Decided and sorted on the device once per step (inside a
        captured graph, once per replay), shared by every layer."""
        if self._decode_order is None:
            nd = self.num_decodes
            self._decode_order = (ops.decode_order(self.decode_seq_lens[:nd], num_kv_heads) if nd else None,)
        return self._decode_order[0]


def paged_attention(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), the step's K/V already in
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    after_release: bool = False,  # decode only: the launch before is ops.qkv_new_token's
    alibi_slopes: torch.Tensor | None = None,  # (num_heads,) float32: ALiBi models (models.alibi)
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
    nd = meta.num_decodes
    max_len = meta.decode_max_seq_len or None  # None inside CUDA graphs: bound by the table width
    order = meta.decode_order(k_cache.shape[2])
    if meta.prefill_block_tables is None:
        return ops.decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale, sliding_window,
            alibi_slopes, max_seq_len=max_len, order=order, after_release=after_release,
        )  # fmt: skip
    out = torch.empty_like(q)
    if nd:  # rows 0..nd-1; in a captured step (runner.batch_graphs) the padding ones have length 0
        ops.decode_attention(
            q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale, sliding_window,
            alibi_slopes, out=out[:nd], max_seq_len=max_len, order=order,
        )  # fmt: skip
    prefill = (meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, scale,
               sliding_window, alibi_slopes)  # fmt: skip
    if meta.prefill_tile_map is not None:
        # a captured step: the prefill chunks' query tiles over the whole step, their query offsets
        # counted from its first row
        tiles = meta.prefill_tile_map
        return ops.paged_attention(q, k_cache, v_cache, *prefill, max_seqlen_q=meta.prefill_max_q, out=out,
                                   tile_map=tiles)  # fmt: skip
    ops.paged_attention(q[nd:], k_cache, v_cache, *prefill, max_seqlen_q=meta.prefill_max_q, out=out[nd:])
    return out


def attention_block(
    qkv: torch.Tensor,  # (num_tokens, (num_heads + 2 * num_kv_heads) * head_dim): the fused projection
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,  # (head_dim,): Qwen3's per-head norm; None skips it
    k_norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,  # (num_tokens,)
    cos_sin: torch.Tensor,  # (max_positions, head_dim)
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    row_scale: tuple[torch.Tensor, float] | None = None,  # (residual, eps): qkv read it un-normalized
) -> torch.Tensor:  # (num_tokens, num_heads * head_dim)
    """Everything between the qkv and o projections: q/k norm, RoPE, the K/V store and attention. With
    row_scale (decode-only steps), qkv is the projection of the residual stream without its RMSNorm (the
    norm's weight folded into it, kernels.dispatch.folded_decode_layer_tail): reference.row_scaled by it
    first."""
    if row_scale is not None and meta.prefill_block_tables is not None:
        raise ValueError("row_scale is for decode-only steps (the folded tails run only there)")
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(t, num_heads, head_dim)
    k = k.reshape(t, num_kv_heads, head_dim)
    v = v.reshape(t, num_kv_heads, head_dim)
    if meta.prefill_block_tables is None:  # decode only: norm, RoPE, store and attention in one launch
        o = ops.qk_norm_rope_decode_attention(
            q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin, kv_cache[0], kv_cache[1],
            meta.slot_mapping, meta.decode_block_tables, meta.decode_seq_lens, scale, sliding_window,
            max_seq_len=meta.decode_max_seq_len or None, order=meta.decode_order(num_kv_heads),
            row_scale=row_scale,
        )  # fmt: skip
        return o.reshape(t, q_size)
    q, _ = ops.qk_norm_rope_store_kv(
        q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin, kv_cache[0], kv_cache[1],
        meta.slot_mapping,
    )  # fmt: skip
    o = paged_attention(q, kv_cache[0], kv_cache[1], meta, scale, sliding_window)
    return o.reshape(t, q_size)


def projected_decode_attention(
    residual: torch.Tensor,  # (batch, hidden): the residual stream, un-normalized
    qkv_weight: torch.Tensor,  # ((num_heads + 2 * num_kv_heads) * head_dim, hidden): the input norm folded in
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    row_eps: float,  # the folded input norm's
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # (batch, num_heads * head_dim)
    """A decode-only step's qkv projection and attention where ops.qkv_epilogue_fits: the projection runs
    the q/k norm, RoPE, row scale and K/V store in its epilogue, the attention walks the cache alone."""
    if meta.prefill_block_tables is not None:
        raise ValueError("projected_decode_attention is for decode-only steps")
    # the rows' order is sorted before the projection, so the attention's launch follows the projection's
    # directly and may start while it ends (it reads the order before its wait: kernels.pdl)
    meta.decode_order(kv_cache[0].shape[2])
    q = ops.qkv_new_token(residual, qkv_weight, num_heads, num_kv_heads, q_norm_weight, k_norm_weight, eps,
                          row_eps, positions, cos_sin, *kv_cache, meta.slot_mapping)  # fmt: skip
    o = paged_attention(q, kv_cache[0], kv_cache[1], meta, scale, sliding_window, after_release=True)
    return o.reshape(q.shape[0], -1)
