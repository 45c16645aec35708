"""A decode-only step's attention on the CPU with the per-step work done once per step, not per layer.

Every layer of a step reads the same positions, slots and block tables: the rotary cos / sin rows of the
new tokens, the cache blocks to gather and the attention mask are built by the first layer and reused by
the others (`StepTables`, keyed by the identity of the step's tensors, which prepare() makes anew each
step). Per layer there remain RoPE on q and k together (their rows in one tensor), the K/V store as two
index_copy_, the block gathers and one SDPA, about a third of reference.qk_norm_rope_store_kv +
reference.decode_attention's ops. The values are the reference's: the same products in the same order
(the rotation's sign is folded into the sin table, which negates a product exactly), and SDPA without a
mask where every row's context is the step's longest.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels import reference as ref


class StepTables(NamedTuple):
    key: tuple  # the step's tensors these were built from (compared by identity)
    cos: torch.Tensor  # (batch, 1, head_dim): [cos | cos] of each row's position
    sin: torch.Tensor  # (batch, 1, head_dim): [-sin | sin]
    blocks: torch.Tensor  # (batch * n_blocks,) int64: the cache blocks each row reads
    n_blocks: int
    max_len: int
    mask: torch.Tensor | None  # (batch, 1, 1, max_len) bool, None where every row reads max_len keys
    slots_valid: bool  # no padding slot (< 0): the K/V store needs no filter


_last: StepTables | None = None


def step_tables(
    positions: torch.Tensor,  # (batch,)
    cos_sin: torch.Tensor,  # (max_positions, head_dim) float32
    slot_mapping: torch.Tensor,  # (batch,)
    block_tables: torch.Tensor,  # (batch, max_blocks) int32
    seq_lens: torch.Tensor,  # (batch,) int32, incl. the new token
    block_size: int,
    sliding_window: int | None,
) -> StepTables:
    """The step's tables: built at its first layer, returned again to the others."""
    global _last
    key = (positions, cos_sin, slot_mapping, block_tables, seq_lens, block_size, sliding_window)
    last = _last
    if last is not None and all(a is b for a, b in zip(last.key, key, strict=True)):
        return last
    cs = cos_sin.index_select(0, positions.long())  # (batch, head_dim)
    half = cs.shape[1] // 2
    c, s = cs[:, :half], cs[:, half:]
    cos = torch.cat((c, c), dim=-1)[:, None, :]
    sin = torch.cat((-s, s), dim=-1)[:, None, :]
    lens = seq_lens.tolist()
    max_len = max(lens)
    n_blocks = -(-max_len // block_size)
    blocks = block_tables[:, :n_blocks].reshape(-1).long()
    mask = None
    windowed = sliding_window is not None and max_len > sliding_window
    if windowed or min(lens) != max_len:
        pos = torch.arange(max_len)
        valid = pos[None, :] < seq_lens[:, None]
        if sliding_window is not None:
            valid &= pos[None, :] >= (seq_lens[:, None] - sliding_window)
        mask = valid[:, None, None, :]
    slots_valid = bool(slot_mapping.numel() == 0 or int(slot_mapping.min()) >= 0)
    _last = StepTables(key, cos, sin, blocks, n_blocks, max_len, mask, slots_valid)
    return _last


def rope_store_decode_attention(
    q: torch.Tensor,  # (batch, num_heads, head_dim): raw q
    k: torch.Tensor,  # (batch, num_kv_heads, head_dim): raw k
    v: torch.Tensor,  # (batch, num_kv_heads, head_dim)
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # (batch, num_heads, head_dim)
    """reference.qk_norm_rope_store_kv (without q/k norms) + reference.decode_attention, same values."""
    nb, bs, hk, d = k_cache.shape
    b, h = q.shape[0], q.shape[1]
    t = step_tables(positions, cos_sin, slot_mapping, block_tables, seq_lens, bs, sliding_window)
    # (batch, num_heads + num_kv_heads, head_dim), rotated in float32 and rounded back, as the reference
    qk = torch.cat((q, k), dim=1).float()
    qk = (qk * t.cos + qk.roll(d // 2, dims=-1) * t.sin).to(q.dtype)
    q, k = qk[:, :h], qk[:, h:]
    if t.slots_valid:
        k_cache.view(nb * bs, hk, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(nb * bs, hk, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
    else:
        ref.store_kv(k, v, k_cache, v_cache, slot_mapping)
    width = t.n_blocks * bs
    keys = k_cache.view(nb, bs * hk * d).index_select(0, t.blocks).view(b, width, hk, d)
    values = v_cache.view(nb, bs * hk * d).index_select(0, t.blocks).view(b, width, hk, d)
    keys = keys[:, : t.max_len].transpose(1, 2).to(q.dtype)  # (batch, hk, max_len, d)
    values = values[:, : t.max_len].transpose(1, 2).to(q.dtype)
    out = F.scaled_dot_product_attention(
        q.reshape(b, hk, h // hk, d), keys, values, attn_mask=t.mask, scale=scale
    )
    return out.reshape(b, h, d)
