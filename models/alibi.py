"""The ALiBi family in one plain, single-device model: BLOOM (BloomForCausalLM) and MPT (MptForCausalLM).

Both are pre-LayerNorm decoders with a fused qkv projection, a GELU MLP and no position embedding: each
head's attention scores get slope_h * (key position - query position) added (ALiBi), inside the paged
attention kernels (kernels.reference._bias), which derive both positions from the sequence's context
length. A cached prefix, a prefill chunk and a decode step therefore need nothing beyond the paged
metadata every model gets. What differs between the two, AlibiSpec holds:

    BLOOM  LayerNorm with bias, a LayerNorm after the embedding, biases on every projection, qkv laid
           out per head as (heads, 3, head_dim) (reordered to [q; k; v] at load), tanh GELU, BLOOM's
           slopes; optionally the residual taken after the norm (apply_residual_connection_post_layernorm)
    MPT    LayerNorm without bias, no projection bias, qkv as [q; k; v], optional clip_qkv and softmax
           scale, exact GELU, MPT's slopes (alibi_bias_max)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels import dispatch as ops
from kernels import quant_linear
from models.attention import AttentionMetadata, paged_attention


def bloom_slopes(num_heads: int) -> torch.Tensor:  # (num_heads,) float32
    """BLOOM's slopes: for the largest power of two p <= num_heads, 2^(-8i/p) for i = 1..p; the remaining
    heads take every other slope of the sequence for 2p heads (odd i), as the ALiBi paper prescribes."""
    p = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2.0 ** (-8.0 / p), dtype=torch.float32)
    slopes = base ** torch.arange(1, p + 1, dtype=torch.float32)
    if p != num_heads:
        extra = torch.tensor(2.0 ** (-8.0 / (2 * p)), dtype=torch.float32)
        rest = min(p, num_heads - p)
        slopes = torch.cat([slopes, extra ** torch.arange(1, 2 * rest, 2, dtype=torch.float32)])
    return slopes


def mpt_slopes(num_heads: int, bias_max: float = 8.0) -> torch.Tensor:  # (num_heads,) float32
    """MPT's slopes: for p = num_heads rounded up to a power of two, 1 / 2^(i * bias_max / p), i = 1..p;
    with fewer heads than p, the even-indexed ones (i = 2, 4, ...) first, then the odd, cut to num_heads."""
    p = 2 ** math.ceil(math.log2(num_heads))
    exponents = torch.arange(1, p + 1, dtype=torch.float32) * (bias_max / p)
    slopes = 1.0 / torch.pow(2.0, exponents)
    if p != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


@dataclass(frozen=True)
class AlibiSpec:
    arch: str  # "bloom" | "mpt"
    hidden: int
    num_heads: int
    num_layers: int
    intermediate: int
    eps: float
    linear_bias: bool  # biases on qkv, out, up and down
    norm_bias: bool  # LayerNorms with a bias
    embed_norm: bool  # a LayerNorm right after the embedding (BLOOM)
    qkv_per_head: bool  # checkpoint's qkv rows are (heads, 3, head_dim) (BLOOM), else (3, heads, head_dim)
    gelu: str  # F.gelu's approximate: "tanh" | "none"
    residual_post_norm: bool  # the residual is the norm's output, not its input
    clip_qkv: float | None
    scale: float  # softmax scale
    tie_word_embeddings: bool
    slopes: tuple[float, ...]


def alibi_spec(config) -> AlibiSpec:
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not divisible by {heads} attention heads")
    head_dim = hidden // heads
    tie = bool(getattr(config, "tie_word_embeddings", True))
    common: dict[str, Any] = dict(hidden=hidden, num_heads=heads, num_layers=int(config.num_hidden_layers),
                                  eps=float(config.layer_norm_epsilon), tie_word_embeddings=tie)  # fmt: skip
    if config.model_type == "bloom":
        post = bool(getattr(config, "apply_residual_connection_post_layernorm", False))
        return AlibiSpec(
            arch="bloom", intermediate=4 * hidden, linear_bias=True, norm_bias=True, embed_norm=True,
            qkv_per_head=True, gelu="tanh", residual_post_norm=post, clip_qkv=None, scale=head_dim**-0.5,
            slopes=tuple(bloom_slopes(heads).tolist()), **common,
        )  # fmt: skip
    if config.model_type == "mpt":
        attn = config.attn_config
        clip = getattr(attn, "clip_qkv", None)
        scale = getattr(attn, "softmax_scale", None) or head_dim**-0.5
        slopes = mpt_slopes(heads, float(getattr(attn, "alibi_bias_max", 8)))
        return AlibiSpec(
            arch="mpt", intermediate=int(getattr(config, "expansion_ratio", 4) * hidden), linear_bias=False,
            norm_bias=False, embed_norm=False, qkv_per_head=False, gelu="none", residual_post_norm=False,
            clip_qkv=float(clip) if clip else None, scale=float(scale), slopes=tuple(slopes.tolist()),
            **common,
        )  # fmt: skip
    raise ValueError(f"not an ALiBi model: model_type {config.model_type!r}")


class AlibiAttention(nn.Module):
    def __init__(self, spec: AlibiSpec) -> None:
        super().__init__()
        self.num_heads = self.num_kv_heads = spec.num_heads  # multi-head: one KV head per query head
        self.head_dim = spec.hidden // spec.num_heads
        self.scale = spec.scale
        self.clip_qkv = spec.clip_qkv
        self.qkv = nn.Linear(spec.hidden, 3 * spec.hidden, bias=spec.linear_bias)  # rows [q; k; v]
        self.out = nn.Linear(spec.hidden, spec.hidden, bias=spec.linear_bias)

    def forward(
        self,
        x: torch.Tensor,  # (num_tokens, hidden), normalized
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        slopes: torch.Tensor,  # (num_heads,) float32
    ) -> torch.Tensor:  # (num_tokens, hidden), after the out projection
        t = x.shape[0]
        qkv = ops.linear(x, self.qkv.weight, self.qkv.bias)
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        # (num_tokens, heads, head_dim) each, views of qkv
        q, k, v = qkv.view(t, 3, self.num_heads, self.head_dim).unbind(1)
        ops.store_kv(k, v, kv_cache[0], kv_cache[1], meta.slot_mapping)
        o = paged_attention(q, kv_cache[0], kv_cache[1], meta, self.scale, alibi_slopes=slopes)
        return ops.linear(o.reshape(t, -1), self.out.weight, self.out.bias)


class AlibiBlock(nn.Module):
    def __init__(self, spec: AlibiSpec) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.hidden, eps=spec.eps, bias=spec.norm_bias)
        self.self_attn = AlibiAttention(spec)
        self.norm2 = nn.LayerNorm(spec.hidden, eps=spec.eps, bias=spec.norm_bias)
        self.up = nn.Linear(spec.hidden, spec.intermediate, bias=spec.linear_bias)
        self.down = nn.Linear(spec.intermediate, spec.hidden, bias=spec.linear_bias)
        self.gelu = spec.gelu
        self.residual_post_norm = spec.residual_post_norm

    def forward(self, x, kv_cache, meta, slopes) -> torch.Tensor:  # (num_tokens, hidden) -> the same
        h = self.norm1(x)
        x = self.self_attn(h, kv_cache, meta, slopes) + (h if self.residual_post_norm else x)
        h = self.norm2(x)
        m = F.gelu(ops.linear(h, self.up.weight, self.up.bias), approximate=self.gelu)
        return ops.linear(m, self.down.weight, self.down.bias) + (h if self.residual_post_norm else x)


class AlibiForCausalLM(nn.Module):
    # the final norm is a LayerNorm: the step graphs' fused RMSNorm + lm_head + sampling
    # (kernels.lm_head_sample) does not apply, so the engine samples these models' logits on its own
    rms_final_norm = False

    def __init__(self, config, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.spec = spec = alibi_spec(config)
        self.max_positions = max_positions
        self.embed_tokens = nn.Embedding(config.vocab_size, spec.hidden)
        self.embed_norm = nn.LayerNorm(spec.hidden, eps=spec.eps) if spec.embed_norm else None
        self.layers = nn.ModuleList(AlibiBlock(spec) for _ in range(spec.num_layers))
        self.norm = nn.LayerNorm(spec.hidden, eps=spec.eps, bias=spec.norm_bias)
        self.tie_word_embeddings = spec.tie_word_embeddings
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(spec.hidden, config.vocab_size, bias=False)
        # a plain attribute, not a buffer: it stays float32 when the model moves to a 16-bit dtype
        self.alibi_slopes = torch.tensor(spec.slopes, dtype=torch.float32)

    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,)
        positions: torch.Tensor,  # (num_tokens,): unused, ALiBi's positions come from the context lengths
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        final_norm: bool = True,
    ) -> torch.Tensor:  # (num_tokens, hidden)
        if not final_norm:
            raise ValueError("ALiBi models apply their final LayerNorm themselves (rms_final_norm is False)")
        x = quant_linear.embedding(input_ids, self.embed_tokens.weight)  # int8 rows once quantized
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x = layer(x, kv, meta, self.alibi_slopes)
        return self.norm(x)

    @property
    def logits_weight(self) -> torch.Tensor:  # (vocab, hidden)
        return self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (batch, hidden) -> (batch, vocab)
        return ops.lm_head(hidden, self.logits_weight)
