"""The Llama family in one plain, single-device model: Llama (incl. Llama 3 rope scaling), Mistral
(sliding window), Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm); GQA; tied or untied embeddings.
Projections are fused at load time: qkv_proj = [q; k; v], gate_up_proj = [gate; up]."""

from __future__ import annotations

import torch
from torch import nn

from kernels import dispatch as ops
from kernels import reference as ref
from models.attention import AttentionMetadata, attention_block, projected_decode_attention


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """(head_dim / 2,) inverse frequencies and the attention scaling, from transformers' own rope
    initialisers so every rope_type (default, linear, llama3, yarn, ...) matches HF."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return inv, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    if rope_type == "dynamic":
        raise ValueError("dynamic NTK rope scaling depends on the sequence length and is not supported")
    inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv, float(scaling)


class Attention(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        o_bias = bool(getattr(config, "attention_bias", False)) and config.model_type != "qwen2"
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=o_bias)
        self.qk_norm = config.model_type == "qwen3"
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.sliding_window = _layer_sliding_window(config, layer_idx)

    def attend_residual(
        self,
        residual: torch.Tensor,  # (num_tokens, hidden); the input norm is folded into qkv_proj
        row_eps: float,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (num_tokens, q_size)
        """attend of qkv_proj(rms_norm(residual)) for a decode-only step where ops.qkv_epilogue_fits."""
        return projected_decode_attention(
            residual, self.qkv_proj.weight, self.num_heads, self.num_kv_heads,
            self.q_norm.weight if self.qk_norm else None, self.k_norm.weight if self.qk_norm else None,
            self.q_norm.eps if self.qk_norm else 0.0, row_eps, positions, cos_sin, kv_cache, meta, self.scale,
            self.sliding_window,
        )  # fmt: skip

    def attend(
        self,
        qkv: torch.Tensor,  # (num_tokens, q_size + 2 * kv_size)
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        row_scale: tuple[torch.Tensor, float] | None = None,  # see attention_block
    ) -> torch.Tensor:  # (num_tokens, q_size): the attention output, before o_proj
        return attention_block(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim,
            self.q_norm.weight if self.qk_norm else None, self.k_norm.weight if self.qk_norm else None,
            self.q_norm.eps if self.qk_norm else 0.0, positions, cos_sin, kv_cache, meta, self.scale,
            self.sliding_window, row_scale,
        )  # fmt: skip


def _layer_sliding_window(config, layer_idx: int) -> int | None:
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    if config.model_type == "qwen2":
        if not getattr(config, "use_sliding_window", False):
            return None
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
            return None
    if config.model_type == "qwen3":
        layer_types = getattr(config, "layer_types", None)
        if layer_types is None or layer_types[layer_idx] != "sliding_attention":
            return None
    return int(window)


class MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} (only silu)")
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def qkv(self, input_ids: torch.Tensor, embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first layer's input: (qkv of rms_norm(embedding[input_ids]), those embedding rows, the
        residual stream); later layers get theirs from the previous layer's tail."""
        norm1, attn = self.input_layernorm, self.self_attn
        return ops.embed_rms_norm_linear(input_ids, embedding, norm1.weight, norm1.eps, attn.qkv_proj.weight,
                                         attn.qkv_proj.bias)  # fmt: skip

    def tail_weights(self, next_layer: DecoderLayer | None) -> ref.TailWeights:
        attn, mlp, norm2 = self.self_attn, self.mlp, self.post_attention_layernorm
        norm1 = next_layer.input_layernorm if next_layer is not None else None
        qkv = next_layer.self_attn.qkv_proj if next_layer is not None else None
        return ref.TailWeights(
            attn.o_proj.weight, attn.o_proj.bias, norm2.weight, norm2.eps, mlp.gate_up_proj.weight,
            mlp.gate_up_proj.bias, mlp.down_proj.weight, mlp.down_proj.bias,
            norm1.weight if norm1 is not None else None, norm1.eps if norm1 is not None else 0.0,
            qkv.weight if qkv is not None else None, qkv.bias if qkv is not None else None,
        )  # fmt: skip

    def forward(
        self, qkv, residual, positions, cos_sin, kv_cache, meta, tail: ref.TailWeights,
        raw_in: bool = False, fold: bool = False, qkv_out: bool = True,
    ):  # fmt: skip
        """qkv: (num_tokens, q_size + 2 * kv_size), this layer's projected input; residual: the stream so
        far; tail: tail_weights(the next layer). Returns (the next layer's qkv, residual), or (the MLP
        output, residual) for the last layer. Each (residual add +) RMSNorm runs inside the projection
        that reads it, and at decode batch 1 the whole tail from o_proj to the next layer's qkv is one
        launch (ops.decode_layer_tail). raw_in: qkv is of the residual without its RMSNorm (the weights
        folded, LlamaForCausalLM.fold_norms); fold: this tail returns such a qkv
        (ops.folded_decode_layer_tail). qkv None: this layer projects the residual itself, with the new
        token's work in the projection (Attention.attend_residual); qkv_out False: a folded tail leaves
        the next layer's qkv to it."""
        if qkv is None:
            eps = self.input_layernorm.eps
            a = self.self_attn.attend_residual(residual, eps, positions, cos_sin, kv_cache, meta)
        else:
            row_scale = (residual, self.input_layernorm.eps) if raw_in else None
            a = self.self_attn.attend(qkv, positions, cos_sin, kv_cache, meta, row_scale)  # (tokens, q_size)
        if fold:
            return ops.folded_decode_layer_tail(a, residual, tail, qkv=qkv_out)
        return ops.decode_layer_tail(a, residual, tail)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        inv_freq, scaling = rope_inv_freq(config)
        self.register_buffer("cos_sin", _cos_sin(inv_freq, max_positions, scaling), persistent=False)
        self._tail_weights: list[ref.TailWeights] | None = None
        self.norms_folded = False

    def forward(
        self,
        input_ids: torch.Tensor,  # (num_tokens,)
        positions: torch.Tensor,  # (num_tokens,)
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        final_norm: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # (num_tokens, hidden)
        """The final hidden states; without final_norm (x, residual) before the last norm, for a
        consumer that applies it itself (kernels.lm_head_sample)."""
        x, residual = self.layers[0].qkv(input_ids, self.embed_tokens.weight)
        # decode-only steps of a folded model: tails without norm launches (ops.folded_tail_fits)
        fold = self.norms_folded and meta.prefill_block_tables is None
        raw = False  # the previous tail was folded: this layer's qkv is of the un-normalized residual
        # after a folded tail the next layer may project the residual itself, the new token's work in that
        # projection (ops.qkv_epilogue_fits: the same answer for every layer of the step)
        attn = self.layers[-1].self_attn
        epilogue = fold and ops.qkv_epilogue_fits(residual, attn.qkv_proj.weight, attn.head_dim)
        for layer, kv, tail in zip(self.layers, kv_caches, self._tails(), strict=True):
            f = fold and ops.folded_tail_fits(residual.shape[0], tail)
            x, residual = layer(x, residual, positions, self.cos_sin, kv, meta, tail, raw_in=raw, fold=f,
                                qkv_out=not (f and epilogue))  # fmt: skip
            raw = f
        if not final_norm:
            return x, residual
        x, _ = self.norm.forward_add(x, residual)
        return x

    @torch.no_grad()
    def fold_norms(self) -> None:
        """Multiplies each layer's input and post-attention RMSNorm weights into the projection after them
        (qkv_proj's and gate_up_proj's input columns) and sets those norm weights to ones: the same model
        up to one rounding of each product, whose wide decode steps then skip the norm launches
        (ops.folded_decode_layer_tail). Call once, after the weights are loaded."""
        if self.norms_folded:
            raise RuntimeError("the norms are already folded")
        for layer in self.layers:
            pairs = ((layer.input_layernorm, layer.self_attn.qkv_proj),
                     (layer.post_attention_layernorm, layer.mlp.gate_up_proj))  # fmt: skip
            for norm, proj in pairs:
                if proj.weight.is_mkldnn:  # kernels.onednn.pack_model's CPU form has no column scaling
                    raise RuntimeError("fold_norms needs dense weights, not oneDNN-packed ones")
                proj.weight.copy_(proj.weight.float() * norm.weight.float()[None, :])
                norm.weight.fill_(1.0)
        self.norms_folded = True

    def _tails(self) -> list[ref.TailWeights]:
        """Each layer's tail weights (with the next layer's norm and qkv), built at the first forward. They
        hold the parameters themselves, which weight loading fills in place, so they stay current."""
        if self._tail_weights is None:
            layers = list(self.layers)
            nexts = layers[1:] + [None]
            self._tail_weights = [layer.tail_weights(nxt) for layer, nxt in zip(layers, nexts, strict=True)]
        return self._tail_weights

    @property
    def max_positions(self) -> int:  # max_model_len: the rope table's rows
        return self.cos_sin.shape[0]

    @property
    def logits_weight(self) -> torch.Tensor:  # (vocab, hidden)
        return self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (batch, hidden) -> (batch, vocab)
        """In the model's dtype, as HF computes them before its float(): the fused sampler reads 16-bit
        logits as they are, and runner.sampler converts where it edits or normalizes them."""
        return ops.lm_head(hidden, self.logits_weight)


def _cos_sin(inv_freq: torch.Tensor, max_positions: int, scaling: float) -> torch.Tensor:
    t = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())  # (max_positions, head_dim / 2)
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
