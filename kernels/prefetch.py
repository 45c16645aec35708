"""Asking L2 for bytes a later kernel (or a later stage) will read, while DRAM would otherwise idle.

A kernel bound by latency rather than bytes (batch-1 decode attention, a stage of the layer tail
waiting at its barrier) leaves most of the H200's bandwidth unused; the weights the next kernel reads
first can be requested then (PTX `prefetch.global.L2::evict_last`: nothing waits for it, and the lines
are the last L2 evicts). Compiled only: Triton's interpreter has no inline PTX, so launchers pass
lanes = 0 there.
"""

from __future__ import annotations

import triton
import triton.language as tl

LINE_BYTES = 128


@triton.jit
def prefetch_l2(ptr, first, count, LANES: tl.constexpr):
    """Asks L2 for elements [first, first + count) of ptr's buffer (contiguous), one 128-byte line per
    lane; LANES (a power of two) >= their lines. count <= 0: nothing."""
    per_line: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth
    offs = tl.arange(0, LANES) * per_line
    offs = tl.where(offs < count, offs, 0)  # lanes past the end repeat the first line
    if count > 0:
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1]; // $0", "=r,l", [ptr + first + offs], dtype=tl.int32,
            is_pure=False, pack=1,
        )  # fmt: skip


def lanes(numel: int, element_size: int) -> int:
    """prefetch_l2's LANES for numel contiguous elements: their 128-byte lines, to a power of two."""
    return triton.next_power_of_2(max(1, triton.cdiv(numel * element_size, LINE_BYTES)))


def share(numel: int, element_size: int, programs: int) -> tuple[int, int]:
    """(elements per program, lanes) for `programs` programs that each ask for one contiguous share of
    a numel-element buffer, whole lines each."""
    per_line = LINE_BYTES // element_size
    per = triton.cdiv(triton.cdiv(numel, per_line), max(1, programs)) * per_line
    return per, lanes(per, element_size)
