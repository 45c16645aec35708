"""kernels.order.longest_first against reference.longest_first (descending length, ties by index)."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.order import longest_first


@pytest.mark.parametrize("batch", [1, 3, 64, 65, 200])
def test_rank_order_matches_the_stable_sort(batch):
    g = torch.Generator().manual_seed(batch)
    lens = torch.randint(0, 12, (batch,), generator=g, dtype=torch.int32)  # many ties
    got = longest_first(lens)
    assert got.dtype == torch.int32
    assert got.tolist() == ref.longest_first(lens).tolist()
    assert sorted(got.tolist()) == list(range(batch))  # a permutation


def test_distinct_lengths_and_empty_batch():
    assert longest_first(torch.tensor([5, 9, 1, 7], dtype=torch.int32)).tolist() == [1, 3, 0, 2]
    assert longest_first(torch.zeros(0, dtype=torch.int32)).shape == (0,)
    with pytest.raises(ValueError, match="int32"):
        longest_first(torch.tensor([1, 2]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_rank_order_in_a_cuda_graph():
    lens = torch.randint(1, 4096, (256,), dtype=torch.int32, device="cuda")
    lens[::7] = lens[0]  # ties
    out = longest_first(lens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = longest_first(lens)
    lens.copy_(torch.randint(1, 4096, (256,), dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == ref.longest_first(lens.cpu()).tolist()
