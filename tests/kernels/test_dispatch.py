"""kernels.dispatch: reference on the CPU, Triton on CUDA, CHATLOOM_KERNELS=torch, no triton needed."""

from __future__ import annotations

import subprocess
import sys

import torch

from kernels import dispatch
from kernels import reference as ref
from tests.kernels.paged import gpu, make_paged, max_err


def test_cpu_tensors_use_the_reference():
    assert dispatch.backend(torch.zeros(1)) == "torch"
    q, kc, vc, bt, cu, sl = make_paged([20, 9], [4, 9], 4, 2, 16, 16, torch.float32)
    out = dispatch.paged_attention(q, kc, vc, bt, cu, sl, 0.25)
    assert torch.equal(out, ref.paged_attention(q, kc, vc, bt, cu, sl, 0.25))
    buf = torch.empty_like(q)
    assert dispatch.paged_attention(q, kc, vc, bt, cu, sl, 0.25, out=buf) is buf and torch.equal(buf, out)
    x, res, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    x0, res0 = x.clone(), res.clone()
    dispatch.fused_add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(x, x0) and torch.equal(res, res0)  # the CPU path is pure


def test_cpu_bitmask_with_indices():
    logits = torch.randn(3, 40)
    mask = torch.zeros(3, 2, dtype=torch.int32)
    got = logits.clone()
    dispatch.apply_token_bitmask_(got, mask, torch.tensor([2]))
    assert torch.isinf(got[2]).all() and torch.equal(got[:2], logits[:2])


def test_dispatch_imports_and_runs_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, kernels.dispatch as d\n"
        "assert not d.triton_available()\n"
        "print(d.silu_and_mul(torch.randn(2, 8)).shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([2, 4])" in done.stdout


@gpu
def test_gpu_dispatch_picks_triton_and_env_forces_torch(monkeypatch):
    x = torch.randn(4, 64, device="cuda")
    assert dispatch.backend(x) == "triton"
    monkeypatch.setenv("CHATLOOM_KERNELS", "torch")
    assert dispatch.backend(x) == "torch"
    monkeypatch.delenv("CHATLOOM_KERNELS")
    q, kc, vc, bt, cu, sl = make_paged([300, 64], [1, 1], 16, 8, 128, 16, torch.bfloat16, "cuda")
    out = dispatch.decode_attention(q, kc, vc, bt, sl, 128**-0.5)
    expect = ref.decode_attention(q.float(), kc.float(), vc.float(), bt, sl, 128**-0.5)
    assert max_err(out, expect) < 2e-2
    pre = dispatch.paged_attention(q, kc, vc, bt, cu, sl, 128**-0.5)
    assert max_err(pre, expect) < 2e-2
    qkv = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    heads = qkv[:, :16]  # Qwen3's per-head q norm on a strided (tokens, heads, head_dim) view
    assert max_err(dispatch.rms_norm(heads, w, 1e-6), ref.rms_norm(heads, w, 1e-6)) < 3e-2
