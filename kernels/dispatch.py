"""The one dispatch point the engine calls: Triton kernels for CUDA tensors, torch references otherwise.

`CHATLOOM_KERNELS=torch` forces the references (read at every call, so tests can flip it). Importing
this module never imports triton: the kernel modules are imported on the first CUDA call, so the CPU
engine runs on a machine without triton. The choice is kernels.backend's; the ops live by role in
kernels.dispatch_attention, kernels.dispatch_pointwise and kernels.dispatch_linear and are re-exported
here; sampling, token publishing and the step graphs' input launches are this module's own.

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

import torch

from kernels import reference as ref
from kernels.backend import backend, triton_available, use_triton
from kernels.dispatch_attention import (
    decode_attention,
    decode_order,
    paged_attention,
    prefill_query_tile,
    prefill_tile_map,
    qk_norm_rope_decode_attention,
    qk_norm_rope_store_kv,
    store_kv,
)
from kernels.dispatch_linear import (
    add_rms_norm_linear,
    decode_layer_tail,
    decode_layer_tail_by_op,
    embed_rms_norm_linear,
    folded_decode_layer_tail,
    folded_tail_fits,
    linear,
    lm_head,
    qkv_epilogue_fits,
    qkv_new_token,
    silu_and_mul_linear,
)
from kernels.dispatch_pointwise import (
    apply_rope,
    apply_token_bitmask_,
    fused_add_rms_norm,
    rms_norm,
    silu_and_mul,
)

# the engine calls every op through this module (`from kernels import dispatch as ops`)
__all__ = [
    "backend",
    "triton_available",
    "use_triton",
    "store_kv",
    "paged_attention",
    "prefill_query_tile",
    "prefill_tile_map",
    "decode_attention",
    "decode_order",
    "qk_norm_rope_store_kv",
    "qk_norm_rope_decode_attention",
    "rms_norm",
    "fused_add_rms_norm",
    "apply_rope",
    "silu_and_mul",
    "apply_token_bitmask_",
    "linear",
    "lm_head",
    "silu_and_mul_linear",
    "add_rms_norm_linear",
    "embed_rms_norm_linear",
    "decode_layer_tail",
    "decode_layer_tail_by_op",
    "folded_tail_fits",
    "folded_decode_layer_tail",
    "qkv_epilogue_fits",
    "qkv_new_token",
    "sample_tokens",
    "lm_head_sample_fits",
    "lm_head_sample",
    "publish_tokens",
    "mapped_step_inputs",
    "decode_step_inputs",
    "masked_by_rows",
]


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
