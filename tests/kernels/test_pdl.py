"""kernels.pdl: which launches ask for programmatic dependent launch (the H200 runs them; here the
choice and, in compile_sm90, the compiled instructions are checked)."""

from __future__ import annotations

import torch

from kernels import decode_launch as dl
from kernels import pdl
from kernels._jit import record_launches
from tests.kernels.paged import make_paged


def test_enabled_only_for_cuda_or_when_compiling_for_it(monkeypatch):
    cpu = torch.device("cpu")
    assert not pdl.enabled(cpu)  # the interpreter has no grid dependency control
    with record_launches():
        assert pdl.enabled(cpu) == pdl._supported_by_triton()
        monkeypatch.setattr(pdl, "PDL", False)
        assert not pdl.enabled(cpu)
    assert pdl.launch_kwargs(False) == {}
    assert pdl.launch_kwargs(True) == {"launch_pdl": True}


def test_decode_launch_asks_for_it_at_batch_one_or_after_a_release(monkeypatch):
    """Batch 1 follows the layer tail (kernels.decode_tail_tma), which lets it start early; a wider
    batch only after kernels.qkv_new_token (after_release), since cuBLAS does not."""
    q, kc, vc, bt, _, sl = make_paged([300, 64], [1, 1], 16, 8, 128, 16, torch.float16)
    with record_launches():
        one = dl.decode_launch(q[:1], kc, vc, bt[:1], sl[:1], 0.1, num_splits=8)
        two = dl.decode_launch(q, kc, vc, bt, sl, 0.1, num_splits=8)
    assert one.consts["PDL"] == pdl._supported_by_triton()
    assert not two.consts["PDL"]
    assert not dl.decode_launch(q[:1], kc, vc, bt[:1], sl[:1], 0.1, num_splits=8).consts["PDL"]  # CPU
    with record_launches():
        after = dl.decode_launch(q, kc, vc, bt, sl, 0.1, num_splits=1, after_release=True)
        off = dl.decode_launch(q, kc, vc, bt, sl, 0.1, num_splits=1)
    assert after.consts["PDL"] == pdl._supported_by_triton()
    assert not off.consts["PDL"]
