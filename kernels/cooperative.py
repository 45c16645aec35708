"""Grid-barrier launches (kernels.decode_tail, kernels.decode_tail_tma): every program of the grid must
be resident at once, or one waiting at a barrier would wait for a program that never starts.

`grid_kwargs`: the launch option that makes the driver refuse a grid that cannot be resident, where this
Triton has it. `resident`: a config's programs per SM lowered until the compiled kernel's registers,
threads and shared memory let that many share an SM.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

# the fused grid is launched cooperatively where this Triton can (residency guaranteed)


@functools.cache
def _cooperative_supported() -> bool:
    import dataclasses

    from triton.backends.nvidia.compiler import CUDAOptions

    return any(f.name == "launch_cooperative_grid" for f in dataclasses.fields(CUDAOptions))


def grid_kwargs() -> dict:
    """launch_cooperative_grid where this Triton offers it, else nothing."""
    return {"launch_cooperative_grid": True} if _cooperative_supported() else {}


_RESIDENT: dict[tuple, NamedTuple] = {}
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048


def resident(kern, key: tuple, cfg: NamedTuple, launch, extra: dict) -> NamedTuple:
    """cfg with programs_per_sm lowered until the compiled kernel's registers, threads and shared memory
    let that many programs share an SM (a cooperative launch refuses a grid that is not resident).
    launch(cfg) -> (programs, args, constexprs); kern is compiled with FIRST=1 (its one-launch form)."""
    if key in _RESIDENT:
        return _RESIDENT[key]
    chosen = cfg._replace(programs_per_sm=1)
    for pps in range(cfg.programs_per_sm, 0, -1):
        c = cfg._replace(programs_per_sm=pps)
        programs, args, consts = launch(c)
        compiled = kern.warmup((programs,), *args, FIRST=1, **consts, **extra)
        compiled._init_handles()
        warps = compiled.metadata.num_warps
        per_warp = -(-compiled.n_regs * 32 // 256) * 256  # registers are allocated per warp, by 256
        props = torch.cuda.get_device_properties(args[0].device)
        smem = getattr(props, "shared_memory_per_multiprocessor", 228 << 10)
        fit = min(REGISTERS_PER_SM // per_warp // warps, THREADS_PER_SM // (32 * warps))
        if compiled.metadata.shared:
            fit = min(fit, smem // (compiled.metadata.shared + 1024))
        if fit >= pps:
            chosen = c
            break
    _RESIDENT[key] = chosen
    return chosen
