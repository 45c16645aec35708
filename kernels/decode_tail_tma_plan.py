"""How kernels.decode_tail_tma splits a layer's weights among its programs (TmaPlan: row slices, TMA
boxes, shared memory), its register and shared layouts, the weights' TMA descriptors, and one launch's
arguments. Host code only: the kernel and its launch are kernels.decode_tail_tma's.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from triton.experimental.gluon import language as gl

from kernels import pdl
from kernels._jit import arrival_counters, next_pow2
from kernels.reference import TailWeights

CHUNK = 256  # elements in the inner box dimension (TMA's largest)
SHARED_LIMIT = 227 << 10  # dynamic shared memory a program may hold on sm_90
NUM_WARPS = 16


class TmaPlan(NamedTuple):
    programs: int
    r1: int  # o rows per program
    gu: tuple[int, int]  # (row boxes, rows a box)
    down: tuple[int, int, int]  # (rows, K boxes, chunks a box)
    qkv: tuple[int, int]  # (row boxes, rows a box)
    shared: int  # bytes of shared memory for the copies
    alias: bool = False  # the next qkv's boxes in gate_up's buffers


def _row_boxes(rows: int) -> tuple[int, int] | None:
    """rows as boxes of one power-of-two height <= 32 (at most 4 boxes)."""
    for br in (32, 16, 8, 4, 2, 1):
        if rows % br == 0 and rows // br <= 4:
            return rows // br, br
    return None


@functools.cache
def plan(
    h: int, a: int, inter: int, nq: int | None, sms: int, elt: int = 2, alias: bool = False
) -> TmaPlan | None:
    """How P programs split the weights, or None where the shapes do not divide into boxes. alias: the next
    qkv's boxes take gate_up's height and buffers where they fit in them."""
    programs = 1 << (sms.bit_length() - 1)  # a power of two <= the SMs
    if any(n % CHUNK for n in (h, a, inter)) or h % programs or (2 * inter) % programs:
        return None
    if nq is not None and nq % programs:
        return None
    r1 = h // programs
    if next_pow2(r1) != r1 or next_pow2(a // CHUNK) != a // CHUNK or next_pow2(h // CHUNK) != h // CHUNK:
        return None
    gu = _row_boxes(2 * inter // programs)
    qkv = _row_boxes(nq // programs) if nq is not None else (0, 1)
    d_rows = h // programs
    chunks = inter // CHUNK
    d_c = next(c for c in (8, 4, 2, 1) if chunks % c == 0)  # chunks a K box (a power of two)
    if gu is None or qkv is None or chunks // d_c > 4:
        return None
    q_rows = nq // programs if nq is not None else 0
    alias = alias and nq is not None and q_rows % gu[1] == 0 and q_rows // gu[1] <= gu[0]
    if alias:
        qkv = (q_rows // gu[1], gu[1])
    shared = elt * (2 * inter // programs * h + d_rows * inter + (0 if alias else q_rows * h))
    if shared + 4096 > SHARED_LIMIT:
        return None
    return TmaPlan(programs, r1, gu, (d_rows, chunks // d_c, d_c), qkv, shared, alias)


def _tile_layout(rows: int, chunks: int) -> gl.BlockedLayout:
    """(rows, chunks, 256) tiles: 8 contiguous elements a thread, a warp along a row, warps over rows
    first, then over chunks."""
    wr = min(rows, NUM_WARPS)
    wc = min(chunks, NUM_WARPS // wr)
    return gl.BlockedLayout([1, 1, 8], [1, 1, 32], [NUM_WARPS // wc, wc, 1], [2, 1, 0])


def _flat(chunks: int) -> gl.BlockedLayout:
    """(chunks, 256) over the program's threads once (no warp holds what another does), chunks <= 16."""
    warps_c = min(chunks, NUM_WARPS)
    per_thread = max(1, chunks * CHUNK // (32 * NUM_WARPS))
    return gl.BlockedLayout([1, per_thread], [1, 32], [warps_c, NUM_WARPS // warps_c], [1, 0])


def _shared_layout() -> gl.NVMMASharedLayout:
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


def _descriptor(w: torch.Tensor, box_rows: int, box_chunks: int):
    """(box_rows, box_chunks, 256) boxes of the (N, K / 256, 256) view, unswizzled."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    n, k = w.shape
    return TensorDescriptor(w, [n, k // CHUNK, CHUNK], [k, CHUNK, 1], [box_rows, box_chunks, CHUNK],
                            _shared_layout())  # fmt: skip


_DESCRIPTORS: dict[tuple, tuple[torch.Tensor, object]] = {}


def _cached_descriptor(w: torch.Tensor, box_rows: int, box_chunks: int):
    """One descriptor per weight and box (the weights live as long as the model: built once, not per
    step, since encoding one costs host time)."""
    key = (w.data_ptr(), tuple(w.shape), w.dtype, w.device, box_rows, box_chunks)
    hit = _DESCRIPTORS.get(key)
    if hit is None or hit[0] is not w:
        hit = (w, _descriptor(w, box_rows, box_chunks))
        _DESCRIPTORS[key] = hit
    return hit[1]


def fits(m: int, dtype: torch.dtype, w: TailWeights, device: torch.device) -> bool:
    """Whether decode_layer_tail can take this batch and these weights on this device."""
    if m != 1 or dtype not in (torch.bfloat16, torch.float16) or device.type != "cuda":
        return False
    if any(b is not None for b in (w.o_bias, w.gate_up_bias, w.down_bias, w.qkv_next_bias)):
        return False
    tensors = [w.o, w.norm2, w.gate_up, w.down, w.norm1_next, w.qkv_next]
    if not all(t is None or (t.dtype == dtype and t.is_contiguous()) for t in tensors):
        return False
    return _plan_for(w, device) is not None


@functools.cache
def _sms(index: int | None) -> int:
    """The SMs of a Hopper-or-later device, 0 for an older one."""
    if torch.cuda.get_device_capability(index)[0] < 9:
        return 0
    return torch.cuda.get_device_properties(index).multi_processor_count


def _plan_for(w: TailWeights, device: torch.device) -> TmaPlan | None:
    sms = _sms(device.index) if device.type == "cuda" else 132  # no GPU: the H200's, to compile
    nq = w.qkv_next.shape[0] if w.qkv_next is not None else None
    return plan(w.o.shape[0], w.o.shape[1], w.down.shape[1], nq, sms, alias=True) if sms else None


def launch_args(a: torch.Tensor, residual: torch.Tensor, w: TailWeights, p: TmaPlan,
                trace: torch.Tensor | None = None):  # fmt: skip
    """(grid, args, kwargs, result) of one launch (kept apart so tests compile it without a GPU)."""
    h_size, a_width, inter = w.o.shape[0], w.o.shape[1], w.down.shape[1]
    has_next = w.qkv_next is not None
    new = lambda *shape: torch.empty(shape, dtype=a.dtype, device=a.device)
    o, h, gu, y = new(1, h_size), new(1, h_size), new(1, 2 * inter), new(1, h_size)
    h2, qkv = (new(1, h_size), new(1, w.qkv_next.shape[0])) if has_next else (y, y)
    (gu_nrb, gu_br), (d_rows, d_nkb, d_c), (q_nrb, q_br) = p.gu, p.down, p.qkv
    chunks = h_size // CHUNK
    describe = _cached_descriptor if a.device.type == "cuda" else _descriptor
    gu_desc = describe(w.gate_up, gu_br, chunks)
    d_desc = describe(w.down, d_rows, d_c)
    q_desc = describe(w.qkv_next, q_br, chunks) if has_next else gu_desc
    args = (
        a, residual, w.o, w.norm2, w.norm1_next if has_next else w.norm2, gu_desc, d_desc, q_desc,
        o, h, gu, y, h2, qkv, arrival_counters("decode_tail_tma", 2, a.device),
        trace if trace is not None else a, p.programs, w.eps2, w.eps1_next,
    )  # fmt: skip
    overlap = pdl.enabled(a.device)  # launched after the decode attention, starting while it ends
    kwargs = dict(
        H=h_size, A=a_width, INTER=inter, HAS_NEXT=has_next, R1=p.r1, GU_NRB=gu_nrb, GU_BR=gu_br,
        D_NKB=d_nkb, D_BR=d_rows, D_C=d_c, Q_NRB=q_nrb, Q_BR=q_br, L_O=_tile_layout(p.r1, a_width // CHUNK),
        L_GU=_tile_layout(gu_br, h_size // CHUNK), L_D=_tile_layout(d_rows, d_c),
        L_Q=_tile_layout(q_br, h_size // CHUNK), F_A=_flat(a_width // CHUNK), F_H=_flat(h_size // CHUNK),
        F_D=_flat(d_c), TRACE=trace is not None,
        num_warps=NUM_WARPS, PDL=overlap, ALIAS=p.alias, **pdl.launch_kwargs(overlap),
    )  # fmt: skip
    result = (qkv, h2) if has_next else (y, h)
    return (p.programs,), args, kwargs, result
