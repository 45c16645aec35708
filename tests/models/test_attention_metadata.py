"""AttentionMetadata.decode_order: the decode rows longest first, decided and sorted once per step,
only where the decode kernel takes an order."""

from __future__ import annotations

import torch

from kernels import dispatch
from models import attention
from models.attention import AttentionMetadata


def _meta(lens: list[int]) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.arange(len(lens)),
        num_decodes=len(lens),
        decode_block_tables=torch.zeros((len(lens), 4), dtype=torch.int32),
        decode_seq_lens=torch.tensor(lens, dtype=torch.int32),
        prefill_block_tables=None,
        prefill_cu_seqlens_q=None,
        prefill_seq_lens=None,
    )


def test_no_order_without_triton_kernels():
    meta = _meta([5, 9, 1])
    assert meta.decode_order(2) is None  # CPU tensors take the torch reference path
    assert dispatch.decode_order(torch.tensor([5, 9, 1], dtype=torch.int32), 2) is None


def test_order_is_longest_first_and_decided_once(monkeypatch):
    from kernels import decode_launch as dl

    asked = []

    def decode_order(seq_lens, hk):  # dispatch.decode_order as on a GPU that takes batches >= 3
        asked.append((seq_lens.shape[0], hk))
        return dl.longest_first(seq_lens) if seq_lens.shape[0] >= 3 else None

    monkeypatch.setattr(attention.ops, "decode_order", decode_order)
    meta = _meta([5, 9, 1, 7])
    order = meta.decode_order(2)
    assert order.dtype == torch.int32 and order.tolist() == [1, 3, 0, 2]
    assert meta.decode_order(2) is order  # every layer of the step shares the sort
    assert asked == [(4, 2)]
    narrow = _meta([5, 9])
    assert narrow.decode_order(2) is None and narrow.decode_order(2) is None  # a batch taken unordered
    assert asked == [(4, 2), (2, 2)]  # ... decided once too
    empty = _meta([])
    empty.num_decodes, empty.decode_seq_lens = 0, None
    assert empty.decode_order(2) is None
    assert len(asked) == 2
