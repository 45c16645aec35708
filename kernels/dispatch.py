"""The one dispatch point the engine calls: Triton kernels for CUDA tensors, torch references otherwise.

`CHATLOOM_KERNELS=torch` forces the references (read at every call, so tests can flip it). Importing
this module never imports triton: the kernel modules are imported on the first CUDA call, so the CPU
engine runs on a machine without triton.

Differences of the Triton path that callers must respect (the references are pure functions):
- `fused_add_rms_norm`, `apply_rope` and `qk_norm_rope_store_kv` work IN PLACE on CUDA: their two
  tensor inputs are overwritten and returned. Always use the returned tensors; the inputs are consumed.
- `paged_attention` takes `max_seqlen_q` (python int) to size its grid; without it (or 0), it is read
  from cu_seqlens_q with a host sync (fine for prefill, not inside a CUDA graph). A value below the
  true longest q_len silently leaves the excess query rows unwritten.
- `add_rms_norm_linear` may consume x and residual (it is fused_add_rms_norm + linear where the fused
  GEMV does not run); use the returned residual.
- `qk_norm_rope_store_kv` (not a reference kernel of the first list) replaces q_norm + k_norm +
  apply_rope + store_kv: one launch instead of four per layer, for launch-bound decode steps.
- `decode_layer_tail` may consume `residual` (as `add_rms_norm_linear`); use the returned one.
- `decode_attention` takes `out`, `max_seq_len`, `num_splits` (python ints) and is CUDA-graph safe;
  see kernels.decode_attention.paged_decode_attention. A sequence of length 0 yields zeros (the
  reference yields NaN).
"""

from __future__ import annotations

import functools
import os

import torch

from kernels import onednn
from kernels import reference as ref


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """True when `t` lives on CUDA, triton imports and CHATLOOM_KERNELS is not 'torch'."""
    if t.device.type != "cuda":
        return False
    if os.environ.get("CHATLOOM_KERNELS", "").lower() == "torch":
        return False
    return triton_available()


def backend(t: torch.Tensor) -> str:
    return "triton" if use_triton(t) else "torch"


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: (..., hidden)
    if not use_triton(x) or x.stride(-1) != 1:
        return ref.rms_norm(x, weight, eps)
    from kernels.rmsnorm import rms_norm as triton_rms_norm

    return triton_rms_norm(x.reshape(-1, x.shape[-1]), weight.contiguous(), eps).view(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual); IN PLACE on CUDA (inputs consumed)."""
    if (
        not use_triton(x)
        or x.dim() != 2
        or weight.dtype != x.dtype
        or residual.dtype != x.dtype
        or x.stride(-1) != 1
        or residual.stride(-1) != 1
    ):
        return ref.fused_add_rms_norm(x, residual, weight, eps)
    from kernels.rmsnorm import fused_add_rms_norm as triton_fused

    return triton_fused(x, residual, weight.contiguous(), eps)


def apply_rope(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns rotated (q, k); IN PLACE on CUDA (inputs consumed)."""
    if not use_triton(q):
        return ref.apply_rope(q, k, positions, cos_sin)
    from kernels.rope import apply_rope as triton_rope

    return triton_rope(q, k, positions, cos_sin.contiguous())


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


def silu_and_mul(x: torch.Tensor, row_scale: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """x: (..., 2 * intermediate) -> (..., intermediate); with row_scale (h (tokens, hidden), eps), of
    reference.row_scaled(x, h, eps) (x: (tokens, 2 * intermediate))."""
    if not use_triton(x) or x.stride(-1) != 1:
        if row_scale is not None:
            x = ref.row_scaled(x, *row_scale)
        return ref.silu_and_mul(x)
    from kernels.activation import silu_and_mul as triton_silu_and_mul

    scale = (row_scale[0].contiguous(), row_scale[1]) if row_scale is not None else None
    out = triton_silu_and_mul(x.reshape(-1, x.shape[-1]), row_scale=scale)
    return out.view(*x.shape[:-1], x.shape[-1] // 2)


def apply_token_bitmask_(
    logits: torch.Tensor,  # (batch, vocab) float
    bitmask: torch.Tensor,  # (batch, >= ceil(vocab / 32)) int32
    indices: torch.Tensor | None = None,  # (num_rows,) int: rows of logits and bitmask to apply
) -> None:
    if use_triton(logits):
        from kernels.bitmask import apply_token_bitmask_ as triton_apply

        triton_apply(logits, bitmask, indices)
        return
    if indices is None:
        ref.apply_token_bitmask_(logits, bitmask)
        return
    rows = indices.long()
    sub = logits[rows]
    ref.apply_token_bitmask_(sub, bitmask[rows])
    logits[rows] = sub


def _gemv_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    # eager (outside CUDA graphs) a Triton launch costs the host more than cuBLAS's; the engine's decode
    # steps are graphed, where only GPU time counts
    return (
        x.dim() == 2
        and use_triton(x)
        and weight.dtype == x.dtype
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.stride(-1) == 1
        and weight.stride(-1) == 1
        and (bias is None or bias.dtype == x.dtype)
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T + bias: on CUDA the Triton GEMV for decode-sized 16-bit batches (the
    shapes where it beats cuBLAS, kernels.gemv.use_gemv); float32 on the CPU oneDNN's product with the
    weight packed once (kernels.onednn); else F.linear."""
    if _gemv_fits(x, weight, bias):
        from kernels import gemv

        if gemv.use_gemv(x.shape[0], weight.shape[0], weight.shape[1]):
            return gemv.gemv(x, weight, bias)
    return _library_linear(x, weight, bias)


def lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # (M, vocab), hidden's dtype
    """hidden (M, H) @ weight (vocab, H)^T: `linear` without the GEMV (cuBLAS on CUDA; oneDNN's packed
    product in float32 on the CPU)."""
    return _library_linear(hidden, weight, None)


def _library_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product with the weight packed once where kernels.onednn takes it, else F.linear."""
    packed = onednn.packed_weight(x, weight, bias)
    if packed is not None:
        return onednn.product(x, packed, bias)
    return ref.linear(x, weight, bias)


def silu_and_mul_linear(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """linear(silu_and_mul(gate_up), weight, bias): gate_up (M, 2K), weight (N, K). Where the Triton GEMV
    runs (see `linear`), it computes the activation as it reads its input: one launch, not two."""
    if _gemv_fits(gate_up, weight, bias):
        from kernels import gemv

        if gemv.use_gemv(gate_up.shape[0], weight.shape[0], weight.shape[1]):
            return gemv.gemv(gate_up, weight, bias, silu_mul=True)
    return linear(silu_and_mul(gate_up), weight, bias)


def add_rms_norm_linear(
    x: torch.Tensor,  # (M, K)
    residual: torch.Tensor | None,  # (M, K); None (the first layer): normalize x alone
    norm_weight: torch.Tensor,  # (K,)
    eps: float,
    weight: torch.Tensor,  # (N, K)
    bias: torch.Tensor | None = None,  # (N,)
) -> tuple[torch.Tensor, torch.Tensor]:  # y (M, N), new residual (M, K)
    """(linear(rms_norm(x + residual)), x + residual), or (linear(rms_norm(x)), x) without a residual.
    Where `linear` would take the Triton GEMV, one launch: the GEMV normalizes its input as it reads it.
    Elsewhere the unfused ops, so x and residual are consumed (in place on CUDA, see the docstring)."""
    if (
        _gemv_fits(x, weight, bias)
        and norm_weight.dtype == x.dtype
        and (residual is None or (residual.dtype == x.dtype and residual.stride(-1) == 1))
    ):
        from kernels import gemv

        if gemv.use_gemv(x.shape[0], weight.shape[0], weight.shape[1]):
            return gemv.add_rms_norm_gemv(x, residual, norm_weight.contiguous(), eps, weight, bias)
    if residual is None:
        h, residual = rms_norm(x, norm_weight, eps), x
    else:
        h, residual = fused_add_rms_norm(x, residual, norm_weight, eps)
    return linear(h, weight, bias), residual


def embed_rms_norm_linear(
    ids: torch.Tensor,  # (M,) int64 token ids
    table: torch.Tensor,  # (vocab, K): the embedding
    norm_weight: torch.Tensor,  # (K,)
    eps: float,
    weight: torch.Tensor,  # (N, K)
    bias: torch.Tensor | None = None,  # (N,)
) -> tuple[torch.Tensor, torch.Tensor]:  # y (M, N), the embedding rows (M, K): the residual stream
    """A first layer's input: (linear(rms_norm(table[ids])), table[ids]). One launch where the Triton
    GEMV takes the batch (kernels.gemv.embed_rms_norm_gemv), else the embedding, then
    add_rms_norm_linear."""
    # with PDL (kernels.pdl) the one launch starts during the step graph's input launch, its weights read
    # before it waits for the ids
    if (
        _gemv_fits(table, weight, bias)
        and norm_weight.dtype == table.dtype
        and ids.dim() == 1
        and ids.dtype == torch.int64
    ):
        from kernels import gemv, pdl

        if gemv.use_gemv(ids.shape[0], weight.shape[0], weight.shape[1]):
            nw, on = norm_weight.contiguous(), pdl.enabled(table.device)
            return gemv.embed_rms_norm_gemv(ids, table, nw, eps, weight, bias, pdl_on=on)
    x = torch.nn.functional.embedding(ids, table)
    return add_rms_norm_linear(x, None, norm_weight, eps, weight, bias)


def _tail_tma(x: torch.Tensor, w: ref.TailWeights):
    """kernels.decode_tail_tma where it takes this batch (Hopper, Gluon, shapes that divide), else None
    (kernels.decode_tail stays the fallback: GPUs before Hopper, a Triton without Gluon)."""
    if not (use_triton(x) and x.dim() == 2):
        return None
    try:
        from kernels import decode_tail_tma
    except ImportError:  # a Triton without Gluon's Hopper TMA
        return None
    return decode_tail_tma if decode_tail_tma.fits(x.shape[0], x.dtype, w, x.device) else None


def _tail_fused(x: torch.Tensor, w: ref.TailWeights) -> bool:
    """Whether decode_layer_tail runs the one-launch kernel for a batch shaped like x (M, .)."""
    if not (use_triton(x) and x.dim() == 2):
        return False
    from kernels import decode_tail

    return decode_tail.fits(x.shape[0], x.dtype, w, x.device)


def decode_layer_tail(
    a: torch.Tensor,  # (M, A): the attention output
    residual: torch.Tensor,  # (M, H)
    w: ref.TailWeights,
) -> tuple[torch.Tensor, torch.Tensor]:  # (next layer's qkv (M, NQ) or the MLP output (M, H), residual)
    """o projection, residual add + RMSNorm + gate_up, SiLU + down and (w.qkv_next) the next layer's
    residual add + RMSNorm + qkv: on CUDA at decode batch 1 one persistent launch (kernels.decode_tail_tma
    where it fits, else kernels.decode_tail), elsewhere the ops above one by one (which may consume
    `residual`, as add_rms_norm_linear does)."""
    tma = _tail_tma(a, w) if residual.dtype == a.dtype else None
    if tma is not None:
        return tma.decode_layer_tail(a, residual, w)
    if _tail_fused(a, w) and residual.dtype == a.dtype:
        from kernels import decode_tail

        return decode_tail.decode_layer_tail(a, residual, w)
    return decode_layer_tail_by_op(a, residual, w)


def decode_layer_tail_by_op(
    a: torch.Tensor, residual: torch.Tensor, w: ref.TailWeights
) -> tuple[torch.Tensor, torch.Tensor]:
    """decode_layer_tail as the ops one by one (on the CPU the references: reference.decode_layer_tail's
    steps)."""
    o = linear(a, w.o, w.o_bias)
    gate_up, residual = add_rms_norm_linear(o, residual, w.norm2, w.eps2, w.gate_up, w.gate_up_bias)
    y = silu_and_mul_linear(gate_up, w.down, w.down_bias)
    if w.qkv_next is None:
        return y, residual
    return add_rms_norm_linear(y, residual, w.norm1_next, w.eps1_next, w.qkv_next, w.qkv_next_bias)


# Wide decode-only steps of a model whose RMSNorm weights are folded into the projections they feed
# (LlamaForCausalLM.fold_norms): a layer's tail is the four projections and the SiLU-and-mul, with no norm
# launch. The o and down GEMMs add into the residual stream (beta = 1), gate_up and the next qkv read it
# un-normalized, and the launch after each (the SiLU-and-mul, the next layer's decode attention) multiplies
# by 1 / rms of the row (reference.row_scaled). From FOLD_MIN_M rows: below, the GEMV takes o_proj.
FOLD_MIN_M = 5


def folded_tail_fits(m: int, w: ref.TailWeights) -> bool:
    """Whether folded_decode_layer_tail takes a tail of m rows (a layer before the last, no biases)."""
    biases = (w.o_bias, w.gate_up_bias, w.down_bias, w.qkv_next_bias)
    return m >= FOLD_MIN_M and w.qkv_next is not None and all(b is None for b in biases)


def folded_decode_layer_tail(
    a: torch.Tensor,  # (M, A): the attention output
    residual: torch.Tensor,  # (M, H), updated in place
    w: ref.TailWeights,  # norm2 and norm1_next folded into gate_up and qkv_next (their weights ones)
    qkv: bool = True,  # False: the next layer projects the residual itself (qkv_new_token)
) -> tuple[torch.Tensor | None, torch.Tensor]:  # (next qkv of the un-normalized residual (M, NQ), residual)
    """decode_layer_tail of a folded model, its next qkv left for row_scaled(qkv, residual, w.eps1_next)
    (the decode attention applies it: qk_norm_rope_decode_attention's row_scale)."""
    residual.addmm_(a, w.o.t())  # residual + o
    gate_up = torch.nn.functional.linear(residual, w.gate_up)
    y = silu_and_mul(gate_up, (residual, w.eps2))
    residual.addmm_(y, w.down.t())
    return (torch.nn.functional.linear(residual, w.qkv_next) if qkv else None), residual


# Wide folded decode steps from QKV_EPILOGUE_MIN_M rows: a layer's qkv projection of the residual stream
# runs the new token's q/k norm, RoPE, row scale and K/V store in its epilogue (kernels.qkv_new_token), and
# its decode attention only walks the cache, started by programmatic dependent launch while the
# projection ends. Below, cuBLAS's projection and the fused attention launch are faster (the Triton
# GEMM's extra time outweighs the attention's gain; docs/performance.md has the measurements).
QKV_EPILOGUE_MIN_M = 33


def qkv_epilogue_fits(x: torch.Tensor, weight: torch.Tensor, head_dim: int) -> bool:
    """Whether qkv_new_token takes the folded projection `weight` of the residual rows x (M, hidden)."""
    if not (use_triton(x) and x.dim() == 2 and x.shape[0] >= QKV_EPILOGUE_MIN_M):
        return False
    from kernels.qkv_new_token import hopper_or_later, supports

    dtypes_fit = x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
    layouts_fit = weight.is_contiguous() and x.stride(-1) == 1
    # tuned on the H200: its tiles ask for more shared memory than older GPUs' SMs hold
    gpu_fits = hopper_or_later(x.device.index)
    return dtypes_fit and layouts_fit and gpu_fits and supports(x.shape[1], head_dim)


def qkv_new_token(
    x: torch.Tensor,  # (M, hidden): the residual stream, un-normalized
    weight: torch.Tensor,  # ((num_heads + 2 * num_kv_heads) * head_dim, hidden), the input norm folded in
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    row_eps: float,
    positions: torch.Tensor,  # (M,)
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (M,); < 0 = padding
) -> torch.Tensor:  # (M, num_heads, head_dim): q, normed and rotated
    """reference.qkv_new_token: the new k and v into the cache, q returned; one launch on CUDA."""
    args = (x, weight, num_heads, num_kv_heads, q_norm_weight, k_norm_weight, eps, row_eps, positions,
            cos_sin.contiguous(), k_cache, v_cache, slot_mapping)  # fmt: skip
    if use_triton(x):
        from kernels.qkv_new_token import qkv_new_token as triton_qkv_new_token

        return triton_qkv_new_token(*args)
    return ref.qkv_new_token(*args)


def sample_tokens(
    logits: torch.Tensor,  # (batch, vocab)
    temperatures: torch.Tensor,  # (batch,) float32; 0 = greedy
    seed: int,
    generator: torch.Generator | None = None,
    mask: torch.Tensor | None = None,  # (table rows, words) int32 grammar bitmasks
    mask_rows: torch.Tensor | None = None,  # (batch,) int32: each row's bitmask in `mask`, -1 = none
    out: torch.Tensor | None = None,  # (batch,) int64 that receives the tokens
) -> torch.Tensor:  # (batch,) int64 (out when given)
    """Temperature sampling (softmax + exponential race), greedy where T == 0, of the logits with
    each row's bitmask applied (the logits are left as they are). On CUDA one fused pass keyed by
    `seed`; the reference draws its noise from `generator`. Same law, different random streams."""
    if use_triton(logits) and logits.dim() == 2 and logits.stride(-1) == 1:
        from kernels.sampling import sample_tokens as triton_sample

        return triton_sample(logits, temperatures, seed, mask=mask, mask_rows=mask_rows, out=out)
    if mask is not None:
        logits = masked_by_rows(logits, mask, mask_rows)
    tokens = ref.sample_tokens(logits, temperatures, generator)
    return tokens if out is None else out.copy_(tokens)


def lm_head_sample_fits(x: torch.Tensor) -> bool:
    """Whether lm_head_sample runs as one Triton launch for hidden states x (batch 1, 16-bit, CUDA)."""
    return use_triton(x) and x.dim() == 2 and x.shape[0] == 1 and x.dtype in (torch.float16, torch.bfloat16)


def lm_head_sample(
    x: torch.Tensor,  # (M, hidden): the last layer's output
    residual: torch.Tensor,  # (M, hidden): its residual stream
    norm_weight: torch.Tensor,  # (hidden,): the final RMSNorm
    eps: float,
    weight: torch.Tensor,  # (vocab, hidden)
    temperatures: torch.Tensor,  # (M,) float32; 0 = greedy
    seed: torch.Tensor,  # (1,) int64 on the device, read at run time, then advanced by one
    out: torch.Tensor,  # (M,) int64 that receives the tokens
    publish: tuple[torch.Tensor, torch.Tensor] | None = None,  # (host ring, counter): publish_tokens
) -> torch.Tensor:
    """The end of a step graph: sample_tokens(linear(rms_norm(x + residual), weight), temperatures,
    seed) into out, the seed advanced, and with `publish` the tokens written into the host ring
    (publish_tokens). One launch where lm_head_sample_fits, else the ops one by one."""
    if lm_head_sample_fits(x):
        from kernels.lm_head_sample import lm_head_sample as triton_lm_head_sample

        norm = (norm_weight, eps)
        return triton_lm_head_sample(x, weight, temperatures, seed, out, residual=residual,
                                     norm=norm, advance_seed=True, publish=publish)  # fmt: skip
    hidden, _ = fused_add_rms_norm(x, residual, norm_weight, eps)
    sample_tokens(linear(hidden, weight), temperatures, seed, out=out)
    seed.add_(1)
    if publish is not None:
        publish_tokens(out, *publish)
    return out


def publish_tokens(
    tokens: torch.Tensor,  # (size,) int64 on the device
    ring: torch.Tensor,  # (slots, n) int64, pinned host memory on CUDA
    counter: torch.Tensor,  # (1,) int64 beside tokens: launches so far
) -> None:
    """tokens into row counter % slots of the host ring, written by the device (kernels.publish)."""
    if use_triton(tokens):
        from kernels.publish import publish_tokens as triton_publish

        triton_publish(tokens, ring, counter)
    else:
        ref.publish_tokens(tokens, ring, counter)


def mapped_step_inputs(
    host64: torch.Tensor,  # (slots, 4n + 4) int64, pinned on CUDA
    host32: torch.Tensor,  # (slots, n + n * max_blocks) int32, pinned on CUDA
    counter: torch.Tensor,  # (1,) int64 on the device: the ring row is counter % slots
    head: torch.Tensor,  # (>= 3n,) int64: [ids | positions | slots]
    lens: torch.Tensor,  # (n,) int32
    table: torch.Tensor,  # (n, max_blocks) int32
    tokens: torch.Tensor,  # (n,) int64: the previous step's sampled ids
    size: int,  # the captured batch
) -> None:
    """A step graph's first launch reading the step from pinned host memory (kernels.step_inputs)."""
    if use_triton(head):
        from kernels.step_inputs import mapped_step_inputs as triton_mapped

        triton_mapped(host64, host32, counter, head, lens, table, tokens, size)
    else:
        ref.mapped_step_inputs(host64, host32, counter, head, lens, table, tokens, size)


def decode_step_inputs(
    head: torch.Tensor,  # (5n + 4,) int64: [ids | positions | slots | k, rows, width, 0 | at (k) | src (k)]
    packed: torch.Tensor,  # (n + rows * width,) int32: [lengths | the rows' block tables]
    table: torch.Tensor,  # (n, max_blocks) int32
    tokens: torch.Tensor,  # (n,) int64: the previous step's sampled ids
    size: int,  # the captured batch
) -> None:
    """The first launch of a captured decode step (kernels.step_inputs): the in-flight tokens into the
    ids, the packed block-table rows into the graph's table."""
    if use_triton(head):
        from kernels.step_inputs import decode_step_inputs as triton_inputs

        triton_inputs(head, packed, table, tokens, size)
    else:
        ref.decode_step_inputs(head, packed, table, tokens, size)


def masked_by_rows(logits: torch.Tensor, mask: torch.Tensor, mask_rows: torch.Tensor) -> torch.Tensor:
    """A copy of logits (batch, vocab) with row i masked by mask[mask_rows[i]] (-1: left as is)."""
    logits = logits.clone()
    rows = mask_rows.long()
    keep = torch.nonzero(rows >= 0).flatten()
    if keep.numel():
        sub = logits[keep]
        ref.apply_token_bitmask_(sub, mask[rows[keep]][:, : (logits.shape[1] + 31) // 32])
        logits[keep] = sub
    return logits


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
