"""apply_token_bitmask_ vs kernels.reference.apply_token_bitmask_."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.bitmask import apply_token_bitmask_
from tests.kernels.paged import gpu


def _case(batch, vocab, device="cpu", dtype=torch.float32, extra_words=0):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(batch, vocab, generator=gen).to(dtype).to(device)
    words = (vocab + 31) // 32 + extra_words
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, words), generator=gen, dtype=torch.int32)
    bitmask[0] = -1  # all allowed
    if batch > 1:
        bitmask[1] = 0  # none allowed
    return logits, bitmask.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("vocab", [32, 100, 1500])  # 100 and 1500: not multiples of 32
def test_bitmask_matches_reference(dtype, vocab):
    logits, bitmask = _case(3, vocab, dtype=dtype)
    expect = logits.clone()
    ref.apply_token_bitmask_(expect, bitmask)
    apply_token_bitmask_(logits, bitmask)
    assert torch.equal(logits, expect)
    assert torch.isinf(logits[1]).all() and not torch.isinf(logits[0]).any()


def test_bitmask_indices_and_wider_mask():
    logits, bitmask = _case(4, 77, extra_words=2)
    expect = logits.clone()
    ref.apply_token_bitmask_(expect, bitmask[:, :3])
    got = logits.clone()
    apply_token_bitmask_(got, bitmask, indices=torch.tensor([3, 1], dtype=torch.int32))
    assert torch.equal(got[[1, 3]], expect[[1, 3]])
    assert torch.equal(got[[0, 2]], logits[[0, 2]])  # rows not listed are untouched


def test_bitmask_rejects_short_mask():
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.randn(1, 65), torch.zeros(1, 2, dtype=torch.int32))


@gpu
def test_gpu_bitmask():
    for vocab in (151_936, 1000):
        logits, bitmask = _case(8, vocab, "cuda", torch.bfloat16)
        expect = logits.clone()
        ref.apply_token_bitmask_(expect, bitmask)
        apply_token_bitmask_(logits, bitmask)
        assert torch.equal(logits, expect)
