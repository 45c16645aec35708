"""Weight-stationary GEMM for wide decode batches (Gluon, Hopper): y = x @ W^T with each program's weight
rows held in shared memory.

A wide decode step's projections (M = 16-256 rows, K = 1,024-3,072) are bound by their launches' ramps,
not by their bytes: each cuBLAS GEMM takes 5-8 us where its weights stream in 1-3 us. Here every program
owns BN rows of W (N / BN programs, about one per SM) and copies its whole slice into shared memory by TMA
first; launched with programmatic dependent launch it does so while the launch before still runs, and
only then waits (griddepcontrol.wait) for the activations, which it streams in (64, 64) tiles through a
ring of STAGES buffers into the tensor cores (wgmma, one warpgroup). Epilogues (MODE): 0 a plain store,
1 y += acc (one rounding, as addmm_ into the residual), 2 SiLU: the slice is BN gate rows and the BN up
rows N_OUT below them, y = silu(gate) * up rounded as kernels.activation.silu_and_mul.

`python -m kernels.bench_ws` times the four projections of a layer this way against cuBLAS.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# the names moved between Triton releases (3.6 on the H200, newer here)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

BK = gl.constexpr(64)  # K per tile: 128 bytes of bf16, the widest swizzle
SHARED_LIMIT = 227 << 10


@gluon.jit
def _gdc(instruction: gl.constexpr, ON: gl.constexpr):
    if ON:
        gl.inline_asm_elementwise(instruction + "; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _ws_gemm_kernel(
    x_desc,  # (M, K) boxes (BM, BK)
    w_desc,  # (N, K) boxes (BN, BK); MODE 2: N = 2 * N_OUT, gate rows then up rows
    y_ptr,  # (M, N_OUT) row stride stride_y
    M,
    stride_y,
    N_OUT,
    K: gl.constexpr,
    BM: gl.constexpr,  # activation rows a tile: 64 per warpgroup
    BN: gl.constexpr,
    STAGES: gl.constexpr,
    MODE: gl.constexpr,
    PDL: gl.constexpr,
    ACC: gl.constexpr,  # the accumulator's wgmma layout
):
    pid = gl.program_id(0)
    dt: gl.constexpr = x_desc.dtype
    KT: gl.constexpr = K // BK
    NW: gl.constexpr = 2 if MODE == 2 else 1
    w_bufs = gl.allocate_shared_memory(dt, [NW * KT, BN, BK], w_desc.layout)
    a_bufs = gl.allocate_shared_memory(dt, [STAGES, BM, BK], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES + 1):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    w_bar = bars.index(STAGES)
    mbarrier.expect(w_bar, NW * KT * w_desc.block_type.nbytes)
    for j in gl.static_range(NW * KT):  # the weight slice: independent of the launch before
        _tma_load(w_desc, [pid * BN + (j // KT) * N_OUT, (j % KT) * BK], w_bar, w_bufs.index(j))
    _gdc("griddepcontrol.wait", PDL)
    _gdc("griddepcontrol.launch_dependents", PDL)
    MT = gl.cdiv(M, BM)
    total = MT * KT
    for i in gl.static_range(STAGES - 1):
        if i < total:
            mbarrier.expect(bars.index(i), x_desc.block_type.nbytes)
            _tma_load(x_desc, [(i // KT) * BM, (i % KT) * BK], bars.index(i), a_bufs.index(i))
    mbarrier.wait(w_bar, 0)
    rows0 = gl.arange(0, BM, layout=gl.SliceLayout(1, ACC))
    cols = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, ACC))
    for mt in range(MT):
        acc = gl.zeros([BM, BN], gl.float32, ACC)
        acc_u = gl.zeros([BM, BN], gl.float32, ACC)
        for kt in gl.static_range(KT):
            t = mt * KT + kt
            cur = t % STAGES
            mbarrier.wait(bars.index(cur), (t // STAGES) & 1)
            a = a_bufs.index(cur)
            acc = warpgroup_mma(a, w_bufs.index(kt).permute((1, 0)), acc, is_async=True)
            if MODE == 2:
                acc_u = warpgroup_mma(a, w_bufs.index(KT + kt).permute((1, 0)), acc_u, is_async=True)
                acc, acc_u = warpgroup_mma_wait(2, deps=[acc, acc_u])
            else:
                acc = warpgroup_mma_wait(1, deps=[acc])
            nt = t + STAGES - 1  # its buffer held tile t - 1, whose wgmma is done
            if nt < total:
                nxt = nt % STAGES
                mbarrier.expect(bars.index(nxt), x_desc.block_type.nbytes)
                _tma_load(x_desc, [(nt // KT) * BM, (nt % KT) * BK], bars.index(nxt), a_bufs.index(nxt))
        if MODE == 2:
            acc, acc_u = warpgroup_mma_wait(0, deps=[acc, acc_u])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        rows = mt * BM + rows0
        ptrs = y_ptr + gl.expand_dims(rows.to(gl.int64), 1) * stride_y + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(rows < M, 1) & gl.expand_dims(cols < N_OUT, 0)
        if MODE == 1:
            r = gl.load(ptrs, mask=mask, other=0.0)
            out = (acc + r.to(gl.float32)).to(dt)
        elif MODE == 2:
            g = acc.to(dt).to(gl.float32)
            u = acc_u.to(dt).to(gl.float32)
            sg = (g / (1.0 + gl.exp(-g))).to(dt).to(gl.float32)
            out = (sg * u).to(dt)
        else:
            out = acc.to(dt)
        gl.store(ptrs, out, mask=mask)


def block_n(n_out: int, mode: int, sms: int = 132) -> int:
    """Rows a program owns: the largest power of two (8 to 64) that still leaves >= 3/4 of the SMs a
    program."""
    bn = 8
    while bn * 2 <= 64 and n_out // (bn * 2) >= sms * 3 // 4 and n_out % (bn * 2) == 0:
        bn *= 2
    return bn


def launch_args(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, mode: int, bn: int, stages: int,
                pdl_on: bool, bm: int = 64):  # fmt: skip
    """(grid, args, kwargs) of one launch."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    m, k = x.shape
    n_out = w.shape[0] // 2 if mode == 2 else w.shape[0]
    gdt = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    bk = BK.value
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], gdt))
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], gdt))
    warps = bm // 16
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, bn, 16])
    kwargs = dict(K=k, BM=bm, BN=bn, STAGES=stages, MODE=mode, PDL=pdl_on, ACC=acc, num_warps=warps)
    if pdl_on:
        kwargs["launch_pdl"] = True
    return (n_out // bn,), (x_desc, w_desc, y, m, y.stride(0), n_out), kwargs


def ws_linear(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None = None, mode: int = 0,
              bn: int | None = None, stages: int = 4, pdl_on: bool = False,
              bm: int | None = None) -> torch.Tensor:  # fmt: skip
    """MODE 0: x @ w^T; 1: y += x @ w^T (y given); 2: silu(x @ gate^T) * (x @ up^T), w = [gate; up]."""
    m, k = x.shape
    n_out = w.shape[0] // 2 if mode == 2 else w.shape[0]
    if k % BK.value or w.shape[1] != k or not x.is_contiguous() or not w.is_contiguous():
        raise ValueError("ws_linear: contiguous x (M, K) and w (N, K), K a multiple of 64")
    if y is None:
        y = torch.empty((m, n_out), dtype=x.dtype, device=x.device)
    bn = bn or block_n(n_out, mode)
    if n_out % bn:
        raise ValueError(f"ws_linear: {n_out} output columns do not split in blocks of {bn}")
    bm = bm or (64 if m <= 64 else 128)
    shared = (2 if mode == 2 else 1) * bn * k * 2 + stages * bm * BK.value * 2
    if shared > SHARED_LIMIT:
        raise ValueError(f"ws_linear: {shared} bytes of shared memory (BN {bn}, K {k})")
    grid, args, kwargs = launch_args(x, w, y, mode, bn, stages, pdl_on, bm)
    _ws_gemm_kernel[grid](*args, **kwargs)
    return y
