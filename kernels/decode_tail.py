"""The tail of a decode layer at small batch in one persistent launch (reference.decode_layer_tail):

    o        = a @ Wo^T (+ bo)                                   stage 1
    h        = o + residual;  gu = rms_norm(h) * w2 @ Wgu^T (+ b)  stage 2
    y        = silu(gu[:, :I]) * gu[:, I:] @ Wd^T (+ bd)          stage 3
    h2       = y + h;  qkv = rms_norm(h2) * w1' @ Wqkv'^T (+ b)   stage 4 (the next layer's input; optional)

At batch 1 each projection is a weight stream of 4-12 MB that the GPU reads in a few microseconds;
launched one by one, each also pays a kernel boundary and a chain of dependent memory round trips.
Here each of a few programs per SM (TailConfig) owns a contiguous slice of every stage's weight rows (ROWS_s =
cdiv(N_s, programs) whole rows) and holds each slice in registers: it asks for stage 1's and stage 2's
slices at once at the start, and for stage s + 1's as soon as stage s begins, so DRAM streams the next
weights while the current stage waits for its input, multiplies and stores. Between stages all
programs meet at a grid-wide barrier (an arrival counter in global memory); a stage's input (a few KB
written by every program) is then read once, whole rows, from L2.

The barrier needs every program resident at once (kernels.cooperative): programs per SM are lowered
until the compiled kernel's registers allow that many side by side, and the grid is launched
cooperatively where Triton offers it (a grid that cannot be resident is then refused, not left
waiting). Every launch uses the same barrier counters, so launches run on one stream at a time (the
engine's decode step). Outputs of a stage are read by other programs after the barrier, so those
loads bypass L1 (".cg"). Rounding follows the unfused kernels (kernels.gemv with NORM or SILU_MUL):
fp32 accumulation, each intermediate rounded to the activation dtype once.

`python -m bench.tail_timeline` traces one launch (TRACE: every program stamps the GPU's clock at its
start and, per stage, at its input read, its end and its barrier exit).

Triton's interpreter runs programs one after another, so no program could wait for another: on the CPU
every stage is its own launch of the same kernel (FIRST == LAST), which tests the arithmetic; the GPU
tests check the barrier path against the same reference and against the staged launches, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import cooperative
from kernels._jit import arrival_counters, is_interpreting, kernel, next_pow2, sm_count
from kernels.reference import TailWeights


class TailConfig(NamedTuple):
    programs_per_sm: int  # all resident at once (a cooperative launch fails otherwise)
    num_warps: int


# Two programs of 8 warps per SM: the fastest of `python -m bench.kernels --sweep-tail` at the
# Qwen3-0.6B shapes. With 4 warps the weights are multiplied in the layout they were loaded in (8 and 16
# move them through shared memory), but more programs contend for the one barrier counter. Handing a
# stage's output over without a barrier (tagged words re-read until every one carries the launch's tag)
# measured slower.
DEFAULT_CONFIG = TailConfig(2, 8)
INTERPRET_CONFIG = TailConfig(4, 4)  # the interpreter counts one "SM"
MAX_M = 1  # batch sizes the engine sends here, and the one launch takes (its grid is sized for M = 1)
KERNEL_MAX_M = 4  # what the stages launched one by one take (the register tiles grow with M)


@triton.jit
def _grid_sync(bar_ptr, target):
    """Every program of the grid arrives; returns once `target` arrivals are counted. The CTA barrier
    before the release makes all of this program's stores part of it."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _stamp(trace_ptr, pid, point: tl.constexpr, TRACE: tl.constexpr):
    """TRACE: once every warp of the program is here, the GPU's global nanosecond clock goes to
    trace[pid, point] (bench.tail_timeline); otherwise nothing."""
    if TRACE:
        tl.debug_barrier()
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                      pack=1)  # fmt: skip
        tl.store(trace_ptr + pid * TRACE_POINTS + point, t)


TRACE_POINTS: tl.constexpr = tl.constexpr(12)  # start; per stage: input read, end, barrier exit


@triton.jit
def _slice(w_ptr, pid, N: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
           BLOCK_K: tl.constexpr):  # fmt: skip
    """This program's rows [pid * ROWS, pid * ROWS + ROWS) of W (N, K), whole: (BLOCK_R, BLOCK_K)."""
    r = tl.arange(0, BLOCK_R)
    rows = pid * ROWS + r
    cols = tl.arange(0, BLOCK_K)
    mask = ((r < ROWS) & (rows < N))[:, None] & (cols < K)[None, :]
    return tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _input(x_ptr, r_ptr, nw_ptr, save_ptr, M, eps, pid, K: tl.constexpr, MODE: tl.constexpr,
           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """A stage's input rows (BLOCK_M, BLOCK_K) in the activation dtype, read once. MODE 0: x (M, K);
    1: rms_norm(x + r) * nw, rounded as reference.add_rms_norm_linear, program 0 saving x + r (the new
    residual) to save_ptr; 2: silu(x[:, :K]) * x[:, K:] for x (M, 2K)."""
    rm = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    kmask = cols < K
    mask = (rm < M)[:, None] & kmask[None, :]
    dt = x_ptr.dtype.element_ty
    if MODE == 2:
        ptrs = x_ptr + rm[:, None] * (2 * K) + cols[None, :]
        g = tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        up = tl.load(ptrs + K, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        return (silu * up).to(dt)
    offs = rm[:, None] * K + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    if MODE == 1:
        r = tl.load(r_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
        s = (x.to(tl.float32) + r.to(tl.float32)).to(dt)
        if pid == 0:
            tl.store(save_ptr + offs, s, mask=mask)
        sf = s.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=1) / K + eps)  # (BLOCK_M,)
        nw = tl.load(nw_ptr + cols, mask=kmask, other=0.0).to(tl.float32)
        h = (sf * rstd[:, None]).to(dt)
        x = (nw[None, :] * h.to(tl.float32)).to(dt)
    return x


@triton.jit
def _project(w, x, b_ptr, y_ptr, M, pid, N: tl.constexpr, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):  # fmt: skip
    """y[:, this program's rows] = x (BLOCK_M, BLOCK_K) @ w (BLOCK_R, BLOCK_K)^T (+ b), fp32 sums. One
    input row at a time against the 2-d tile: the tile keeps the layout it was loaded in (a 3-d
    broadcast would move it through shared memory)."""
    r = tl.arange(0, BLOCK_R)
    rows = pid * ROWS + r
    rmask = (r < ROWS) & (rows < N)
    bias = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
    wf = w.to(tl.float32)
    rm = tl.arange(0, BLOCK_M)
    for mi in tl.static_range(BLOCK_M):
        if BLOCK_M == 1:
            xv = tl.reshape(x, (x.shape[1],)).to(tl.float32)
        else:  # row mi of x (a sum with one nonzero term: exact)
            xv = tl.sum(tl.where((rm == mi)[:, None], x.to(tl.float32), 0.0), axis=0)
        acc = tl.sum(wf * xv[None, :], axis=1) + bias  # (BLOCK_R,)
        live = rmask & (r < tl.where(mi < M, ROWS, 0))  # (no scalar & block: the interpreter)
        tl.store(y_ptr + mi * N + rows, acc.to(y_ptr.dtype.element_ty), mask=live)


@kernel
def _decode_tail_kernel(
    a_ptr,  # (M, A) attention output, contiguous
    res_ptr,  # (M, H) residual, contiguous
    wo_ptr,
    bo_ptr,
    n2_ptr,
    wgu_ptr,
    bgu_ptr,
    wd_ptr,
    bd_ptr,
    n1_ptr,
    wq_ptr,
    bq_ptr,  # TailWeights
    o_ptr,  # (M, H) stage 1's output
    h_ptr,  # (M, H) o + residual (the residual after attention), written by program 0
    gu_ptr,  # (M, 2I)
    y_ptr,  # (M, H) the MLP's output
    h2_ptr,  # (M, H) y + h, written by program 0 (LAST == 4)
    qkv_ptr,  # (M, NQ) the next layer's qkv (LAST == 4)
    bar_ptr,  # (2,) int32 zeros: barrier arrivals and exits; left zeroed
    trace_ptr,  # TRACE: (P, TRACE_POINTS) int64 nanoseconds
    M,
    P,  # programs in the grid
    eps2,
    eps1,
    H: tl.constexpr,
    A: tl.constexpr,
    INTER: tl.constexpr,
    NQ: tl.constexpr,
    FIRST: tl.constexpr,  # stages FIRST..LAST run in this launch (1..3 or 1..4 on a GPU)
    LAST: tl.constexpr,
    HAS_BO: tl.constexpr,
    HAS_BGU: tl.constexpr,
    HAS_BD: tl.constexpr,
    HAS_BQ: tl.constexpr,
    BLOCK_M: tl.constexpr,
    R1: tl.constexpr,  # rows a program owns in each stage, and their power-of-two tile heights
    R2: tl.constexpr,
    R3: tl.constexpr,
    R4: tl.constexpr,
    BR1: tl.constexpr,
    BR2: tl.constexpr,
    BR3: tl.constexpr,
    BR4: tl.constexpr,
    BH: tl.constexpr,  # next_pow2 of H, A, I
    BA: tl.constexpr,
    BI: tl.constexpr,
    TRACE: tl.constexpr,  # timestamps (TRACE_POINTS) in the one launch
):
    """Stages FIRST..LAST of the tail for one program (see the module docstring)."""
    pid = tl.program_id(0)
    _stamp(trace_ptr, pid, 0, TRACE)
    # the weights of the first two stages of this launch are requested at once; each later stage's
    # when the one before it starts
    if FIRST <= 1:
        w1 = _slice(wo_ptr, pid, H, A, R1, BR1, BA)
    if FIRST <= 2 and LAST >= 2:
        w2 = _slice(wgu_ptr, pid, 2 * INTER, H, R2, BR2, BH)
    if FIRST <= 1:
        x1 = _input(a_ptr, a_ptr, a_ptr, a_ptr, M, 0.0, pid, A, 0, BLOCK_M, BA)
        _stamp(trace_ptr, pid, 1, TRACE)
        _project(w1, x1, bo_ptr, o_ptr, M, pid, H, R1, HAS_BO, BLOCK_M, BR1)
        _stamp(trace_ptr, pid, 2, TRACE)
    if FIRST <= 2 and LAST >= 2:
        if FIRST < 2:
            _grid_sync(bar_ptr, (2 - FIRST) * P)
            _stamp(trace_ptr, pid, 3, TRACE)
        if LAST >= 3:
            w3 = _slice(wd_ptr, pid, H, INTER, R3, BR3, BI)
        x2 = _input(o_ptr, res_ptr, n2_ptr, h_ptr, M, eps2, pid, H, 1, BLOCK_M, BH)
        _stamp(trace_ptr, pid, 4, TRACE)
        _project(w2, x2, bgu_ptr, gu_ptr, M, pid, 2 * INTER, R2, HAS_BGU, BLOCK_M, BR2)
        _stamp(trace_ptr, pid, 5, TRACE)
    if FIRST <= 3 and LAST >= 3:
        if FIRST < 3:
            _grid_sync(bar_ptr, (3 - FIRST) * P)
            _stamp(trace_ptr, pid, 6, TRACE)
        else:
            w3 = _slice(wd_ptr, pid, H, INTER, R3, BR3, BI)
        if LAST >= 4:
            w4 = _slice(wq_ptr, pid, NQ, H, R4, BR4, BH)
        x3 = _input(gu_ptr, gu_ptr, gu_ptr, gu_ptr, M, 0.0, pid, INTER, 2, BLOCK_M, BI)
        _stamp(trace_ptr, pid, 7, TRACE)
        _project(w3, x3, bd_ptr, y_ptr, M, pid, H, R3, HAS_BD, BLOCK_M, BR3)
        _stamp(trace_ptr, pid, 8, TRACE)
    if LAST >= 4:
        if FIRST < 4:
            _grid_sync(bar_ptr, (4 - FIRST) * P)
            _stamp(trace_ptr, pid, 9, TRACE)
        else:
            w4 = _slice(wq_ptr, pid, NQ, H, R4, BR4, BH)
        x4 = _input(y_ptr, h_ptr, n1_ptr, h2_ptr, M, eps1, pid, H, 1, BLOCK_M, BH)
        _stamp(trace_ptr, pid, 10, TRACE)
        _project(w4, x4, bq_ptr, qkv_ptr, M, pid, NQ, R4, HAS_BQ, BLOCK_M, BR4)
        _stamp(trace_ptr, pid, 11, TRACE)
    if FIRST < LAST:  # the last program out leaves the counters zeroed for the next launch
        tl.debug_barrier()
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == P - 1:
            tl.store(bar_ptr, 0)
            tl.store(bar_ptr + 1, 0)


MAX_PER_THREAD = 128  # weight elements (x BLOCK_M) a thread holds for one stage: 64 registers in 16 bits


def _plan(h: int, a: int, inter: int, nq: int, cfg: TailConfig, device: torch.device, interpreting: bool):
    """(programs, [(rows, tile height)] per stage): every program owns `rows` whole rows of each weight."""
    # no GPU: one SM in the interpreter, the H200's 132 to compile its kernel on a machine without one
    sms = sm_count(device) if device.type == "cuda" else (1 if interpreting else 132)
    programs = sms * cfg.programs_per_sm
    slices = []
    for n in (h, 2 * inter, h, nq):
        rows = triton.cdiv(n, programs)
        slices.append((rows, next_pow2(rows)))
    return programs, slices


def fits(m: int, dtype: torch.dtype, w: TailWeights, device: torch.device) -> bool:
    """Whether decode_layer_tail takes the fused kernel here: the engine's decode batch sizes, 16-bit
    weights, and every program's slice of each stage small enough to sit in registers."""
    if not (1 <= m <= MAX_M and dtype in (torch.bfloat16, torch.float16) and _weights_ok(w, dtype)):
        return False
    h, a, inter = w.o.shape[0], w.o.shape[1], w.down.shape[1]
    nq = w.qkv_next.shape[0] if w.qkv_next is not None else 1
    _, slices = _plan(h, a, inter, nq, DEFAULT_CONFIG, device, False)
    sizes = [next_pow2(m) * br * next_pow2(k) for (_, br), k in zip(slices, (a, h, inter, h), strict=True)]
    return max(sizes) <= MAX_PER_THREAD * 32 * DEFAULT_CONFIG.num_warps


def _weights_ok(w: TailWeights, dtype: torch.dtype) -> bool:
    tensors = [w.o, w.o_bias, w.norm2, w.gate_up, w.gate_up_bias, w.down, w.down_bias, w.norm1_next,
               w.qkv_next, w.qkv_next_bias]  # fmt: skip
    return all(t is None or (t.dtype == dtype and t.is_contiguous()) for t in tensors)


def _check_tail(a: torch.Tensor, residual: torch.Tensor, w: TailWeights) -> None:
    m, a_width = a.shape
    h_size, inter = w.o.shape[0], w.down.shape[1]
    if not 1 <= m <= KERNEL_MAX_M:
        raise ValueError(f"decode_layer_tail takes 1..{KERNEL_MAX_M} rows, got {m}")
    if w.o.shape[1] != a_width or residual.shape != (m, h_size) or w.gate_up.shape != (2 * inter, h_size):
        raise ValueError("decode_layer_tail: inconsistent shapes")
    if w.down.shape[0] != h_size or (w.qkv_next is not None and w.qkv_next.shape[1] != h_size):
        raise ValueError("decode_layer_tail: inconsistent shapes")
    if not _weights_ok(w, a.dtype) or residual.dtype != a.dtype:
        raise ValueError("decode_layer_tail: weights must be contiguous and of the activations' dtype")


class _TailLaunch(NamedTuple):
    launch: object  # TailConfig -> (programs, args, constexprs incl. LAST)
    result: tuple[torch.Tensor, torch.Tensor]  # what the tail returns, once run
    key: tuple  # what its compiled variant depends on


def _tail_launch(a: torch.Tensor, residual: torch.Tensor, w: TailWeights, interp: bool,
                 trace: torch.Tensor | None = None) -> _TailLaunch:  # fmt: skip
    """The tail's buffers and launch arguments for a (M, A) (contiguous) and residual (M, H)."""
    m, a_width = a.shape
    h_size, inter = w.o.shape[0], w.down.shape[1]
    has_next = w.qkv_next is not None
    nq = w.qkv_next.shape[0] if has_next else 1
    new = lambda *shape: torch.empty(shape, dtype=a.dtype, device=a.device)
    o, h, gu, y = new(m, h_size), new(m, h_size), new(m, 2 * inter), new(m, h_size)
    h2, qkv = (new(m, h_size), new(m, nq)) if has_next else (y, y)
    dummy = w.o
    tensors = (
        a, residual, w.o, w.o_bias if w.o_bias is not None else dummy, w.norm2, w.gate_up,
        w.gate_up_bias if w.gate_up_bias is not None else dummy, w.down,
        w.down_bias if w.down_bias is not None else dummy, w.norm1_next if has_next else dummy,
        w.qkv_next if has_next else dummy, w.qkv_next_bias if w.qkv_next_bias is not None else dummy,
        o, h, gu, y, h2, qkv, arrival_counters("decode_tail", 2, a.device),
        trace if trace is not None else a,
    )  # fmt: skip
    flags = dict(
        H=h_size, A=a_width, INTER=inter, NQ=nq, HAS_BO=w.o_bias is not None,
        HAS_BGU=w.gate_up_bias is not None, HAS_BD=w.down_bias is not None,
        HAS_BQ=w.qkv_next_bias is not None, BLOCK_M=next_pow2(m), BH=next_pow2(h_size),
        BA=next_pow2(a_width), BI=next_pow2(inter), LAST=4 if has_next else 3, TRACE=trace is not None,
        num_stages=1,
    )  # fmt: skip

    def launch(c: TailConfig):
        programs, slices = _plan(h_size, a_width, inter, nq, c, a.device, interp)
        (r1, br1), (r2, br2), (r3, br3), (r4, br4) = slices
        tiles = dict(R1=r1, R2=r2, R3=r3, R4=r4, BR1=br1, BR2=br2, BR3=br3, BR4=br4, num_warps=c.num_warps)
        return programs, (*tensors, m, programs, w.eps2, w.eps1_next), flags | tiles

    return _TailLaunch(launch, (qkv, h2) if has_next else (y, h), tuple(flags.items()))


def _mode(a: torch.Tensor, config: TailConfig | None, fused: bool | None):
    """(interpreting, config, one launch or staged): one launch by default on CUDA, never in the
    interpreter (its programs run one by one and could not wait for each other)."""
    interp = is_interpreting(a)
    fused = (not interp) if fused is None else fused
    if fused and interp:
        raise ValueError("the interpreter runs programs one by one: no grid barrier (fused=False)")
    if fused and a.shape[0] > MAX_M:
        raise ValueError(f"the one-launch tail is sized for {MAX_M} row(s), got {a.shape[0]} (fused=False)")
    return interp, config or (INTERPRET_CONFIG if interp else DEFAULT_CONFIG), fused


def decode_layer_tail(
    a: torch.Tensor,  # (M, A): the attention output, M <= KERNEL_MAX_M
    residual: torch.Tensor,  # (M, H)
    w: TailWeights,
    config: TailConfig | None = None,
    fused: bool | None = None,  # one launch with grid barriers (default: on CUDA)
    trace: torch.Tensor | None = None,  # (>= programs, TRACE_POINTS) int64: the one launch's timestamps
) -> tuple[torch.Tensor, torch.Tensor]:  # (qkv of the next layer (M, NQ) or y (M, H), new residual)
    """reference.decode_layer_tail in one launch (CUDA) or one launch per stage (the interpreter)."""
    _check_tail(a, residual, w)
    a, residual = a.contiguous(), residual.contiguous()
    interp, cfg, fused = _mode(a, config, fused)
    traceable = fused and trace is not None and trace.dtype == torch.int64 and trace.is_contiguous()
    if trace is not None and not (traceable and trace.dim() == 2 and trace.shape[1] == TRACE_POINTS.value):
        raise ValueError("trace: a contiguous int64 (programs, TRACE_POINTS) tensor, one launch only")
    tail = _tail_launch(a, residual, w, interp, trace)
    if not fused:
        programs, args, consts = tail.launch(cfg)
        for stage in range(1, consts.pop("LAST") + 1):
            _decode_tail_kernel[(programs,)](*args, FIRST=stage, LAST=stage, **consts)
        return tail.result
    extra = cooperative.grid_kwargs()
    if a.device.type == "cuda":  # as many programs per SM as stay resident together (the barriers)
        cfg = cooperative.resident(
            _decode_tail_kernel, (a.device.index, a.dtype, cfg, tail.key), cfg, tail.launch, extra
        )
    programs, args, consts = tail.launch(cfg)
    if trace is not None and trace.shape[0] < programs:  # every program writes its own row
        raise ValueError(f"trace: {trace.shape[0]} rows for {programs} programs")
    _decode_tail_kernel[(programs,)](*args, FIRST=1, **consts, **extra)
    return tail.result
