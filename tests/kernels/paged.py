"""Helpers for paged-attention tests: a shuffled block pool with per-sequence block tables."""

from __future__ import annotations

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def gpu(fn):
    """Marks a test `gpu` and skips it without CUDA."""
    return pytest.mark.gpu(requires_cuda(fn))


# tolerances (max abs error vs the reference)
ATOL = {torch.float32: 2e-5, torch.float16: 5e-3}
GPU_ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def make_paged(
    ctx_lens: list[int],
    q_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str = "cpu",
    seed: int = 0,
    spare_blocks: int = 3,
):
    """Returns q (sum(q_lens), H, D), k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens; the
    blocks of all sequences are a random permutation of the pool, so table order matters."""
    gen = torch.Generator().manual_seed(seed)
    need = [(c + block_size - 1) // block_size for c in ctx_lens]
    num_blocks = sum(need) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(need) + 1
    tables = torch.zeros(len(ctx_lens), max_blocks, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = perm[used : used + n]
        used += n
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=gen).to(dtype)
    seq_lens = torch.tensor(ctx_lens, dtype=torch.int32)
    return [t.to(device) for t in (q, k_cache, v_cache, tables, cu, seq_lens)]


def alibi_slopes(num_heads: int, device: str = "cpu") -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / num_heads) for i in range(num_heads)], device=device)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def capture(fn):
    """(graph, fn's result): fn captured in a CUDA graph on a side stream, not yet replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out
