"""store_kv vs kernels.reference.store_kv, and the reference block gather."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.kv_cache import store_kv
from tests.kernels.paged import gpu


def _run(dtype, block_size, device="cpu", strided=False):
    gen = torch.Generator().manual_seed(1)
    n, hk, d, nb = 6, 2, 16, 5
    if strided:
        # k, v as views into a fused qkv output: (n, (4 + 2 * hk) * d)
        qkv = torch.randn(n, 4 + 2 * hk, d, generator=gen).to(dtype).to(device)
        k, v = qkv[:, 4 : 4 + hk], qkv[:, 4 + hk :]
    else:
        k = torch.randn(n, hk, d, generator=gen).to(dtype).to(device)
        v = torch.randn(n, hk, d, generator=gen).to(dtype).to(device)
    # padding slots (-1) in the middle and at the end; slots spread over several blocks
    slots = torch.tensor([3, -1, block_size + 1, 4 * block_size - 1, 0, -1], device=device)
    caches = [torch.randn(nb, block_size, hk, d, generator=gen).to(dtype).to(device) for _ in range(2)]
    expect = [c.clone() for c in caches]
    store_kv(k, v, caches[0], caches[1], slots)
    ref.store_kv(k, v, expect[0], expect[1], slots)
    return caches, expect


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("strided", [False, True])
def test_store_kv_matches_reference(dtype, block_size, strided):
    caches, expect = _run(dtype, block_size, strided=strided)
    assert torch.equal(caches[0], expect[0]) and torch.equal(caches[1], expect[1])


def test_store_kv_int32_slots_and_empty():
    k = torch.randn(2, 1, 8)
    kc, vc = torch.zeros(2, 16, 1, 8), torch.zeros(2, 16, 1, 8)
    store_kv(k, k, kc, vc, torch.tensor([17, -1], dtype=torch.int32))
    assert torch.equal(kc[1, 1], k[0]) and kc.abs().sum() == k[0].abs().sum()
    store_kv(k[:0], k[:0], kc, vc, torch.zeros(0, dtype=torch.int64))


def test_store_kv_rejects_bad_shapes():
    k = torch.randn(2, 1, 8)
    with pytest.raises(ValueError):
        store_kv(k, k, torch.zeros(2, 16, 2, 8), torch.zeros(2, 16, 2, 8), torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        store_kv(k, k, torch.zeros(2, 16, 1, 8), torch.zeros(2, 16, 1, 8), torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@gpu
def test_gpu_store_kv(dtype):
    caches, expect = _run(dtype, 16, "cuda", strided=True)
    assert torch.equal(caches[0], expect[0]) and torch.equal(caches[1], expect[1])


def test_gather_blocks_equals_advanced_indexing():
    """The CPU path's block gather (one index_select over whole blocks) returns what cache[blocks]
    does, for a block table and for one sequence's row, and gather_kv cuts it at the length."""
    cache = torch.randn(9, 16, 2, 8)
    table = torch.tensor([[3, 0, 7], [8, 8, 1]], dtype=torch.int32)
    assert torch.equal(ref.gather_blocks(cache, table), cache[table.long()])
    assert torch.equal(ref.gather_blocks(cache, table[1]), cache[table[1].long()])
    assert torch.equal(ref.gather_kv(cache, table[0], 40), cache[table[0].long()].reshape(48, 2, 8)[:40])
