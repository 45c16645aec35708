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


@pytest.mark.slow  # ~1 min with a cold Triton cache on the 2-core host (make test runs it)
def test_kernels_compile_for_sm90():
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")):
        pytest.skip("triton's NVIDIA backend (ptxas) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the launches in two processes at once, every other one each: each compile is one core's work
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.kernels.compile_sm90", "--shard", f"{i}/2"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [run.communicate(timeout=600) for run in runs]
    for run, (out, err) in zip(runs, outs, strict=True):
        assert run.returncode == 0, out + err[-3000:]
        assert out.count("ok ") >= 6, out
    assert sum(out.count("ok ") for out, _ in outs) >= 12
