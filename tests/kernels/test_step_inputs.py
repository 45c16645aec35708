"""kernels.step_inputs (Triton, through the interpreter on the CPU) against reference.decode_step_inputs:
random packed steps, tokens in flight and tables of several widths, rows past the step left alone."""

from __future__ import annotations

import pytest
import torch

from kernels import reference as ref
from kernels.step_inputs import decode_step_inputs


def _packed_step(n: int, rows: int, k: int, width: int, max_blocks: int, gen: torch.Generator):
    head = torch.randint(0, 1000, (5 * n + 4,), generator=gen)
    at = torch.randperm(rows, generator=gen)[:k]
    src = torch.randint(0, n, (k,), generator=gen)
    head[3 * n : 3 * n + 4] = torch.tensor([k, rows, width, 0])
    head[3 * n + 4 : 3 * n + 4 + 2 * k] = torch.cat([at, src])
    packed = torch.randint(0, 5000, (n + n * max_blocks,), generator=gen, dtype=torch.int32)
    table = torch.full((n, max_blocks), -7, dtype=torch.int32)
    tokens = torch.randint(100_000, 200_000, (n,), generator=gen)
    return head, packed, table, tokens


@pytest.mark.parametrize(
    ("n", "rows", "k", "width", "max_blocks"),
    [(1, 1, 1, 3, 8), (1, 1, 0, 1, 4), (4, 3, 2, 2, 6), (8, 8, 8, 200, 256), (16, 5, 0, 130, 300)],
)
def test_matches_the_reference(n, rows, k, width, max_blocks):
    gen = torch.Generator().manual_seed(n * 31 + k)
    head, packed, table, tokens = _packed_step(n, rows, k, width, max_blocks, gen)
    want_head, want_table = head.clone(), table.clone()
    ref.decode_step_inputs(want_head, packed, want_table, tokens, n)
    decode_step_inputs(head, packed, table, tokens, n)
    assert torch.equal(head, want_head) and torch.equal(table, want_table)
    # what the reference wrote, spelled out: the in-flight ids, the rows' tables, nothing else
    at, src = head[3 * n + 4 : 3 * n + 4 + k], head[3 * n + 4 + k : 3 * n + 4 + 2 * k]
    assert torch.equal(head[at], tokens[src])
    assert torch.equal(table[:rows, :width], packed[n : n + rows * width].view(rows, width))
    assert (table[rows:] == -7).all() and (table[:, width:] == -7).all()


def test_rejects_a_head_of_another_layout():
    table = torch.zeros((4, 8), dtype=torch.int32)
    with pytest.raises(ValueError, match="head"):
        decode_step_inputs(torch.zeros(20, dtype=torch.int64), torch.zeros(36, dtype=torch.int32), table,
                           torch.zeros(4, dtype=torch.int64), 4)  # fmt: skip


MAPPED_CASES = [(1, 1, 3, 0), (4, 3, 2, 5), (8, 8, 200, 2), (2, 1, 128, 1), (2, 2, 256, 3)]


@pytest.mark.parametrize(("n", "rows", "width", "slot"), MAPPED_CASES)
def test_mapped_inputs_match_the_reference(n, rows, width, slot):
    # the step is read from the ring row counter % slots: ids (from tokens where src >= 0), positions,
    # slots and lengths for every row of the graph, the block-table rows of the batch
    from kernels.step_inputs import mapped_step_inputs

    gen = torch.Generator().manual_seed(n + rows)
    max_blocks = 256
    host64 = torch.randint(0, 1000, (4, 4 * n + 4), generator=gen)
    host32 = torch.randint(0, 5000, (4, n + n * max_blocks), generator=gen, dtype=torch.int32)
    at = slot % 4
    src = torch.randint(-1, n, (n,), generator=gen)
    host64[at, 3 * n : 4 * n] = src
    host64[at, 4 * n : 4 * n + 2] = torch.tensor([rows, width])
    tokens = torch.randint(100_000, 200_000, (n,), generator=gen)
    outs = []
    for fn in (mapped_step_inputs, ref.mapped_step_inputs):
        head, lens = torch.full((5 * n + 4,), -9), torch.full((n,), -9, dtype=torch.int32)
        table = torch.full((n, max_blocks), -7, dtype=torch.int32)
        fn(host64, host32, torch.tensor([slot]), head, lens, table, tokens, n)
        outs.append((head, lens, table))
    (head, lens, table), want = outs
    assert all(torch.equal(a, b) for a, b in zip(outs[0], want, strict=True))
    h64, h32 = host64[at], host32[at]
    ids = torch.where(src >= 0, tokens[src.clamp(min=0)], h64[:n])
    assert torch.equal(head[:n], ids) and torch.equal(head[n : 3 * n], h64[n : 3 * n])
    assert (head[3 * n :] == -9).all() and torch.equal(lens, h32[:n])
    # row r's table at n + r * max_blocks (a fixed place: asked for before the width is known)
    assert torch.equal(table[:rows, :width], h32[n:].view(n, max_blocks)[:rows, :width])
    assert (table[rows:] == -7).all() and (table[:, width:] == -7).all()
