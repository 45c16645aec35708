"""The CPU's decode-only step as one compiled program (EngineConfig.cpu_compile).

An eager decode step of a small model on the CPU is mostly dispatch: ~290 torch calls per layer (the
int4 products' hi/lo splits, the norms' decompositions, RoPE, the K/V store and gather), each a few
microseconds of Python and ATen before any arithmetic. Here one function holds the whole step after the
embedding, every layer from the residual add and RMSNorm to the down projection and the final norm, and
torch.compile (inductor's C++ backend) turns it into one program: the pointwise work fused into generated
loops, the K/V store done in place in the cache, the quantized products left on torch's packed kernels
(`aten._weight_int4pack_mm_for_cpu`, `aten._weight_int8pack_mm`) and the attention on its CPU SDPA, as
extern calls. One guard check and one call per step instead of one per op. The step's tables (RoPE rows,
blocks, mask) are built once, eagerly; the batch size and the context's block count are dynamic, so a
program is compiled per shape class (batch 1, wider batches), on the first decode step of each.

It takes quantized models only (kernels.quant_linear): the products are the eager path's kernels on the
same inputs, and the norms' sums run in inductor's order, where the float32 path stays eager and exact
for the HF parity tests. Inductor keeps the generated code on disk, so a later start compiles faster.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F

from kernels import quant_linear

log = logging.getLogger("chatloom.engine")

BF16 = torch.bfloat16
GROUP = quant_linear.GROUP


class Proj(NamedTuple):
    """A quantized projection's tensors, as the compiled layer reads them."""

    data: torch.Tensor  # int8 (N, K) | int4 packed
    scales: torch.Tensor  # int8 (N,) bf16 | int4 (K / GROUP, N, 2) bf16
    lo_scales: torch.Tensor | None  # int4 on a Q4_1 grid: the scales' remainders
    bias: torch.Tensor | None  # (N,)


@dataclass(frozen=True)
class ProjKind:
    mode: str  # "int8" | "int4"
    split_x: bool  # int4: x in as bfloat16 hi and lo rows


@dataclass(frozen=True)
class LayerPlan:
    """What the compiled layer's code depends on beyond its tensors' shapes: equal for every layer of a
    model whose projections are quantized alike, so one compiled program serves them all."""

    kinds: tuple[ProjKind, ProjKind, ProjKind, ProjKind]  # qkv, o, gate_up, down
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps1: float
    eps2: float
    scale: float


def _project(x: torch.Tensor, p: Proj, kind: ProjKind) -> torch.Tensor:
    """quant_linear.product's value (x (M, K) float32 -> (M, N) float32) without the logits' refine."""
    xb = x.to(BF16)
    if kind.mode == "int8":
        y = torch.ops.aten._weight_int8pack_mm(xb, p.data, p.scales).to(x.dtype)
    else:
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu
        if kind.split_x:
            m = x.shape[0]
            xl = (x - xb.float()).to(BF16)
            both = mm(torch.cat([xb, xl]), p.data, GROUP, p.scales).float()  # (2M, N): hi rows, lo rows
            y = both[:m] + both[m:]
        else:
            y = mm(xb, p.data, GROUP, p.scales).float()
        if p.lo_scales is not None:
            y = y + mm(xb, p.data, GROUP, p.lo_scales).float()
        y = y.to(x.dtype)
    return y if p.bias is None else y + p.bias


def _layer(
    plan: LayerPlan,
    x: torch.Tensor,  # (B, H): the previous layer's MLP output (the embedding rows for the first)
    residual: torch.Tensor,  # (B, H): the stream before it (zeros for the first layer)
    norm1: torch.Tensor,  # (H,)
    qkv: Proj,
    o: Proj,
    norm2: torch.Tensor,
    gate_up: Proj,
    down: Proj,
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim), written at slots
    v_cache: torch.Tensor,
    cos: torch.Tensor,  # (B, 1, head_dim): [cos | cos] of each row's position
    sin: torch.Tensor,  # (B, 1, head_dim): [-sin | sin]
    slots: torch.Tensor,  # (B,) int64, all >= 0
    blocks: torch.Tensor,  # (B, n_blocks) int64: the cache blocks each row reads
    mask: torch.Tensor,  # (B, 1, 1, n_blocks * block_size) bool: the keys each row attends to
) -> tuple[torch.Tensor, torch.Tensor]:  # (this layer's MLP output, the stream before it), (B, H) each
    h, hk, d = plan.num_heads, plan.num_kv_heads, plan.head_dim
    b, hidden = x.shape
    residual = x + residual
    n = F.rms_norm(residual, (hidden,), norm1, plan.eps1)
    t = _project(n, qkv, plan.kinds[0])  # (B, (h + 2 hk) d)
    qk = t[:, : (h + hk) * d].reshape(b, h + hk, d)
    v = t[:, (h + hk) * d :].reshape(b, hk, d)
    qk = qk * cos + qk.roll(d // 2, dims=-1) * sin  # RoPE on q and k together
    nb, bs = k_cache.shape[0], k_cache.shape[1]
    k_cache.view(nb * bs, hk, d).index_copy_(0, slots, qk[:, h:])
    v_cache.view(nb * bs, hk, d).index_copy_(0, slots, v)
    width = blocks.shape[1] * bs
    flat = blocks.reshape(-1)
    keys = k_cache.view(nb, bs * hk * d).index_select(0, flat).view(b, width, hk, d).transpose(1, 2)
    values = v_cache.view(nb, bs * hk * d).index_select(0, flat).view(b, width, hk, d).transpose(1, 2)
    q = qk[:, :h].reshape(b, hk, h // hk, d)  # a KV head's query heads are its query rows
    a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=plan.scale).reshape(b, h * d)
    residual = residual + _project(a, o, plan.kinds[1])
    n = F.rms_norm(residual, (hidden,), norm2, plan.eps2)
    gu = _project(n, gate_up, plan.kinds[2])
    inter = gu.shape[1] // 2
    y = _project(F.silu(gu[:, :inter]) * gu[:, inter:], down, plan.kinds[3])
    return y, residual


class CpuDecodeStep:
    """The compiled decode-only step of one quantized Llama-family model on the CPU."""

    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = kv_caches[0][0].shape[1]
        self.layers = [self._weights(layer) for layer in model.layers]
        plans = tuple(self._plan(layer) for layer in model.layers)
        norm = model.norm
        final = (norm.weight.detach(), norm.eps)

        def step(x, layers, caches, cos, sin, slots, blocks, mask):
            residual = torch.zeros_like(x)
            for plan, w, (kc, vc) in zip(plans, layers, caches, strict=True):
                x, residual = _layer(plan, x, residual, *w, kc, vc, cos, sin, slots, blocks, mask)
            return F.rms_norm(x + residual, (x.shape[1],), final[0], final[1])

        self.eager = step
        self.compiled = torch.compile(step, fullgraph=True)
        self.compile_seconds = 0.0  # spent in the first step of each shape class
        self._seen: set[bool] = set()  # batch 1 (its own program: dynamic sizes start at 2)

    @staticmethod
    def supports(model) -> str | None:
        """Why this model's decode steps cannot run here, or None."""
        from models.llama import LlamaForCausalLM

        if type(model) is not LlamaForCausalLM or model.norms_folded:
            return "folded norms or another model class"
        for layer in model.layers:
            attn = layer.self_attn
            if attn.qk_norm or attn.sliding_window is not None:
                return "q/k norms or a sliding window"
            projs = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            if any(quant_linear.quantized(cast(torch.Tensor, p.weight)) is None for p in projs):
                return "a projection that is not quantized"
        return None

    @staticmethod
    def _proj(linear) -> Proj:
        qw = quant_linear.quantized(linear.weight)
        bias = linear.bias.detach() if linear.bias is not None else None
        return Proj(qw.data, qw.scales, qw.lo_scales, bias)

    def _weights(self, layer) -> tuple:
        attn, mlp = layer.self_attn, layer.mlp
        return (layer.input_layernorm.weight.detach(), self._proj(attn.qkv_proj), self._proj(attn.o_proj),
                layer.post_attention_layernorm.weight.detach(), self._proj(mlp.gate_up_proj),
                self._proj(mlp.down_proj))  # fmt: skip

    @staticmethod
    def _plan(layer) -> LayerPlan:
        attn, mlp = layer.self_attn, layer.mlp
        projs = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        qkv, o, gate_up, down = (
            ProjKind(qw.mode, qw.split_x) for qw in (quant_linear.quantized(p.weight) for p in projs)
        )
        heads = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        eps = (layer.input_layernorm.eps, layer.post_attention_layernorm.eps)
        return LayerPlan((qkv, o, gate_up, down), *heads, *eps, attn.scale)

    def tables(self, positions: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor) -> tuple:  # fmt: skip
        """The step's (cos, sin, slots, blocks, mask), shared by every layer (shapes: `_layer`)."""
        cs = self.model.cos_sin.index_select(0, positions)  # (B, head_dim)
        half = cs.shape[1] // 2
        c, s = cs[:, :half], cs[:, half:]
        cos = torch.cat((c, c), dim=-1)[:, None, :]
        sin = torch.cat((-s, s), dim=-1)[:, None, :]
        max_len = int(seq_lens.max())
        # at least two blocks (the second masked where unused): a width of one would compile apart
        n_blocks = max(2, -(-max_len // self.block_size))
        blocks = block_tables[:, :n_blocks].long()
        if blocks.shape[1] < n_blocks:  # block 0 stands in; the mask hides it
            blocks = F.pad(blocks, (0, n_blocks - blocks.shape[1]))
        pos = torch.arange(n_blocks * self.block_size)
        mask = (pos[None, :] < seq_lens[:, None])[:, None, None, :]
        return cos, sin, slots, blocks, mask

    def takes(self, meta) -> bool:
        """Whether a step with this metadata runs here: decode only, no padding slot."""
        return (
            meta.prefill_block_tables is None and meta.num_decodes > 0 and int(meta.slot_mapping.min()) >= 0
        )

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        """The final hidden states (B, H) of a decode-only step (`takes`)."""
        tables = self.tables(positions, meta.slot_mapping, meta.decode_block_tables, meta.decode_seq_lens)
        x = quant_linear.embedding(input_ids, self.model.embed_tokens.weight)  # (B, H)
        # batch and context width vary from step to step: one program for all (sizes 1 aside)
        for t in (x, *tables):
            torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(tables[3], 1)
        torch._dynamo.maybe_mark_dynamic(tables[4], 3)
        key = x.shape[0] == 1
        t0 = time.perf_counter() if key not in self._seen else None
        with warnings.catch_warnings():  # inductor's own use of deprecated torch.jit APIs while compiling
            warnings.simplefilter("ignore", DeprecationWarning)
            out = self.compiled(x, self.layers, self.kv_caches, *tables)
        if t0 is not None:
            self._seen.add(key)
            spent = time.perf_counter() - t0
            self.compile_seconds += spent
            log.info("CPU decode step compiled for %s in %.1fs", "batch 1" if key else "wider batches", spent)
        return out
