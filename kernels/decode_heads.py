"""Wide decode attention with HPP KV heads a program (experiment beside kernels.paged_attention's launch).

A program takes one sequence and HPP neighbouring KV heads: its query rows are the GROUP * HPP query
heads of those KV heads, each row holding its q in its own KV head's HEAD_DIM columns of an HPP *
HEAD_DIM wide row and zeros in the others, so one dot against a tile of keys (BLOCK_N tokens, the HPP
heads' HPP * HEAD_DIM contiguous values a token) gives every row the scores of its own head, and the dot
with the values leaves each row's output in its own head's columns. A token's keys are read as one
contiguous run of HPP * 256 bytes instead of HPP runs, and the new token's work (row scale, q/k norm,
RoPE, K/V store) runs once per HPP heads. Unsplit (a wide batch), every key visible (no window, no ALiBi),
the new token fused (NewTokenQK), rows optionally dispatched by `order`.
"""

from __future__ import annotations

import torch
import triton.language as tl

from kernels._jit import kernel, next_pow2
from kernels.paged_attention import LOG2E, NewTokenQK, _dot_precision
from kernels.rmsnorm import row_rstd


@kernel
def _decode_heads_kernel(
    q_ptr,  # (batch, num_heads, head_dim) raw q, last dim contiguous
    k_cache_ptr,  # (num_blocks * block_size, num_kv_heads, head_dim)
    v_cache_ptr,
    out_ptr,  # (batch, num_heads, head_dim)
    block_tables_ptr,  # (batch, max_blocks) int32
    seq_lens_ptr,  # (batch,) int32, the new token included
    k_new_ptr,  # (batch, num_kv_heads, head_dim) raw k
    v_new_ptr,
    qw_ptr,  # HAS_NORM: (head_dim,)
    kw_ptr,
    pos_ptr,  # (batch,)
    cs_ptr,  # (max_positions, head_dim) float32 [cos | sin]
    slot_ptr,  # (batch,); < 0 = padding
    order_ptr,  # ORDERED: (batch,) int32
    h_ptr,  # ROW_SCALE: (batch, hidden)
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_bt,
    stride_kb,
    stride_vb,
    stride_hb,
    hidden,
    eps,
    eps_h,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HPP: tl.constexpr,
    BLOCK_G: tl.constexpr,  # >= GROUP * HPP and >= 16
    BLOCK_N: tl.constexpr,
    HAS_NORM: tl.constexpr,
    ORDERED: tl.constexpr,
    ROW_SCALE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    W: tl.constexpr = HPP * HEAD_DIM
    hp = tl.program_id(0)  # head group: KV heads hp * HPP ...
    b = tl.program_id(1)
    if ORDERED:
        b = tl.load(order_ptr + b)
    ctx = tl.load(seq_lens_ptr + b)
    dt = q_ptr.dtype.element_ty
    half = HEAD_DIM // 2

    # the query rows, block-diagonal: row g (query head hp * HPP * GROUP + g) in columns of KV head g // GROUP
    g = tl.arange(0, BLOCK_G)
    w = tl.arange(0, W)
    g_mask = g < GROUP * HPP
    sel = ((g // GROUP)[:, None] == (w // HEAD_DIM)[None, :]) & g_mask[:, None]  # (BLOCK_G, W)
    d = w % HEAD_DIM
    sign = tl.where(d < half, -1.0, 1.0)[None, :]
    heads = hp * HPP * GROUP + g
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    pos = tl.load(pos_ptr + b).to(tl.int64)
    cos = tl.load(cs_ptr + pos * HEAD_DIM + d % half)[None, :]
    sin = tl.load(cs_ptr + pos * HEAD_DIM + half + d % half)[None, :]
    qa = tl.load(q_rows + d[None, :], mask=sel, other=0.0).to(tl.float32)
    qb = tl.load(q_rows + ((d + half) % HEAD_DIM)[None, :], mask=sel, other=0.0).to(tl.float32)
    # the new token's k and v of the HPP heads: (HPP, HEAD_DIM)
    j = tl.arange(0, HPP)
    e = tl.arange(0, HEAD_DIM)
    kv_cols = (hp * HPP + j)[:, None] * HEAD_DIM + e[None, :]
    e_partner = (hp * HPP + j)[:, None] * HEAD_DIM + ((e + half) % HEAD_DIM)[None, :]
    k_row = k_new_ptr + b.to(tl.int64) * stride_kb
    ka = tl.load(k_row + kv_cols).to(tl.float32)
    kb = tl.load(k_row + e_partner).to(tl.float32)
    vn = tl.load(v_new_ptr + b.to(tl.int64) * stride_vb + kv_cols)
    rs = 1.0
    if ROW_SCALE:
        rs = row_rstd(h_ptr, b, stride_hb, hidden, eps_h, BLOCK_H)
        qa = (qa * rs).to(dt).to(tl.float32)
        qb = (qb * rs).to(dt).to(tl.float32)
        ka = (ka * rs).to(dt).to(tl.float32)
        kb = (kb * rs).to(dt).to(tl.float32)
        vn = (vn.to(tl.float32) * rs).to(dt)
    if HAS_NORM:
        rq = 1.0 / tl.sqrt(tl.sum(qa * qa, axis=1) / HEAD_DIM + eps)[:, None]
        wa = tl.load(qw_ptr + d).to(tl.float32)[None, :]
        wb = tl.load(qw_ptr + (d + half) % HEAD_DIM).to(tl.float32)[None, :]
        qa = (wa * (qa * rq).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        qb = (wb * (qb * rq).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        rk = 1.0 / tl.sqrt(tl.sum(ka * ka, axis=1) / HEAD_DIM + eps)[:, None]
        ua = tl.load(kw_ptr + e).to(tl.float32)[None, :]
        ub = tl.load(kw_ptr + (e + half) % HEAD_DIM).to(tl.float32)[None, :]
        ka = (ua * (ka * rk).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        kb = (ub * (kb * rk).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    q = tl.where(sel, qa * cos + sign * qb * sin, 0.0).to(dt)  # (BLOCK_G, W)
    kc = tl.load(cs_ptr + pos * HEAD_DIM + e % half)[None, :]
    ks = tl.load(cs_ptr + pos * HEAD_DIM + half + e % half)[None, :]
    k_sign = tl.where(e < half, -1.0, 1.0)[None, :]
    slot = tl.load(slot_ptr + b).to(tl.int64)
    ct = k_cache_ptr.dtype.element_ty
    if slot >= 0:
        dst = slot * (NUM_KV_HEADS * HEAD_DIM) + kv_cols
        tl.store(k_cache_ptr + dst, (ka * kc + k_sign * kb * ks).to(dt).to(ct))
        tl.store(v_cache_ptr + dst, vn.to(ct))
    tl.debug_barrier()  # the last tile reads the stored row back

    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, W), dtype=tl.float32)
    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    head_off = hp * HPP * HEAD_DIM
    for start in range(0, ctx, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < ctx
        blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slots = blk * BLOCK_SIZE + offs_n % BLOCK_SIZE
        kv_off = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + head_off + w[None, :]  # (BLOCK_N, W)
        k = tl.load(k_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale_log2  # (BLOCK_G, BLOCK_N)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_off, mask=n_mask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=sel)  # fmt: skip


CONFIGS = {"16bit": (64, 4, 3), "fp32": (16, 8, 2), "interpret": (16, 4, 1)}  # (BLOCK_N, warps, stages)


def decode_heads(
    q: torch.Tensor,  # (batch, num_heads, head_dim) raw q
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,  # (batch,) int32
    scale: float,
    new_token: NewTokenQK,
    hpp: int = 2,
    order: torch.Tensor | None = None,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """paged_decode_attention(..., new_token=new_token, order=order) for a wide batch, HPP KV heads a
    program (the module docstring)."""
    b, h, d = q.shape
    _, bs, hk, _ = k_cache.shape
    nt = new_token
    if hk % hpp or d & (d - 1) or hpp & (hpp - 1):
        raise ValueError("decode_heads: HPP divides the KV heads; HPP and head_dim powers of two")
    out = torch.empty_like(q)
    if b == 0:
        return out
    interp = q.device.type == "cpu"
    key = "interpret" if interp else ("fp32" if q.dtype == torch.float32 else "16bit")
    block_n, warps, stages = config or CONFIGS[key]
    group = h // hk
    hs = nt.row_scale
    has_norm = nt.q_norm_weight is not None
    _decode_heads_kernel[(hk // hpp, b)](
        q, k_cache, v_cache, out, block_tables, seq_lens, nt.k, nt.v,
        nt.q_norm_weight if has_norm else q, nt.k_norm_weight if has_norm else q, nt.positions, nt.cos_sin,
        nt.slot_mapping, order if order is not None else seq_lens, hs if hs is not None else q,
        scale * LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        nt.k.stride(0), nt.v.stride(0), hs.stride(0) if hs is not None else 0,
        hs.shape[1] if hs is not None else 0, nt.eps, nt.row_eps if hs is not None else 0.0,
        NUM_KV_HEADS=hk, GROUP=group, HEAD_DIM=d, BLOCK_SIZE=bs, HPP=hpp,
        BLOCK_G=max(16, next_pow2(group * hpp)), BLOCK_N=block_n, HAS_NORM=has_norm,
        ORDERED=order is not None, ROW_SCALE=hs is not None,
        BLOCK_H=next_pow2(hs.shape[1]) if hs is not None else 1, DOT_PREC=_dot_precision(q.dtype),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
