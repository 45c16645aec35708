"""AttentionMetadata.decode_order: the decode rows longest first, sorted once per step, only where the
decode kernel takes an order."""

from __future__ import annotations

import torch

from engine import attention
from engine.attention import AttentionMetadata


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
    assert meta.decode_order(2, torch.zeros(1)) is None  # CPU tensors take the torch reference path


def test_order_is_longest_first_and_computed_once(monkeypatch):
    asked = []
    monkeypatch.setattr(
        attention.ops, "decode_wants_order", lambda batch, hk, like: asked.append((batch, hk)) or batch >= 3
    )
    meta = _meta([5, 9, 1, 7])
    order = meta.decode_order(2, torch.zeros(1))
    assert order.dtype == torch.int32 and order.tolist() == [1, 3, 0, 2]
    assert meta.decode_order(2, torch.zeros(1)) is order  # every layer of the step shares the sort
    assert asked == [(4, 2), (4, 2)]
    assert _meta([5, 9]).decode_order(2, torch.zeros(1)) is None  # a batch the kernel takes unordered
    empty = _meta([])
    empty.num_decodes, empty.decode_seq_lens = 0, None
    assert empty.decode_order(2, torch.zeros(1)) is None
