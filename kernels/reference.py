"""Torch references for every kernel. The engine runs these on the CPU; the Triton kernels
must match them (tests/kernels). Cache layout everywhere:
k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim); slot = block * block_size + offset.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def store_kv(
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int64; < 0 = padding, not written
) -> None:
    nb, bs, hk, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(nb * bs, hk, d).index_copy_(0, slots, k[keep].to(k_cache.dtype))
    v_cache.view(nb * bs, hk, d).index_copy_(0, slots, v[keep].to(v_cache.dtype))


def _bias(
    q_pos: torch.Tensor,  # (q_len,)
    k_pos: torch.Tensor,  # (k_len,)
    num_heads: int,
    sliding_window: int | None,
    alibi_slopes: torch.Tensor | None,  # (num_heads,)
) -> torch.Tensor:
    # (num_heads or 1, q_len, k_len) additive bias: causal (+ window) mask and ALiBi
    allowed = k_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - sliding_window
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=q_pos.device)
    bias.masked_fill_(~allowed, float("-inf"))
    bias = bias[None]
    if alibi_slopes is not None:
        dist = (k_pos[None, :] - q_pos[:, None]).to(torch.float32)  # <= 0 where allowed
        bias = bias + alibi_slopes.view(num_heads, 1, 1).float() * dist[None]
    return bias


def gather_blocks(
    cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    blocks: torch.Tensor,  # (...) int block ids
) -> torch.Tensor:  # (*blocks.shape, block_size, num_kv_heads, head_dim)
    """cache[blocks] as one index_select over whole blocks (on the CPU several times faster than
    advanced indexing, which copies element by element)."""
    nb, bs, hk, d = cache.shape
    rows = cache.reshape(nb, bs * hk * d).index_select(0, blocks.reshape(-1).long())
    return rows.view(*blocks.shape, bs, hk, d)


def gather_kv(
    cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_table: torch.Tensor,  # (max_blocks,) int32
    length: int,
) -> torch.Tensor:  # (length, num_kv_heads, head_dim)
    nb, bs, hk, d = cache.shape
    n_blocks = (length + bs - 1) // bs
    return gather_blocks(cache, block_table[:n_blocks]).reshape(n_blocks * bs, hk, d)[:length]


FLASH_MIN_SCORES = 1 << 20  # query x key positions from which paged_attention takes the flash kernel


def paged_attention(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim): new tokens of all sequences, concatenated
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    cu_seqlens_q: torch.Tensor,  # (batch + 1,) int32: query token offsets
    seq_lens: torch.Tensor,  # (batch,) int32: context length incl. the new tokens
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim)
    """Causal attention of each sequence's new tokens (the last q_len positions of its context)
    over its whole paged context: prefill, prefill after a cached prefix, chunked prefill, decode."""
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[2]
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for i, ctx in enumerate(lens):
        s, e = cu[i], cu[i + 1]
        if e == s:
            continue
        k = gather_kv(k_cache, block_tables[i], ctx).to(q.dtype).transpose(0, 1)  # (hk, ctx, d)
        v = gather_kv(v_cache, block_tables[i], ctx).to(q.dtype).transpose(0, 1)
        qi = q[s:e].transpose(0, 1)  # (h, q_len, d)
        # a large product in 4-D (1, h, len, d): torch's CPU SDPA takes its flash kernel only for 4-D
        # inputs; 3-D ones go to the math path, which holds the (h, q_len, ctx) scores in float32 (2 GB
        # at 5,000 tokens and 9 heads). Small ones stay 3-D: the math path's sums, which the HF parity
        # tests were recorded with (the flash kernel's differ in the last bits)
        if (e - s) * ctx >= FLASH_MIN_SCORES:
            qi, k, v = qi[None], k[None], v[None]
        if e - s == ctx and sliding_window is None and alibi_slopes is None:
            o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale, enable_gqa=group > 1)
        else:
            q_pos = torch.arange(ctx - (e - s), ctx, device=q.device)
            k_pos = torch.arange(ctx, device=q.device)
            bias = _bias(q_pos, k_pos, num_heads, sliding_window, alibi_slopes).to(q.dtype)
            bias = bias[None] if qi.dim() == 4 else bias
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=bias, scale=scale, enable_gqa=group > 1)
        out[s:e] = (o[0] if o.dim() == 4 else o).transpose(0, 1)
    return out


def decode_attention(
    q: torch.Tensor,  # (batch, num_heads, head_dim): one new token per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    seq_lens: torch.Tensor,  # (batch,) int32, incl. the new token
    scale: float,
    sliding_window: int | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:  # (batch, num_heads, head_dim)
    """One batched gather + one attention for all decoding sequences (no per-sequence loop): the
    query heads of a KV head are the 'query rows' of that head, so GQA needs no K/V repeat."""
    b, h, d = q.shape
    nb, bs, hk, _ = k_cache.shape
    group = h // hk
    max_len = int(seq_lens.max())
    n_blocks = (max_len + bs - 1) // bs
    idx = block_tables[:, :n_blocks]
    k = gather_blocks(k_cache, idx).view(b, n_blocks * bs, hk, d)[:, :max_len].transpose(1, 2).to(q.dtype)
    v = gather_blocks(v_cache, idx).view(b, n_blocks * bs, hk, d)[:, :max_len].transpose(1, 2).to(q.dtype)
    pos = torch.arange(max_len, device=q.device)
    valid = pos[None, :] < seq_lens[:, None]  # (b, L)
    if sliding_window is not None:
        valid &= pos[None, :] >= (seq_lens[:, None] - sliding_window)
    if alibi_slopes is None:
        mask = valid[:, None, None, :]
    else:
        dist = (pos[None, :] - (seq_lens[:, None] - 1)).float()  # (b, L), <= 0 inside the context
        mask = alibi_slopes.view(1, hk, group, 1).float() * dist[:, None, None, :]
        mask = mask.masked_fill(~valid[:, None, None, :], float("-inf")).to(q.dtype)
    out = F.scaled_dot_product_attention(q.view(b, hk, group, d), k, v, attn_mask=mask, scale=scale)
    return out.reshape(b, h, d)


def longest_first(seq_lens: torch.Tensor) -> torch.Tensor:  # (batch,) int32
    """The rows by descending length, ties in index order (kernels.order)."""
    return torch.argsort(-seq_lens.long(), stable=True).to(torch.int32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: (num_tokens, hidden); computed in float32 like HF
    xf = x.float()
    xf = xf * _rstd(xf, eps)
    return weight * xf.to(x.dtype)


def _rstd(xf: torch.Tensor, eps: float) -> torch.Tensor:  # (..., hidden) float32 -> (..., 1)
    return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def row_scaled(x: torch.Tensor, h: torch.Tensor, eps: float) -> torch.Tensor:
    """x (num_tokens, ...) times 1 / rms of each row of h (num_tokens, hidden), rounded to x's dtype: the
    output of a projection that read h un-normalized, its RMSNorm's weight folded into it, made
    rms_norm(h) @ W^T (up to rounding)."""
    rs = _rstd(h.float(), eps)  # (num_tokens, 1)
    return (x.float() * rs.view(-1, *([1] * (x.dim() - 1)))).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual' = x + residual; returns (rms_norm(residual'), residual')."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps), new_residual


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int64
    cos_sin: torch.Tensor,  # (max_positions, head_dim): [cos | sin] halves, float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style (rotate-half) rotary embedding over the full head dim, as HF Llama/Qwen."""
    cs = cos_sin[positions]  # (n, d)
    half = cs.shape[-1] // 2
    cos = torch.cat((cs[:, :half], cs[:, :half]), dim=-1)[:, None, :]
    sin = torch.cat((cs[:, half:], cs[:, half:]), dim=-1)[:, None, :]
    qf, kf = q.float(), k.float()
    q_out = qf * cos + rotate_half(qf) * sin
    k_out = kf * cos + rotate_half(kf) * sin
    return q_out.to(q.dtype), k_out.to(k.dtype)


def rope_cos_sin(inv_freq: torch.Tensor, max_positions: int, attention_scaling: float = 1.0) -> torch.Tensor:
    # inv_freq: (head_dim / 2,) -> (max_positions, head_dim): [cos | sin]
    t = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat((freqs.cos() * attention_scaling, freqs.sin() * attention_scaling), dim=-1)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # x: (num_tokens, 2 * intermediate) -> (num_tokens, intermediate)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits (batch, vocab) float, bitmask (batch, ceil(vocab / 32)) int32, bit j of word w allows
    token 32 * w + j; disallowed logits become -inf in place. Rows are matched by index."""
    b, vocab = logits.shape
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().reshape(b, -1)[:, :vocab]
    logits.masked_fill_(~allowed, float("-inf"))


def qk_norm_rope_store_kv(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    v: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    q_norm_weight: torch.Tensor | None,  # (head_dim,): Qwen3's per-head RMSNorm; None for Llama/Qwen2
    k_norm_weight: torch.Tensor | None,  # (head_dim,)
    eps: float,
    positions: torch.Tensor,  # (num_tokens,) int64
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,); < 0 = padding, not written
) -> tuple[torch.Tensor, torch.Tensor]:
    """Everything between the qkv projection and attention: optional per-head q/k RMSNorm, RoPE, and
    the new K/V written into the cache. Returns the rotated (q, k)."""
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight go together")
    if q_norm_weight is not None:
        q = rms_norm(q.reshape(-1, q.shape[-1]), q_norm_weight, eps).view(q.shape)
        k = rms_norm(k.reshape(-1, k.shape[-1]), k_norm_weight, eps).view(k.shape)
    q, k = apply_rope(q, k, positions, cos_sin)
    store_kv(k, v, k_cache, v_cache, slot_mapping)
    return q, k


def qkv_new_token(
    x: torch.Tensor,  # (M, K): the residual stream, un-normalized
    weight: torch.Tensor,  # ((num_heads + 2 * num_kv_heads) * head_dim, K): the input norm folded in
    num_heads: int,
    num_kv_heads: int,
    q_norm_weight: torch.Tensor | None,  # (head_dim,) or None
    k_norm_weight: torch.Tensor | None,
    eps: float,  # the q/k norms'
    row_eps: float,  # the folded input norm's
    positions: torch.Tensor,  # (M,) int
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (M,); < 0 = padding, not written
) -> torch.Tensor:  # (M, num_heads, head_dim)
    """A decode step's qkv projection of the un-normalized residual stream, row-scaled (row_scaled), then
    qk_norm_rope_store_kv: the new k and v into the cache, q (normed, rotated) returned."""
    m, d = x.shape[0], cos_sin.shape[1]
    qkv = row_scaled(linear(x, weight), x, row_eps).view(m, num_heads + 2 * num_kv_heads, d)
    q, k, v = qkv.split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    q, _ = qk_norm_rope_store_kv(q, k, v, q_norm_weight, k_norm_weight, eps, positions, cos_sin, k_cache,
                                 v_cache, slot_mapping)  # fmt: skip
    return q


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # x (M, K), weight (N, K), bias (N,) -> (M, N)
    return F.linear(x, weight, bias)


def add_rms_norm_linear(
    x: torch.Tensor,  # (M, K)
    residual: torch.Tensor | None,  # (M, K); None: normalize x alone
    norm_weight: torch.Tensor,  # (K,)
    eps: float,
    weight: torch.Tensor,  # (N, K)
    bias: torch.Tensor | None = None,  # (N,)
) -> tuple[torch.Tensor, torch.Tensor]:  # y (M, N), new residual (M, K)
    """A decoder layer's (residual add +) RMSNorm feeding a projection: (linear(h), new residual) with
    (h, new residual) = fused_add_rms_norm(x, residual), or (rms_norm(x), x) when residual is None."""
    if residual is None:
        h, new_residual = rms_norm(x, norm_weight, eps), x
    else:
        h, new_residual = fused_add_rms_norm(x, residual, norm_weight, eps)
    return linear(h, weight, bias), new_residual


class TailWeights(NamedTuple):
    """One decoder layer's tail: its o projection, post-attention norm and MLP, and (None for the last
    layer) the next layer's input norm and qkv projection."""

    o: torch.Tensor  # (H, A)
    o_bias: torch.Tensor | None
    norm2: torch.Tensor  # (H,)
    eps2: float
    gate_up: torch.Tensor  # (2I, H)
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # (H, I)
    down_bias: torch.Tensor | None
    norm1_next: torch.Tensor | None  # (H,)
    eps1_next: float
    qkv_next: torch.Tensor | None  # (NQ, H)
    qkv_next_bias: torch.Tensor | None


def decode_layer_tail(
    a: torch.Tensor,  # (M, A): the attention output
    residual: torch.Tensor,  # (M, H)
    w: TailWeights,
) -> tuple[torch.Tensor, torch.Tensor]:  # (next qkv (M, NQ) or the MLP output (M, H), new residual)
    """Everything after a layer's attention up to the next layer's attention: o projection, residual add +
    RMSNorm + gate_up, SiLU-and-mul + down, and (if w.qkv_next) the next residual add + RMSNorm + qkv."""
    o = linear(a, w.o, w.o_bias)
    gate_up, residual = add_rms_norm_linear(o, residual, w.norm2, w.eps2, w.gate_up, w.gate_up_bias)
    y = linear(silu_and_mul(gate_up), w.down, w.down_bias)
    if w.qkv_next is None:
        return y, residual
    return add_rms_norm_linear(y, residual, w.norm1_next, w.eps1_next, w.qkv_next, w.qkv_next_bias)


def decode_step_inputs(
    head: torch.Tensor,  # (5n + 4,) int64: [ids | positions | slots | k, rows, width, 0 | at (k) | src (k)]
    packed: torch.Tensor,  # (n + rows * width,) int32: [lengths | the rows' block tables]
    table: torch.Tensor,  # (n, max_blocks) int32
    tokens: torch.Tensor,  # (n,) int64: the previous step's sampled ids
    size: int,  # the captured batch (rows <= size)
) -> None:
    """A decode graph's inputs finished on the device: the in-flight tokens written into the ids, the
    block-table rows copied into the graph's table."""
    n = table.shape[0]
    k, rows, width = (int(v) for v in head[3 * n : 3 * n + 3])
    pairs = head[3 * n + 4 : 3 * n + 4 + 2 * k].clone()
    head[pairs[:k]] = tokens[pairs[k:]]
    table[:rows, :width] = packed[n : n + rows * width].view(rows, width)


def mapped_step_inputs(
    host64: torch.Tensor,  # (slots, 4n + 4) int64: [ids | positions | slots | src | rows, width, 0, 0]
    host32: torch.Tensor,  # (slots, n + n * max_blocks) int32: [lengths | the tables, (n, max_blocks)]
    counter: torch.Tensor,  # (1,) int64: the ring row is counter % slots
    head: torch.Tensor,  # (>= 3n,) int64: [ids | positions | slots]
    lens: torch.Tensor,  # (n,) int32
    table: torch.Tensor,  # (n, max_blocks) int32
    tokens: torch.Tensor,  # (n,) int64: the previous step's sampled ids
    size: int,
) -> None:
    """Rows 0..size-1 of a step written by the host into a ring row, moved into the graph's inputs;
    ids marked in flight (src >= 0) taken from tokens."""
    n = table.shape[0]
    h64, h32 = host64[int(counter[0]) % host64.shape[0]], host32[int(counter[0]) % host32.shape[0]]
    src = h64[3 * n : 3 * n + size]
    ids = h64[:size].clone()
    flight = src >= 0
    ids[flight] = tokens[src[flight]]
    head[:size] = ids
    head[n : n + size], head[2 * n : 2 * n + size] = h64[n : n + size], h64[2 * n : 2 * n + size]
    lens[:size] = h32[:size]
    rows, width = int(h64[4 * n]), int(h64[4 * n + 1])
    table[:rows, :width] = h32[n:].view(n, -1)[:rows, :width]


def publish_tokens(
    tokens: torch.Tensor,  # (size,) int64
    ring: torch.Tensor,  # (slots, n) int64 host buffer
    counter: torch.Tensor,  # (1,) int64: launches so far
) -> None:
    """tokens into row counter % slots of the ring; the counter advances."""
    c = int(counter[0])
    ring[c % ring.shape[0], : tokens.shape[0]] = tokens.to(ring.device)
    counter += 1


def sample_tokens(
    logits: torch.Tensor,  # (batch, vocab)
    temperatures: torch.Tensor,  # (batch,) float32; 0 = greedy
    generator: torch.Generator | None = None,
) -> torch.Tensor:  # (batch,) int64
    """softmax(logits / T), then the exponential race argmax(p / E), E ~ Exp(1); T == 0 rows: argmax."""
    greedy = temperatures <= 0
    t = torch.where(greedy, torch.ones_like(temperatures), temperatures)
    probs = torch.softmax(logits.float() / t[:, None], dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return torch.where(greedy, logits.argmax(dim=-1), (probs / noise).argmax(dim=-1))
