"""The next layer's batch-1 decode attention as a fifth stage of kernels.decode_tail_tma (Gluon), so a
layer's tail and the next layer's attention are one launch instead of two. Off in the engine
(decode_tail_tma.ATTENTION): correct, but slower on the H200 so far (below).

The tail's P programs split the attention as (KV head, split): P / num_kv_heads splits of each KV head's
context, every split a run of BLOCK_N-key tiles. The sequence length and the first tile's block-table
entries are read at the launch's start (attention_blocks). After the grid barrier that follows the next
qkv, each program asks for its first K/V tile, reads its KV head's new q (the GROUP query heads), k and v
from that qkv row and applies the q/k norm and RoPE; the new position's row of the tile is taken from
registers, and the split that owns it also stores the new K/V into the cache. Each warp folds its own
keys into an online softmax (no exchange between warps until the warps' softmaxes are combined once).
Each split leaves its normalized partial output and log-sum-exp; the last split of a KV head to arrive
(an arrival counter, as kernels.paged_attention's fused merge) merges them into the attention output.

Rounding is that of kernels.paged_attention's fused decode (norm to the dtype, times the weight to the
dtype, rotation in float32, scores and the softmax in float32, probabilities rounded to the dtype
before P @ V); only the split boundaries differ. Reference: reference.attend_next.

Measured on the H200 (`python -m kernels.bench --sweep-tail`, 768 keys; `python -m kernels.tail_timeline
--tma --attention`): the tail with this stage 30.5 us a layer against 28.3 for the tail and then the
fused decode attention launch; W3 1,059 tok/s against 1,213. The stage takes ~8.6 us after its barrier:
~1.9 to read and rotate the new token, ~5 to fold 64 keys and combine the warps (as long with the
weights and keys in L2, and with the first tile asked for before the barrier: not the keys' latency),
~1.8 to publish the partial, ~2.9 more for the last split's merge.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels._jit import arrival_counters, next_pow2
from kernels.reference import NextAttention

BLOCK_N = 64  # keys a tile
MAX_KV_HEADS = 64  # arrival counters
LOG2E = 1.4426950408889634

_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# the traced points of this stage (kernels.tail_timeline --tma --attention), after the tail's own
ATTENTION_POINTS = ("5 (attention) new token read", "5 keys folded", "5 partial arrived", "5 end")


@gluon.jit
def stamp(trace_ptr, pid, point: gl.constexpr, STRIDE: gl.constexpr, TRACE: gl.constexpr):
    """TRACE: once every warp of the program is here, the GPU's nanosecond clock goes to
    trace[pid, point] of a (programs, STRIDE) int64 table; otherwise nothing."""
    if TRACE:
        _cta_barrier()
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                      pack=1)  # fmt: skip
        gl.store(trace_ptr + pid * STRIDE + point, t)


@gluon.jit
def _split(ctx, split, S: gl.constexpr, BN: gl.constexpr):
    """Keys [lo, hi) of this split: each sequence's context cut into S runs of whole BN-key tiles."""
    per = gl.cdiv(gl.cdiv(ctx, S), BN) * BN
    lo = split * per
    return lo, gl.minimum(lo + per, ctx)


@gluon.jit
def _keys(start, W: gl.constexpr, NPW: gl.constexpr, KL: gl.constexpr):
    """Key positions start + [0, W * NPW) as (W, NPW) in KL: warp w holds keys w * NPW ... + NPW - 1."""
    w = gl.arange(0, W, layout=gl.SliceLayout(1, KL))
    j = gl.arange(0, NPW, layout=gl.SliceLayout(0, KL))
    return start + gl.expand_dims(w, 1) * NPW + gl.expand_dims(j, 0)


@gluon.jit
def attention_blocks(bt_ptr, seq_len_ptr, pid, S: gl.constexpr, BN: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                     W: gl.constexpr, NPW: gl.constexpr, L4: gl.constexpr):  # fmt: skip
    """(ctx, the block-table entries of this split's first tile as (W, NPW)): nothing the tail writes, so
    the caller asks for them at the launch's start and the stage's K/V loads need no round trip first."""
    KL: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(1, L4))
    ctx = gl.load(seq_len_ptr)
    lo, hi = _split(ctx, pid % S, S, BN)
    keys = _keys(lo, W, NPW, KL)
    return ctx, gl.load(bt_ptr + keys // BLOCK_SIZE, mask=keys < hi, other=0)


@gluon.jit
def _kv_tile(k_cache_ptr, v_cache_ptr, blk, keys, hi, kvh, HK: gl.constexpr, D: gl.constexpr,
             BLOCK_SIZE: gl.constexpr, L4: gl.constexpr):  # fmt: skip
    """K and V (W, NPW, D) of the keys (W, NPW) whose cache blocks are blk, KV head kvh (keys >= hi read
    as zeros)."""
    KT: gl.constexpr = gl.SliceLayout(1, L4)
    d = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(0, KT)))
    d3 = gl.expand_dims(gl.expand_dims(d, 0), 0)  # (1, 1, D)
    slot = blk.to(gl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE
    off = gl.expand_dims(slot * (HK * D) + kvh * D, 2) + d3
    mask = gl.expand_dims(keys < hi, 2) & (d3 < D)
    return gl.load(k_cache_ptr + off, mask=mask, other=0.0), gl.load(v_cache_ptr + off, mask=mask, other=0.0)


@gluon.jit
def first_tile(k_cache_ptr, v_cache_ptr, blk, ctx, pid, HK: gl.constexpr, D: gl.constexpr,
               BLOCK_SIZE: gl.constexpr, S: gl.constexpr, BN: gl.constexpr, L4: gl.constexpr):  # fmt: skip
    """K and V of this split's first tile (blk, ctx: attention_blocks); they do not depend on the new
    token, so the caller asks for them as early as it likes."""
    W: gl.constexpr = L4.warps_per_cta[0]
    lo, hi = _split(ctx, pid % S, S, BN)
    keys = _keys(lo, W, BN // W, gl.SliceLayout(2, gl.SliceLayout(1, L4)))
    return _kv_tile(k_cache_ptr, v_cache_ptr, blk, keys, hi, pid // S, HK, D, BLOCK_SIZE, L4)


@gluon.jit
def _fold(q4, k, v, keys, keys_s, hi, last, k_new, v_new, m_i, l_i, acc, scale_log2, L4: gl.constexpr):
    """One tile folded into each warp's own online softmax of the G query rows (base-2 scores, the scale
    folded in): m_i, l_i (W, G) and acc (W, G, D) per warp, no value crossing warps; the tile's row of
    position `last` is the new token's (k_new, v_new: (1, 1, D))."""
    dt: gl.constexpr = k.dtype
    AL: gl.constexpr = gl.SliceLayout(2, L4)  # (W, G, D)
    new_row = gl.expand_dims(keys == last, 2)  # (W, NPW, 1)
    k = gl.where(new_row, k_new, k)
    v = gl.where(new_row, v_new, v)
    s = gl.sum(q4 * gl.expand_dims(k, 1).to(gl.float32), axis=3) * scale_log2  # (W, G, NPW)
    s = gl.where(gl.expand_dims(keys_s < hi, 1), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=2))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s - gl.expand_dims(m_safe, 2))
    l_i = l_i * alpha + gl.sum(p, axis=2)
    pv = gl.sum(gl.expand_dims(p.to(dt).to(gl.float32), 3) * gl.expand_dims(v, 1).to(gl.float32), axis=2)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(2, AL)), 2) + pv
    return m_new, l_i, acc


@gluon.jit
def _new_qkv(qkv_ptr, cs_ptr, pos_ptr, qw_ptr, kw_ptr, kvh, eps, NH: gl.constexpr, HK: gl.constexpr,
             D: gl.constexpr, G: gl.constexpr, HAS_NORM: gl.constexpr, F1: gl.constexpr,
             F2: gl.constexpr):  # fmt: skip
    """The new token's q (G, D) in F2 (rows past the group are zeros), k and v (D,) in F1, of KV head
    kvh: normed and rotated as kernels.paged_attention's fused decode rounds them."""
    dt: gl.constexpr = qkv_ptr.dtype.element_ty
    GROUP: gl.constexpr = NH // HK
    half: gl.constexpr = D // 2
    pos = gl.load(pos_ptr).to(gl.int64)
    g2 = gl.arange(0, G, layout=gl.SliceLayout(1, F2))
    d2 = gl.arange(0, D, layout=gl.SliceLayout(0, F2))
    q_rows = gl.expand_dims((kvh * GROUP + g2) * D, 1)
    q_mask = gl.expand_dims(g2 < GROUP, 1) & gl.expand_dims(d2 < D, 0)
    p2 = (d2 + half) % D  # each lane's rotate-half partner
    qa = gl.load(qkv_ptr + q_rows + gl.expand_dims(d2, 0), mask=q_mask, other=0.0, cache_modifier=".cg")
    qb = gl.load(qkv_ptr + q_rows + gl.expand_dims(p2, 0), mask=q_mask, other=0.0, cache_modifier=".cg")
    qa, qb = qa.to(gl.float32), qb.to(gl.float32)
    d1 = gl.arange(0, D, layout=F1)
    p1 = (d1 + half) % D
    k_row = qkv_ptr + NH * D + kvh * D
    ka = gl.load(k_row + d1, cache_modifier=".cg").to(gl.float32)
    kb = gl.load(k_row + p1, cache_modifier=".cg").to(gl.float32)
    v = gl.load(qkv_ptr + (NH + HK) * D + kvh * D + d1, cache_modifier=".cg")
    if HAS_NORM:
        rq = gl.expand_dims(1.0 / gl.sqrt(gl.sum(qa * qa, axis=1) / D + eps), 1)
        wa = gl.expand_dims(gl.load(qw_ptr + d2).to(gl.float32), 0)
        wb = gl.expand_dims(gl.load(qw_ptr + p2).to(gl.float32), 0)
        qa = (wa * (qa * rq).to(dt).to(gl.float32)).to(dt).to(gl.float32)
        qb = (wb * (qb * rq).to(dt).to(gl.float32)).to(dt).to(gl.float32)
        rk = 1.0 / gl.sqrt(gl.sum(ka * ka, axis=0) / D + eps)
        ua = gl.load(kw_ptr + d1).to(gl.float32)
        ub = gl.load(kw_ptr + p1).to(gl.float32)
        ka = (ua * (ka * rk).to(dt).to(gl.float32)).to(dt).to(gl.float32)
        kb = (ub * (kb * rk).to(dt).to(gl.float32)).to(dt).to(gl.float32)
    cos2 = gl.expand_dims(gl.load(cs_ptr + pos * D + d2 % half), 0)
    sin2 = gl.expand_dims(gl.load(cs_ptr + pos * D + half + d2 % half), 0)
    q = (qa * cos2 + gl.expand_dims(gl.where(d2 < half, -1.0, 1.0), 0) * qb * sin2).to(dt)
    cos1 = gl.load(cs_ptr + pos * D + d1 % half)
    sin1 = gl.load(cs_ptr + pos * D + half + d1 % half)
    k = (ka * cos1 + gl.where(d1 < half, -1.0, 1.0) * kb * sin1).to(dt)
    return q, k, v


@gluon.jit
def _merge(part_ptr, lse_ptr, out_ptr, kvh, S: gl.constexpr, G: gl.constexpr, GROUP: gl.constexpr,
           D: gl.constexpr, MS: gl.constexpr):  # fmt: skip
    """KV head kvh's S partials (S, G, D) merged by their log-sum-exp into its GROUP heads' output; a
    thread holds all S of its values, so nothing crosses threads."""
    SG: gl.constexpr = gl.SliceLayout(2, MS)
    s = gl.arange(0, S, layout=gl.SliceLayout(1, SG))
    g = gl.arange(0, G, layout=gl.SliceLayout(0, SG))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(1, MS)))
    row = (kvh * S + gl.expand_dims(s, 1)) * G + gl.expand_dims(g, 0)  # (S, G)
    lse = gl.load(lse_ptr + row, cache_modifier=".cg")
    o = gl.load(part_ptr + gl.expand_dims(row * D, 2) + gl.expand_dims(gl.expand_dims(d, 0), 1),
                cache_modifier=".cg")  # fmt: skip
    m = gl.max(lse, axis=0)
    w = gl.exp2(lse - gl.expand_dims(gl.where(m == float("-inf"), 0.0, m), 0))  # 0 for empty splits
    den = gl.sum(w, axis=0)  # (G,)
    res = gl.sum(gl.expand_dims(w, 2) * o, axis=0)  # (G, D)
    OL: gl.constexpr = gl.SliceLayout(0, MS)
    den = gl.convert_layout(gl.where(den == 0.0, 1.0, den), gl.SliceLayout(1, OL))
    res = res / gl.expand_dims(den, 1)
    go = gl.arange(0, G, layout=gl.SliceLayout(1, OL))
    do = gl.arange(0, D, layout=gl.SliceLayout(0, OL))
    dst = out_ptr + gl.expand_dims((kvh * GROUP + go) * D, 1) + gl.expand_dims(do, 0)
    mask = gl.expand_dims(go < GROUP, 1) & gl.expand_dims(do < D, 0)
    gl.store(dst, res.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def attention_stage(qkv_ptr, out_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, slot_ptr, pos_ptr, cs_ptr, qw_ptr,
                    kw_ptr, part_ptr, lse_ptr, cnt_ptr, ctx, k, v, pid, scale_log2, eps, NH: gl.constexpr,
                    HK: gl.constexpr, D: gl.constexpr, G: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                    S: gl.constexpr, BN: gl.constexpr, HAS_NORM: gl.constexpr, L4: gl.constexpr,
                    F1: gl.constexpr, F2: gl.constexpr, MS: gl.constexpr, trace_ptr, POINT: gl.constexpr,
                    STRIDE: gl.constexpr, TRACE: gl.constexpr):  # fmt: skip
    """Program pid's split of the attention (see the module docstring); the qkv row is complete (the
    caller's grid barrier); ctx: attention_blocks; k, v: first_tile. The last split of each KV head
    writes that head's output. TRACE: stamps at ATTENTION_POINTS from trace[pid, POINT] on."""
    GROUP: gl.constexpr = NH // HK
    W: gl.constexpr = L4.warps_per_cta[0]
    NPW: gl.constexpr = BN // W
    KL: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(1, L4))  # (W, NPW) keys of the K/V tiles
    SK: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(3, L4))  # (W, NPW) keys of the scores
    AL: gl.constexpr = gl.SliceLayout(2, L4)  # (W, G, D)
    ML: gl.constexpr = gl.SliceLayout(2, gl.SliceLayout(3, L4))  # (W, G)
    kvh = pid // S
    lo, hi = _split(ctx, pid % S, S, BN)
    keys = _keys(lo, W, NPW, KL)
    q, k_new, v_new = _new_qkv(qkv_ptr, cs_ptr, pos_ptr, qw_ptr, kw_ptr, kvh, eps, NH, HK, D, G, HAS_NORM, F1,
                               F2)  # fmt: skip
    last = ctx - 1
    slot = gl.load(slot_ptr).to(gl.int64)
    if (slot >= 0) & (lo <= last) & (last < hi):  # this split holds the new position: store its K/V
        d1 = gl.arange(0, D, layout=F1)
        gl.store(k_cache_ptr + slot * (HK * D) + kvh * D + d1, k_new.to(k_cache_ptr.dtype.element_ty))
        gl.store(v_cache_ptr + slot * (HK * D) + kvh * D + d1, v_new.to(v_cache_ptr.dtype.element_ty))
    stamp(trace_ptr, pid, POINT, STRIDE, TRACE)
    QL: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, L4))  # (G, D), every warp holding all of q
    q4 = gl.expand_dims(gl.expand_dims(gl.convert_layout(q, QL), 0), 2).to(gl.float32)  # (1, G, 1, D)
    VL: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(1, L4)))  # (D,) of the tiles
    k_new = gl.expand_dims(gl.expand_dims(gl.convert_layout(k_new, VL), 0), 0)  # (1, 1, D)
    v_new = gl.expand_dims(gl.expand_dims(gl.convert_layout(v_new, VL), 0), 0)

    m_i = gl.full([W, G], float("-inf"), gl.float32, layout=ML)
    l_i = gl.zeros([W, G], gl.float32, layout=ML)
    acc = gl.zeros([W, G, D], gl.float32, layout=AL)
    keys_s = _keys(lo, W, NPW, SK)
    m_i, l_i, acc = _fold(q4, k, v, keys, keys_s, hi, last, k_new, v_new, m_i, l_i, acc, scale_log2, L4)
    for start in range(lo + BN, hi, BN):
        keys = _keys(start, W, NPW, KL)
        blk = gl.load(bt_ptr + keys // BLOCK_SIZE, mask=keys < hi, other=0)
        k, v = _kv_tile(k_cache_ptr, v_cache_ptr, blk, keys, hi, kvh, HK, D, BLOCK_SIZE, L4)
        keys_s = _keys(start, W, NPW, SK)
        m_i, l_i, acc = _fold(q4, k, v, keys, keys_s, hi, last, k_new, v_new, m_i, l_i, acc, scale_log2, L4)

    # the warps' softmaxes combined (the one exchange between warps), then this split's partial
    # (normalized) and log-sum-exp; an empty split leaves zeros and -inf
    m = gl.max(m_i, axis=0)  # (G,)
    wgt = gl.exp2(m_i - gl.expand_dims(gl.where(m == float("-inf"), 0.0, m), 0))  # (W, G)
    l_g = gl.sum(l_i * wgt, axis=0)
    acc = gl.sum(acc * gl.expand_dims(gl.convert_layout(wgt, gl.SliceLayout(2, AL)), 2), axis=0)  # (G, D)
    stamp(trace_ptr, pid, POINT + 1, STRIDE, TRACE)
    OG: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(0, AL))  # (G,) beside acc
    l_g = gl.convert_layout(l_g, OG)
    m = gl.convert_layout(m, OG)
    empty = l_g == 0.0
    l_safe = gl.where(empty, 1.0, l_g)
    o = acc / gl.expand_dims(l_safe, 1)
    lse = gl.where(empty, float("-inf"), m + gl.log2(l_safe))
    g = gl.arange(0, G, layout=OG)
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, gl.SliceLayout(0, AL)))
    row = (pid * G) + g  # pid = kvh * S + split
    gl.store(part_ptr + gl.expand_dims(row * D, 1) + gl.expand_dims(dq, 0), o)
    gl.store(lse_ptr + row, lse)
    _cta_barrier()
    arrived = gl.atomic_add(cnt_ptr + kvh, 1, sem="acq_rel", scope="gpu")
    stamp(trace_ptr, pid, POINT + 2, STRIDE, TRACE)
    if arrived == S - 1:  # the last split of this KV head merges them all
        _cta_barrier()
        gl.store(cnt_ptr + kvh, 0)  # zeroed for the next launch
        _merge(part_ptr, lse_ptr, out_ptr, kvh, S, G, GROUP, D, MS)
    stamp(trace_ptr, pid, POINT + 3, STRIDE, TRACE)


class AttnPlan(NamedTuple):
    splits: int  # of each KV head's context: programs / num_kv_heads
    group_rows: int  # G: the query heads of a KV head, padded to a power of two


def plan(n: NextAttention, programs: int, nq: int) -> AttnPlan | None:
    """How the tail's programs split this attention, or None where this stage cannot take it."""
    h, hk, d = n.num_heads, n.num_kv_heads, n.head_dim
    if hk < 1 or h % hk or programs % hk or (h + 2 * hk) * d != nq:
        return None
    if d != next_pow2(d) or not 32 <= d <= 256 or next_pow2(hk) != hk or hk > MAX_KV_HEADS or h // hk > 16:
        return None
    splits = programs // hk
    if splits > 32 or (n.q_norm is None) != (n.k_norm is None):
        return None
    return AttnPlan(splits, next_pow2(h // hk))


def fits(n: NextAttention, dtype: torch.dtype) -> bool:
    """The tensors this stage reads as it expects them (one sequence, contiguous, the model's dtype)."""
    caches_ok = all(
        c.dtype == dtype
        and c.is_contiguous()
        and c.dim() == 4
        and c.shape[2:] == (n.num_kv_heads, n.head_dim)
        for c in (n.k_cache, n.v_cache)
    )
    norms_ok = all(w is None or (w.dtype == dtype and w.shape == (n.head_dim,)) for w in (n.q_norm, n.k_norm))
    return (
        caches_ok
        and norms_ok
        and n.cos_sin.dtype == torch.float32
        and n.cos_sin.is_contiguous()
        and n.cos_sin.shape[1] == n.head_dim
        and n.block_tables.dtype == torch.int32
        and n.block_tables.shape[0] == 1
        and n.block_tables.stride(-1) == 1
        and n.seq_lens.shape == (1,)
        and n.positions.shape == (1,)
        and n.slot_mapping.shape == (1,)
    )


def layouts(p: AttnPlan, d: int, warps: int) -> dict:
    """The stage's register layouts: L4 (warps, G, BN / warps, D) with a warp's keys in its threads and
    D across its lanes (each warp folds its own keys); F1 (D,) and F2 (G, D) within a warp, so the
    norms' sums need no other warp; MS (splits, G, D) with a thread holding every split of its values."""
    lanes_d = min(32, d // 4)  # 4 or more elements a lane
    lanes_n = 32 // lanes_d
    per_warp = BLOCK_N // warps
    per_lane = max(1, d // 32)
    return dict(
        L4=gl.BlockedLayout(
            [1, p.group_rows, max(1, per_warp // lanes_n), d // lanes_d],
            [1, 1, lanes_n, lanes_d],
            [warps, 1, 1, 1],
            [3, 2, 1, 0],
        ),  # fmt: skip
        F1=gl.BlockedLayout([per_lane], [32], [warps], [0]),
        F2=gl.BlockedLayout([1, per_lane], [1, 32], [warps, 1], [1, 0]),
        MS=gl.BlockedLayout([p.splits, 1, 1], [1, 1, 32], [1, 1, warps], [2, 1, 0]),
    )


def launch_args(n: NextAttention, p: AttnPlan, like: torch.Tensor) -> tuple[tuple, dict, torch.Tensor]:
    """(pointer and scalar arguments, constexprs, the attention output (1, num_heads * head_dim))."""
    hk, d, g = n.num_kv_heads, n.head_dim, p.group_rows
    out = torch.empty((1, n.num_heads * d), dtype=like.dtype, device=like.device)
    part = torch.empty((hk * p.splits * g, d), dtype=torch.float32, device=like.device)
    lse = torch.empty((hk * p.splits * g,), dtype=torch.float32, device=like.device)
    norm_q = n.q_norm if n.q_norm is not None else like
    norm_k = n.k_norm if n.k_norm is not None else like
    args = (
        out, n.k_cache, n.v_cache, n.block_tables, n.seq_lens, n.slot_mapping, n.positions, n.cos_sin,
        norm_q, norm_k, part, lse, arrival_counters("decode_tail_attn", MAX_KV_HEADS, like.device),
        n.scale * LOG2E, n.eps,
    )  # fmt: skip
    consts = dict(
        NH=n.num_heads,
        HK=hk,
        HD=d,
        G=g,
        BLOCK_SIZE=n.k_cache.shape[1],
        S=p.splits,
        BN=BLOCK_N,
        HAS_NORM=n.q_norm is not None,
    )
    return args, consts, out
