"""The batch-1 layer tail (reference.decode_layer_tail) with its weights copied into shared memory by the
tensor memory accelerator (TMA), written in Gluon (Hopper and later).

One program per SM (P of them, 16 warps) owns whole rows of each weight. Stage 1's o-projection slice
is loaded into registers; the slices of stages 2-4 (gate_up, down, the next qkv: ~208 KB a program at
the Qwen3-0.6B shapes) arrive as TMA copies into shared memory, one mbarrier per box, so a stage starts
on a box as soon as that box has landed. The next qkv's boxes land in gate_up's buffers once stage 2 has
read them (TmaPlan.alias: 144 KB of buffers), leaving room on the SM for a decode attention program. The
copies run beside the program's own loads and stores: a grid barrier's release fence does not wait for
them (kernels.decode_tail's weights, held in registers, drain at every barrier).

What the launch's time depends on, measured with `python -m bench.tail_timeline --tma`: a
load issued while copies are queued waits behind them, whether it reads HBM or L2 (the stage inputs,
the barrier's counter). So the copies are issued as late as they can still land in time: gate_up's
after stage 1's weights and input were asked for, down's and the next qkv's once the stage before them
has read its input (issuing all of them at the start, gate_up's after stage 1 or before the PDL wait,
or the next qkv's earlier measured slower: docs/performance.md). And every value a stage reads that
other programs wrote (a few KB) is read once per program and handed to the warps through shared memory
(`_broadcast`): 128 programs x 16 warps asking for the same L2 lines cost several times more a stage.

The stages, the grid barriers (an arrival counter) and the rounding points are those of
kernels.decode_tail. Shapes: weights are viewed as (N, K / 256, 256) and copied in boxes of (rows,
chunks, 256); only shapes that divide this way, 16-bit weights without biases, and slices that fit the
shared memory take this kernel (kernels.decode_tail_tma_plan: `plan`, the layouts, the launch's
arguments); kernels.decode_tail takes the others. Gluon has no interpreter: tests compile this kernel
for sm_90 on the CPU (tests/kernels/compile_sm90.py) and run it on the GPU.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from kernels.decode_tail_tma_plan import _plan_for, fits, launch_args
from kernels.reference import TailWeights

# the names moved between Triton releases (3.6 on the H200, newer here)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier

# The next qkv's boxes are copied into gate_up's buffers once stage 2 is done with them (they are issued
# after the barrier that follows stage 2) where the plan allows it (TmaPlan.alias): 152 KB of shared
# memory a program instead of 216 KB, so a decode attention program (kernels.decode_launch.PEEL_TILE)
# fits beside it on the SM: the next layer's attention is resident, its first K/V tile asked for, while
# the tail runs, and the next tail's programs land beside the attention's.


@gluon.jit
def _grid_sync(bar_ptr, target):
    """Every program arrives; returns once `target` arrivals are counted (as kernels.decode_tail)."""
    _cta_barrier()
    gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    _cta_barrier()


@gluon.jit
def _gdc(instruction: gl.constexpr, ON: gl.constexpr):
    """griddepcontrol.wait / .launch_dependents when launched with programmatic dependent launch
    (kernels.pdl)."""
    if ON:
        gl.inline_asm_elementwise(instruction + "; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _stamp(trace_ptr, pid, point: gl.constexpr, TRACE: gl.constexpr):
    """TRACE: once every warp of the program is here, the GPU's nanosecond clock goes to
    trace[pid, point] (bench.tail_timeline --tma); otherwise nothing."""
    if TRACE:
        _cta_barrier()
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                      pack=1)  # fmt: skip
        gl.store(trace_ptr + pid * TRACE_POINTS + point, t)


# the traced points (bench.tail_timeline --tma)
POINTS = ("start", "1 (o) end", "barrier 1 exit", "2 (gate_up) input read", "2 weights landed", "2 end",
          "barrier 2 exit", "3 (down) weights landed", "3 end", "barrier 3 exit", "4 (qkv) weights landed",
          "4 end")  # fmt: skip
TRACE_POINTS: gl.constexpr = gl.constexpr(len(POINTS))


@gluon.jit
def _offsets(start, C: gl.constexpr, F: gl.constexpr):
    """Offsets start + [0, C * 256) as (C, 256) in the 2-d layout F."""
    c = gl.arange(0, C, layout=gl.SliceLayout(1, F))
    k = gl.arange(0, 256, layout=gl.SliceLayout(0, F))
    return start + gl.expand_dims(c, 1) * 256 + gl.expand_dims(k, 0)


@gluon.jit
def _broadcast(v, L: gl.constexpr):
    """(C, 256) values (held once by the program) -> (1, C, 256) float32 in L, where every warp that
    holds rows of a (rows, C, 256) tile sees them (through shared memory: each value is read from L2
    once per program, not once per warp)."""
    return gl.expand_dims(gl.convert_layout(v.to(gl.float32), gl.SliceLayout(0, L)), 0)


@gluon.jit
def _add_norm(x_ptr, r, nw, save_ptr, eps, save, H: gl.constexpr, F: gl.constexpr):
    """(s, rms_norm(s) * nw) for s = x + r, rounded as reference.add_rms_norm_linear, (H / 256, 256) in
    F; r and nw are already held; `save`: this program also stores s (the new residual)."""
    offs = _offsets(0, H // 256, F)
    x = gl.load(x_ptr + offs, cache_modifier=".cg")
    dt: gl.constexpr = x_ptr.dtype.element_ty
    s = (x.to(gl.float32) + r.to(gl.float32)).to(dt)
    if save:
        gl.store(save_ptr + offs, s)
    sf = s.to(gl.float32)
    rstd = 1.0 / gl.sqrt(gl.sum(gl.sum(sf * sf, axis=1), axis=0) / H + eps)
    h = (sf * rstd).to(dt)
    return s, (nw.to(gl.float32) * h.to(gl.float32)).to(dt)


@gluon.jit
def _silu_input(gu_ptr, start, INTER: gl.constexpr, C: gl.constexpr, F: gl.constexpr, L: gl.constexpr):
    """silu(gate) * up for columns [start, start + C * 256) as (1, C, 256) float32 in L."""
    offs = _offsets(start, C, F)
    dt: gl.constexpr = gu_ptr.dtype.element_ty
    g = gl.load(gu_ptr + offs, cache_modifier=".cg").to(gl.float32)
    up = gl.load(gu_ptr + INTER + offs, cache_modifier=".cg").to(gl.float32)
    silu = (g / (1.0 + gl.exp(-g))).to(dt).to(gl.float32)
    return _broadcast((silu * up).to(dt), L)


@gluon.jit
def _rows_arange(R: gl.constexpr, L: gl.constexpr):
    return gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))


@gluon.jit
def _tile_dot(w, x, CHUNKS_FIRST: gl.constexpr = False):
    """(R,) float32 sums of w (R, C, 256) * x (1, C, 256). CHUNKS_FIRST (a thread holds all C chunks of
    its columns): the chunks are added in the thread before the sum across lanes, one shuffle tree a row
    instead of C."""
    p = w.to(gl.float32) * x
    if CHUNKS_FIRST:  # (the same rows per thread as the other order: a conversion without data movement)
        rows = gl.sum(gl.sum(p, axis=1), axis=1)
        return gl.convert_layout(rows, gl.SliceLayout(1, gl.SliceLayout(2, w.type.layout)))
    return gl.sum(gl.sum(p, axis=2), axis=1)


@gluon.jit
def _row_boxes_stage(bufs, bars, BAR0: gl.constexpr, x, y_ptr, pid, NRB: gl.constexpr, BR: gl.constexpr,
                     L: gl.constexpr, CHUNKS_FIRST: gl.constexpr, trace_ptr, POINT: gl.constexpr,
                     TRACE: gl.constexpr):  # fmt: skip
    """A stage whose weights are NRB row boxes of BR rows over the whole K (gate_up, the next qkv): each
    box multiplied by x (the stage's input as _broadcast made it) once its copy, counted
    by bars[BAR0 + box], has landed; the program's rows of y stored. POINT: stamped at the first box."""
    for rb in gl.static_range(NRB):
        mbarrier.wait(bars.index(BAR0 + rb), 0)
        if rb == 0:
            _stamp(trace_ptr, pid, POINT, TRACE)
        acc = _tile_dot(bufs.index(rb).load(L), x, CHUNKS_FIRST)
        gl.store(y_ptr + pid * (NRB * BR) + rb * BR + _rows_arange(BR, L), acc.to(y_ptr.dtype.element_ty))


@gluon.jit
def _o_slice(wo_ptr, pid, A: gl.constexpr, R1: gl.constexpr, L: gl.constexpr):
    """This program's R1 rows of Wo (H, A) as (R1, A / 256, 256) in L."""
    r = _rows_arange(R1, L)
    c = gl.arange(0, A // 256, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    k = gl.arange(0, 256, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    rows3 = gl.expand_dims(gl.expand_dims((pid * R1 + r).to(gl.int64) * A, 1), 2)  # (R1, 1, 1)
    return gl.load(wo_ptr + rows3 + gl.expand_dims(gl.expand_dims(c * 256, 0), 2)
                   + gl.expand_dims(gl.expand_dims(k, 0), 1))  # fmt: skip


@gluon.jit
def _issue_box(j: gl.constexpr, pid, gu_desc, d_desc, q_desc, gu_bufs, d_bufs, q_bufs, bars,
               GU_NRB: gl.constexpr, GU_BR: gl.constexpr, D_NKB: gl.constexpr, D_BR: gl.constexpr,
               D_C: gl.constexpr, Q_NRB: gl.constexpr, Q_BR: gl.constexpr):  # fmt: skip
    """The TMA copy of box j (gate_up row boxes, then down K boxes, then next-qkv row boxes), counted by
    its own mbarrier bars[j]."""
    bar = bars.index(j)
    if j < GU_NRB:
        mbarrier.expect(bar, gu_desc.block_type.nbytes)
        _tma_load(gu_desc, [pid * (GU_NRB * GU_BR) + j * GU_BR, 0, 0], bar, gu_bufs.index(j))
    elif j < GU_NRB + D_NKB:
        mbarrier.expect(bar, d_desc.block_type.nbytes)
        _tma_load(d_desc, [pid * D_BR, (j - GU_NRB) * D_C, 0], bar, d_bufs.index(j - GU_NRB))
    else:
        q = j - GU_NRB - D_NKB
        mbarrier.expect(bar, q_desc.block_type.nbytes)
        _tma_load(q_desc, [pid * (Q_NRB * Q_BR) + q * Q_BR, 0, 0], bar, q_bufs.index(q))


@gluon.jit
def _issue_range(first: gl.constexpr, end: gl.constexpr, pid, gu_desc, d_desc, q_desc, gu_bufs, d_bufs,
                 q_bufs, bars, GU_NRB: gl.constexpr, GU_BR: gl.constexpr, D_NKB: gl.constexpr,
                 D_BR: gl.constexpr, D_C: gl.constexpr, Q_NRB: gl.constexpr, Q_BR: gl.constexpr):  # fmt: skip
    for j in gl.static_range(first, end):
        _issue_box(j, pid, gu_desc, d_desc, q_desc, gu_bufs, d_bufs, q_bufs, bars, GU_NRB, GU_BR, D_NKB, D_BR,
                   D_C, Q_NRB, Q_BR)  # fmt: skip


@gluon.jit
def _tail_tma_kernel(
    a_ptr,  # (1, A) attention output
    res_ptr,  # (1, H) residual
    wo_ptr,  # (H, A) o projection
    n2_ptr,  # (H,) post-attention norm
    n1_ptr,  # (H,) the next layer's input norm (HAS_NEXT)
    gu_desc,  # TMA descriptors over (N, K / 256, 256) views: gate_up, down, next qkv
    d_desc,
    q_desc,
    o_ptr,  # (1, H) stage 1's output
    h_ptr,  # (1, H) o + residual, written by program 0
    gu_ptr,  # (1, 2I)
    y_ptr,  # (1, H)
    h2_ptr,  # (1, H) y + h, written by program 0 (HAS_NEXT)
    qkv_ptr,  # (1, NQ) (HAS_NEXT)
    bar_ptr,  # (2,) int32 zeros: barrier arrivals and exits; left zeroed
    trace_ptr,  # TRACE: (P, TRACE_POINTS) int64 nanoseconds
    P,  # programs
    eps2,
    eps1,
    H: gl.constexpr,
    A: gl.constexpr,
    INTER: gl.constexpr,
    HAS_NEXT: gl.constexpr,
    R1: gl.constexpr,  # o rows a program owns (in registers)
    GU_NRB: gl.constexpr,  # gate_up: row boxes of GU_BR rows (whole K)
    GU_BR: gl.constexpr,
    D_NKB: gl.constexpr,  # down: D_BR rows in K boxes of D_C chunks
    D_BR: gl.constexpr,
    D_C: gl.constexpr,
    Q_NRB: gl.constexpr,  # next qkv: row boxes of Q_BR rows (whole K)
    Q_BR: gl.constexpr,
    L_O: gl.constexpr,  # register layouts of the (rows, chunks, 256) tiles
    L_GU: gl.constexpr,
    L_D: gl.constexpr,
    L_Q: gl.constexpr,
    F_A: gl.constexpr,  # 2-d layouts holding (C, 256) inputs once per program
    F_H: gl.constexpr,
    F_D: gl.constexpr,
    TRACE: gl.constexpr,  # timestamps at POINTS
    PDL: gl.constexpr,  # launched with programmatic dependent launch (kernels.pdl)
    ALIAS: gl.constexpr,  # the next qkv's boxes land in gate_up's buffers (TmaPlan.alias; Q_BR == GU_BR)
):
    _gdc("griddepcontrol.launch_dependents", PDL)
    dt: gl.constexpr = a_ptr.dtype.element_ty
    KH: gl.constexpr = H // 256
    NBOX: gl.constexpr = GU_NRB + D_NKB + (Q_NRB if HAS_NEXT else 0)
    gu_bufs = gl.allocate_shared_memory(dt, [GU_NRB, GU_BR, KH, 256], gu_desc.layout)
    d_bufs = gl.allocate_shared_memory(dt, [D_NKB, D_BR, D_C, 256], d_desc.layout)
    if HAS_NEXT and not ALIAS:
        q_bufs = gl.allocate_shared_memory(dt, [Q_NRB, Q_BR, KH, 256], q_desc.layout)
    else:
        q_bufs = gu_bufs
    bars = gl.allocate_shared_memory(gl.int64, [NBOX, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NBOX):
        mbarrier.init(bars.index(j), count=1)
    fence_async_shared()
    _cta_barrier()
    pid = gl.program_id(0)
    # tiles whose warps all split rows hold every chunk of a row's columns in one thread
    GU_CHUNKS_FIRST: gl.constexpr = L_GU.warps_per_cta[1] == 1
    Q_CHUNKS_FIRST: gl.constexpr = L_Q.warps_per_cta[1] == 1
    D0: gl.constexpr = GU_NRB  # first down box
    Q0: gl.constexpr = GU_NRB + D_NKB  # first next-qkv box
    NQB: gl.constexpr = Q_NRB if HAS_NEXT else 0
    _stamp(trace_ptr, pid, 0, TRACE)
    # stage 1's weights and input first (nothing queued ahead of them), then the copies stream the later
    # stages' weights while stage 1 runs
    w1 = _o_slice(wo_ptr, pid, A, R1, L_O)
    _gdc("griddepcontrol.wait", PDL)  # what the kernels before wrote: a, the residual, the counters
    a_in = gl.load(a_ptr + _offsets(0, A // 256, F_A))
    _issue_range(0, D0, pid, gu_desc, d_desc, q_desc, gu_bufs, d_bufs, q_bufs, bars, GU_NRB, GU_BR,
                 D_NKB, D_BR, D_C, Q_NRB, Q_BR)  # fmt: skip
    # what the stages read that no stage writes
    hoffs = _offsets(0, KH, F_H)
    res = gl.load(res_ptr + hoffs)
    n2 = gl.load(n2_ptr + hoffs)
    if HAS_NEXT:
        n1 = gl.load(n1_ptr + hoffs)

    # stage 1: o = a @ Wo^T
    x1 = _broadcast(a_in, L_O)
    gl.store(o_ptr + pid * R1 + _rows_arange(R1, L_O), _tile_dot(w1, x1).to(dt))
    _stamp(trace_ptr, pid, 1, TRACE)
    _grid_sync(bar_ptr, P)
    _stamp(trace_ptr, pid, 2, TRACE)

    # stage 2: h = o + residual; gu = rms_norm(h) * n2 @ Wgu^T, box by box as they land
    h, x2 = _add_norm(o_ptr, res, n2, h_ptr, eps2, pid == 0, H, F_H)
    x2 = _broadcast(x2, L_GU)
    _stamp(trace_ptr, pid, 3, TRACE)
    _issue_range(D0, Q0, pid, gu_desc, d_desc, q_desc, gu_bufs, d_bufs, q_bufs, bars, GU_NRB, GU_BR,
                 D_NKB, D_BR, D_C, Q_NRB, Q_BR)  # fmt: skip
    _row_boxes_stage(gu_bufs, bars, 0, x2, gu_ptr, pid, GU_NRB, GU_BR, L_GU, GU_CHUNKS_FIRST,
                     trace_ptr, 4, TRACE)  # fmt: skip
    _stamp(trace_ptr, pid, 5, TRACE)
    _grid_sync(bar_ptr, 2 * P)
    _stamp(trace_ptr, pid, 6, TRACE)

    # stage 3: y = silu(gate) * up @ Wd^T, K in D_NKB (<= 4) boxes; the inputs read before the waits
    x30 = _silu_input(gu_ptr, 0, INTER, D_C, F_D, L_D)
    if D_NKB > 1:
        x31 = _silu_input(gu_ptr, D_C * 256, INTER, D_C, F_D, L_D)
    if D_NKB > 2:
        x32 = _silu_input(gu_ptr, 2 * D_C * 256, INTER, D_C, F_D, L_D)
    if D_NKB > 3:
        x33 = _silu_input(gu_ptr, 3 * D_C * 256, INTER, D_C, F_D, L_D)
    if ALIAS:  # gate_up's buffers, read by every warp before the barrier, are overwritten by the copies
        fence_async_shared()
    _issue_range(Q0, Q0 + NQB, pid, gu_desc, d_desc, q_desc, gu_bufs, d_bufs, q_bufs, bars, GU_NRB, GU_BR,
                 D_NKB, D_BR, D_C, Q_NRB, Q_BR)  # fmt: skip
    mbarrier.wait(bars.index(D0), 0)
    _stamp(trace_ptr, pid, 7, TRACE)
    acc = _tile_dot(d_bufs.index(0).load(L_D), x30)
    if D_NKB > 1:
        mbarrier.wait(bars.index(D0 + 1), 0)
        acc += _tile_dot(d_bufs.index(1).load(L_D), x31)
    if D_NKB > 2:
        mbarrier.wait(bars.index(D0 + 2), 0)
        acc += _tile_dot(d_bufs.index(2).load(L_D), x32)
    if D_NKB > 3:
        mbarrier.wait(bars.index(D0 + 3), 0)
        acc += _tile_dot(d_bufs.index(3).load(L_D), x33)
    gl.store(y_ptr + pid * D_BR + _rows_arange(D_BR, L_D), acc.to(dt))
    _stamp(trace_ptr, pid, 8, TRACE)

    if HAS_NEXT:
        # stage 4: h2 = y + h; qkv = rms_norm(h2) * n1 @ Wqkv^T
        _grid_sync(bar_ptr, 3 * P)
        _stamp(trace_ptr, pid, 9, TRACE)
        _, x4 = _add_norm(y_ptr, h, n1, h2_ptr, eps1, pid == 0, H, F_H)
        x4 = _broadcast(x4, L_Q)
        _row_boxes_stage(q_bufs, bars, Q0, x4, qkv_ptr, pid, Q_NRB, Q_BR, L_Q, Q_CHUNKS_FIRST,
                         trace_ptr, 10, TRACE)  # fmt: skip
        _stamp(trace_ptr, pid, 11, TRACE)
    # the last program out leaves the counters zeroed for the next launch
    _cta_barrier()
    done = gl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == P - 1:
        gl.store(bar_ptr, 0)
        gl.store(bar_ptr + 1, 0)


def decode_layer_tail(
    a: torch.Tensor,  # (1, A): the attention output
    residual: torch.Tensor,  # (1, H)
    w: TailWeights,
    trace: torch.Tensor | None = None,  # (>= programs, TRACE_POINTS) int64: this launch's timestamps
) -> tuple[torch.Tensor, torch.Tensor]:  # (qkv of the next layer (1, NQ) or y (1, H); the new residual)
    """reference.decode_layer_tail in one launch whose weights arrive by TMA (see the module docstring)."""
    if not fits(a.shape[0], a.dtype, w, a.device) or residual.dtype != a.dtype:
        raise ValueError("decode_tail_tma: batch 1, 16-bit weights without biases, and shapes that divide")
    from kernels import cooperative

    p = _plan_for(w, a.device)
    if trace is not None and not (
        trace.dtype == torch.int64
        and trace.is_contiguous()
        and trace.dim() == 2
        and trace.shape[0] >= p.programs
        and trace.shape[1] == len(POINTS)
    ):
        raise ValueError(f"trace: a contiguous int64 ({p.programs}, {len(POINTS)}) tensor or more rows")
    grid, args, kwargs, result = launch_args(a.contiguous(), residual.contiguous(), w, p, trace)
    _tail_tma_kernel[grid](*args, **kwargs, **cooperative.grid_kwargs())
    return result
