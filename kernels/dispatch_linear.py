"""kernels.dispatch's projections and layer tails: the GEMV or the library product, the norm fused into
the projection that reads it, the decode layer tails (one launch at batch 1, folded norms when wide) and
the qkv projection with the new token's work in its epilogue.

The engine calls them through kernels.dispatch; tests that stand in for a choice made here (`_tail_tma`,
`QKV_EPILOGUE_MIN_M`, `use_triton`) patch this module.
"""

from __future__ import annotations

import torch

from kernels import onednn, quant_linear
from kernels import reference as ref
from kernels.backend import use_triton
from kernels.dispatch_pointwise import fused_add_rms_norm, rms_norm, silu_and_mul


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
    """A quantized weight's packed product (kernels.quant_linear), else oneDNN's with the weight packed
    once where kernels.onednn takes it, else F.linear."""
    qw = quant_linear.takes(x, weight)
    if qw is not None:
        return quant_linear.product(x, qw, bias)
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
        from kernels import gemv, gemv_norm

        if gemv.use_gemv(x.shape[0], weight.shape[0], weight.shape[1]):
            return gemv_norm.add_rms_norm_gemv(x, residual, norm_weight.contiguous(), eps, weight, bias)
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
    GEMV takes the batch (kernels.gemv_norm.embed_rms_norm_gemv), else the embedding, then
    add_rms_norm_linear."""
    # with PDL (kernels.pdl) the one launch starts during the step graph's input launch, its weights read
    # before it waits for the ids
    if (
        _gemv_fits(table, weight, bias)
        and norm_weight.dtype == table.dtype
        and ids.dim() == 1
        and ids.dtype == torch.int64
    ):
        from kernels import gemv, gemv_norm, pdl

        if gemv.use_gemv(ids.shape[0], weight.shape[0], weight.shape[1]):
            nw, on = norm_weight.contiguous(), pdl.enabled(table.device)
            return gemv_norm.embed_rms_norm_gemv(ids, table, nw, eps, weight, bias, pdl_on=on)
    x = quant_linear.embedding(ids, table)  # F.embedding, or a quantized table's int8 rows
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
