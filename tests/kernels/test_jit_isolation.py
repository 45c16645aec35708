"""An interpreted launch leaves triton.language as it found it: a compiled kernel built later in the same
process (a CUDA machine running the CPU cases and the GPU cases together) sees Triton's own functions."""

from __future__ import annotations

import torch
import triton.language as tl

from kernels.rmsnorm import rms_norm


def _attributes() -> dict[tuple[str, str], object]:
    owners = {"tl": tl, "tl.core": tl.core, "tl.math": tl.math, "tl.tensor": tl.core.tensor}
    return {(label, name): value for label, owner in owners.items() for name, value in vars(owner).items()}


def test_interpreted_launch_restores_triton_language():
    before = _attributes()
    x = torch.randn(3, 64)
    out = rms_norm(x, torch.ones(64), 1e-6)  # calls tl.sum, a device function, from the interpreter
    torch.testing.assert_close(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    after = _attributes()
    changed = sorted(
        f"{label}.{name}"
        for key, value in before.items()
        if after.get(key) is not value
        for label, name in [key]
    )
    assert changed == [], f"left patched by the interpreter: {changed[:10]}"
