"""engine.overlap: a decode step's layers run as two halves give what the whole batch gives (on the CPU
the halves run one after the other: the row slicing and the join are what is checked here; the GPU's
streams in tests/engine/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from engine import overlap
from engine.attention import AttentionMetadata
from engine.models.loader import build_model, load_hf_config

BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from engine.models.tiny import build_checkpoint

    path = build_checkpoint(tmp_path_factory.mktemp("overlap"), "qwen3", vocab_size=512)
    config = load_hf_config(str(path))
    return build_model(config, "auto", str(path), "cpu", torch.float32, 256, 0)


def _step(model, lens: list[int], seed: int = 0):
    """Random caches holding len - 1 keys per sequence and a decode step's inputs for one new token each."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    per_seq = max(lens) // BLOCK + 1
    shape = (len(lens) * per_seq, BLOCK, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in model.layers]
    tables = torch.randperm(shape[0], generator=g).view(len(lens), per_seq).int()
    pos = torch.tensor(lens) - 1
    slots = tables.long().gather(1, (pos // BLOCK)[:, None])[:, 0] * BLOCK + pos % BLOCK
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=len(lens), decode_block_tables=tables,
        decode_seq_lens=torch.tensor(lens, dtype=torch.int32), prefill_block_tables=None,
        prefill_cu_seqlens_q=None, prefill_seq_lens=None,
    )  # fmt: skip
    ids = torch.randint(0, 512, (len(lens),), generator=g)
    return ids, pos, caches, meta


@pytest.mark.parametrize("lens", [[5, 17, 9, 30, 2], [8, 3]])
@pytest.mark.parametrize("final_norm", [True, False])
def test_halves_equal_the_whole_batch(model, lens, final_norm):
    ids, pos, caches, meta = _step(model, lens)
    twin = [(k.clone(), v.clone()) for k, v in caches]
    with torch.inference_mode():
        want = model(ids, pos, caches, meta, final_norm)
        got = overlap.overlapped_forward(model, ids, pos, twin, meta, final_norm, None)
    want, got = (want, got) if final_norm else (torch.cat(want), torch.cat(got))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (k0, v0), (k1, v1) in zip(caches, twin, strict=True):  # each half stored its new K/V
        torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-5)
    assert not torch.equal(caches[0][0], _step(model, lens)[2][0][0])  # the step did store new K/V


def test_decode_rows_slices_a_decode_only_step(model):
    _, _, _, meta = _step(model, [5, 17, 9, 30, 2])
    part = meta.decode_rows(2, 5)
    assert part.num_decodes == 3
    assert part.decode_seq_lens.tolist() == [9, 30, 2]
    assert torch.equal(part.decode_block_tables, meta.decode_block_tables[2:5])
    assert torch.equal(part.slot_mapping, meta.slot_mapping[2:5])
    with pytest.raises(ValueError, match="decode-only"):
        meta.decode_rows(0, 6)


def test_only_wide_cuda_graphs_overlap(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(overlap, "OVERLAP_MIN_BATCH", 64)
    assert overlap.overlaps(64, cuda) and overlap.overlaps(256, cuda)
    assert not overlap.overlaps(63, cuda) and not overlap.overlaps(256, cpu)
    monkeypatch.setattr(overlap, "OVERLAP_MIN_BATCH", 0)
    assert not overlap.overlaps(256, cuda)
