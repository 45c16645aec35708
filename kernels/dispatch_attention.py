"""kernels.dispatch's attention ops: the KV-cache store, paged prefill and decode attention, the decode
rows' order, and the new token's q/k norm + RoPE (with the decode attention in one launch on CUDA).

The engine calls them through kernels.dispatch; the differences of the Triton path are in its docstring.
"""

from __future__ import annotations

import torch

from kernels import reference as ref
from kernels.backend import use_triton


def store_kv(
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int; < 0 = padding
) -> None:
    if use_triton(k):
        from kernels.kv_cache import store_kv as triton_store_kv

        triton_store_kv(k, v, k_cache, v_cache, slot_mapping)
    else:
        ref.store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    cu_seqlens_q: torch.Tensor,  # (batch + 1,) int32
    seq_lens: torch.Tensor,  # (batch,) int32
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    *,
    max_seqlen_q: int | None = None,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    tile_map: torch.Tensor | None = None,
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
    """max_seqlen_q: longest new-token count; max_seq_len: a bound on the contexts (only tunes the
    split-K choice). Both python ints; the reference ignores them. `out` (like q) receives the result.
    tile_map: (2, num_tiles) int32 from prefill_tile_map, the kernel's programs listed per query tile
    (a graph replayed over other sequences); a scheduling detail the reference ignores."""
    if not use_triton(q):
        res = ref.paged_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, sliding_window, alibi_slopes
        )
        return res if out is None else out.copy_(res)
    from kernels.prefill_attention import paged_prefill_attention

    if not max_seqlen_q:  # unknown (None, or a metadata default of 0): one host sync
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if seq_lens.numel() else 0
    return paged_prefill_attention(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_seqlen_q, scale,
        sliding_window, alibi_slopes, out=out, max_seq_len=max_seq_len, tile_map=tile_map,
    )  # fmt: skip


def prefill_query_tile(dtype: torch.dtype, device: torch.device) -> int:
    """Queries per program of paged_attention on this device: the query_tile of prefill_tile_map."""
    from kernels.prefill_attention import prefill_block_m

    return prefill_block_m(dtype, device)


def prefill_tile_map(q_lens, query_tile: int, num_tiles: int):
    """(2, num_tiles) int32 numpy map [sequence | query tile] of the query tiles of sequences with q_lens
    new tokens each (-1 past them), for paged_attention's tile_map."""
    from kernels.prefill_attention import prefill_tile_map as tile_map

    return tile_map(q_lens, query_tile, num_tiles)


def decode_attention(
    q: torch.Tensor,  # (batch, num_heads, head_dim)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    seq_lens: torch.Tensor,  # (batch,) int32, incl. the new token
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    order: torch.Tensor | None = None,  # (batch,) int32: the rows longest first (decode_order)
    after_release: bool = False,  # the launch before is kernels.qkv_new_token's (kernels.pdl)
) -> torch.Tensor:  # (batch, num_heads, head_dim)
    if not use_triton(q):
        res = ref.decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, alibi_slopes
        )
        return res if out is None else out.copy_(res)
    from kernels.decode_attention import paged_decode_attention

    return paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, alibi_slopes,
        out=out, max_seq_len=max_seq_len, num_splits=num_splits, order=order, after_release=after_release,
    )  # fmt: skip


def decode_order(seq_lens: torch.Tensor, num_kv_heads: int) -> torch.Tensor | None:
    """The `order` decode attention over these sequences takes (the rows longest first: the kernel
    starts the longest contexts first), or None where it takes none (a narrow batch, or kernels that
    are not Triton's)."""
    if not use_triton(seq_lens):
        return None
    from kernels.decode_launch import longest_first, wants_order

    return longest_first(seq_lens) if wants_order(seq_lens.shape[0], num_kv_heads, seq_lens.device) else None


def qk_norm_rope_store_kv(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    q_norm_weight: torch.Tensor | None,  # (head_dim,): Qwen3's per-head norm; None skips the norm
    k_norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int; < 0 = padding
) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k norm + RoPE + store_kv in one launch on CUDA; returns rotated (q, k), IN PLACE on CUDA."""
    weights = _qk_norm_weights(q, q_norm_weight, k_norm_weight)
    if not use_triton(q) or weights is None:
        return ref.qk_norm_rope_store_kv(
            q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin, k_cache, v_cache, slot_mapping
        )
    from kernels.qk_norm_rope import qk_norm_rope_store_kv as triton_fused

    q_norm_weight, k_norm_weight = weights
    return triton_fused(
        q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin.contiguous(), k_cache, v_cache,
        slot_mapping,
    )  # fmt: skip


def _qk_norm_weights(q: torch.Tensor, q_w: torch.Tensor | None, k_w: torch.Tensor | None):
    """(q_w, k_w) made contiguous for the fused Triton kernels, (None, None) without a q/k norm, or
    None when the weights' dtype differs from q's (the kernels need one dtype: use the reference)."""
    if q_w is None:
        return None, None
    if q_w.dtype != q.dtype or k_w.dtype != q.dtype:
        return None
    return q_w.contiguous(), k_w.contiguous()


def qk_norm_rope_decode_attention(
    q: torch.Tensor,  # (batch, num_heads, head_dim): the new tokens' raw q (a view of the qkv output)
    k: torch.Tensor,  # (batch, num_kv_heads, head_dim): raw k
    v: torch.Tensor,  # (batch, num_kv_heads, head_dim)
    q_norm_weight: torch.Tensor | None,  # (head_dim,) or None (no q/k norm)
    k_norm_weight: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,  # (batch,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (batch,) int; < 0 = padding
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    seq_lens: torch.Tensor,  # (batch,) int32, incl. the new token
    scale: float,
    sliding_window: int | None = None,
    *,
    max_seq_len: int | None = None,
    order: torch.Tensor | None = None,  # (batch,) int32: the rows longest first (decode_order)
    row_scale: tuple[torch.Tensor, float] | None = None,  # (h (batch, hidden), eps): folded_decode_layer_tail
) -> torch.Tensor:  # (batch, num_heads, head_dim)
    """qk_norm_rope_store_kv + decode_attention of a decode-only batch; on CUDA one launch, which
    leaves q and k as they are (the two-step path rotates them in place). With row_scale, q, k and v are
    reference.row_scaled by it first."""
    weights = _qk_norm_weights(q, q_norm_weight, k_norm_weight)
    if not use_triton(q) or weights is None or k.stride(1) != k.shape[-1] or v.stride(1) != v.shape[-1]:
        if q.device.type == "cpu" and q_norm_weight is None and row_scale is None:
            from kernels import cpu_decode  # the per-step tables built once per step

            return cpu_decode.rope_store_decode_attention(
                q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens, scale,
                sliding_window,
            )  # fmt: skip
        if row_scale is not None:
            q, k, v = (ref.row_scaled(t, *row_scale) for t in (q, k, v))
        q, _ = qk_norm_rope_store_kv(
            q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin, k_cache, v_cache, slot_mapping
        )
        return decode_attention(
            q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, max_seq_len=max_seq_len,
            order=order,
        )  # fmt: skip
    from kernels.decode_attention import paged_decode_attention
    from kernels.decode_launch import NewTokenQK

    q_norm_weight, k_norm_weight = weights
    h, h_eps = row_scale if row_scale is not None else (None, 0.0)
    new = NewTokenQK(k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin.contiguous(), slot_mapping,
                     h.contiguous() if h is not None else None, h_eps)  # fmt: skip
    return paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, max_seq_len=max_seq_len,
        new_token=new, order=order,
    )  # fmt: skip
