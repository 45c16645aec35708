"""Every kernel compiles for sm_90 (H100/H200) on a machine without a GPU, and the attention kernels
(bf16 and fp32) do not spill registers. Catches what the interpreter cannot: type errors of the compiled
dialect, unsupported constructs, tiles too large for the chip (see tests/kernels/compile_sm90.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~2.5 min with a cold Triton cache on the 2-core host (make test runs it)
def test_kernels_compile_for_sm90():
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")):
        pytest.skip("triton's NVIDIA backend (ptxas) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernels.compile_sm90"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count("ok ") >= 12, done.stdout
