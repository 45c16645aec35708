"""Batch graphs on the CPU: a replay stands in for the captured forward (it runs the forward again on the
static buffers, which is what a replay computes), so the bookkeeping — the step's inputs written into
the buffers of its padded size, decodes as one-token chunks, tokens in flight copied in, the tile map,
the padding — must give exactly the eager engine's tokens."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from runner import batch_graphs as bg
from runner.host import Staging


class _Replay:
    def __init__(self, forward, n: int) -> None:
        self.forward, self.n = forward, n

    def replay(self) -> None:
        self.forward(self.n)


def _capture_by_rerun(sizes, forward, desc, prepare=None):
    graphs = {}
    for n in sorted(sizes, reverse=True):
        prepare(n)
        graphs[n] = (_Replay(forward, n), forward(n))
    return graphs


def _with_batch_graphs(llm: LLM, sizes: list[int], monkeypatch) -> bg.BatchGraphs:
    monkeypatch.setattr(bg, "capture_ladder", _capture_by_rerun)
    runner = llm.core.runner
    max_blocks = -(-runner.model.cos_sin.shape[0] // runner.block_size)
    seqs = llm.config.max_num_seqs
    device, dtype = runner.device, runner.dtype
    graphs = bg.BatchGraphs(
        runner.model, runner.kv_caches, sizes, seqs, max_blocks, runner.block_size, device, dtype
    )
    runner.batch_graphs = graphs
    return graphs


def test_default_batch_sizes():
    assert bg.default_batch_sizes(8192) == [
        16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192,
    ]  # fmt: skip
    assert bg.default_batch_sizes(100) == [16, 32, 64, 100]
    assert bg.default_batch_sizes(0) == []


@pytest.mark.parametrize("overlap", [False, True])
def test_batch_graph_steps_give_the_eager_tokens(tiny_qwen3, monkeypatch, overlap):
    rng = random.Random(5)
    ps = [[rng.randint(0, 10000) for _ in range(rng.randint(1, 90))] for _ in range(9)]
    params = [SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True) for i in range(len(ps))]
    # a small token budget: steps mix decodes with chunks of prompts, some cut mid-prompt
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=96, max_num_batched_tokens=48,
              async_scheduling=overlap)  # fmt: skip
    eager = LLM(tiny_qwen3, **kw).generate(ps, params)
    llm = LLM(tiny_qwen3, **kw)
    graphs = _with_batch_graphs(llm, [16, 32, 48], monkeypatch)
    steps = {"mixed": 0}
    schedule = llm.core.scheduler.schedule

    def counted():
        batch = schedule()
        steps["mixed"] += batch.num_decodes < len(batch.seqs)
        return batch

    llm.core.scheduler.schedule = counted
    ours = llm.generate(ps, params)
    assert [o.token_ids for o in ours] == [o.token_ids for o in eager]
    assert graphs.replays == steps["mixed"] > 3
    stats = llm.stats()
    assert stats["free_blocks"] == stats["total_blocks"]


def test_load_pads_the_step_to_its_size(tiny_qwen3, monkeypatch):
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=32, max_num_seqs=4)
    graphs = _with_batch_graphs(llm, [8, 16], monkeypatch)
    assert graphs.seqs(8) == 4 and graphs.tiles(8) == 1 + 4  # interpreter tiles of 16 queries
    # a decode (row 0, its token in flight: row 2 of the last draw) and a 10-token chunk
    ids = np.array([-1] + list(range(100, 110)), dtype=np.int64)
    pos, slots = np.arange(11, dtype=np.int64) + 5, np.arange(11, dtype=np.int64) + 50
    tables = np.array([[3, 4], [7, 0]], dtype=np.int32)
    got = graphs.load(
        Staging(torch.device("cpu")), ids, pos, slots, np.array([0, 10]), np.array([0, 2]),
        np.array([1, 10]), np.array([6, 15]), tables, 1,
    )  # fmt: skip
    assert got.size == 16 and got.input_ids.data_ptr() == graphs.inputs64.data_ptr()
    assert got.pending_at.tolist() == [0, 2]
    v = graphs._views(16)
    assert v["slots"].tolist() == list(range(50, 61)) + [-1] * 5
    assert v["rows"].tolist() == [0, 10, 0, 0]
    assert v["cu"].tolist() == [0, 1, 11, 11, 11] and v["lens"].tolist() == [6, 15, 0, 0]
    assert v["dec_lens"].tolist() == [6, 0, 0, 0]  # the decode attention's rows: the decode only
    assert v["tiles"].tolist() == [[1, -1, -1, -1, -1], [0, -1, -1, -1, -1]]  # the chunk's one tile
    assert graphs.block_tables[:2, :2].tolist() == [[3, 4], [7, 0]]
    with pytest.raises(ValueError, match="does not fit"):
        graphs.load(Staging(torch.device("cpu")), np.zeros(17, np.int64), *[np.zeros(17, np.int64)] * 2,
                    np.zeros(1, np.int64), np.zeros(0, np.int64), np.array([17]), np.array([17]),
                    np.zeros((1, 2), np.int32), 0)  # fmt: skip


def test_captures_longer_than_a_context_stay_inside_the_block_table(tiny_qwen3, monkeypatch):
    # one sequence a step and a 128-token graph over 64-token contexts: the capture's prompt is cut to
    # what a block-table row holds (the rest is padding), and real steps still replay it
    llm = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=1, max_model_len=64)
    graphs = _with_batch_graphs(llm, [16, 128], monkeypatch)
    assert graphs.max_len == 64 and graphs._views(128)["lens"].tolist() == [16]  # the last capture's
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ours = llm.generate([[7] * 40, [9] * 20], params)
    eager = LLM(tiny_qwen3, device="cpu", dtype="float32", num_kv_blocks=16, max_num_seqs=1, max_model_len=64)
    assert [o.token_ids for o in ours] == [o.token_ids for o in eager.generate([[7] * 40, [9] * 20], params)]
    assert graphs.replays == 2


def count_verifications(graphs: bg.BatchGraphs) -> list[bool]:
    """Wraps graphs.load: per step loaded, whether it has more logits rows than sequences (a chunk of
    proposals to verify)."""
    verified: list[bool] = []
    load = graphs.load

    def counted(staging, ids, pos, slots, rows, pending, q_lens, *rest):
        verified.append(rows.size > q_lens.size)
        return load(staging, ids, pos, slots, rows, pending, q_lens, *rest)

    graphs.load = counted
    return verified


def test_verification_steps_replay_batch_graphs(tiny_qwen3, monkeypatch):
    """Speculative decoding's steps (chunks ending in proposals, k + 1 logits rows each) replay the
    batch graphs and give the tokens of the engine without speculation."""
    from tests.engine.test_speculative import copy_prompts

    ps = copy_prompts(1)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=256, max_num_seqs=32)
    want = [o.token_ids for o in LLM(tiny_qwen3, **kw).generate(ps, params)]
    llm = LLM(tiny_qwen3, **kw, speculative_method="ngram")
    graphs = _with_batch_graphs(llm, [16, 32, 64], monkeypatch)
    verified = count_verifications(graphs)
    got = [o.token_ids for o in llm.generate(ps, params)]
    assert got == want
    s = llm.stats()
    assert s["spec_accepted_tokens"] > 0 and sum(verified) > 5 and graphs.replays == len(verified)
    assert s["free_blocks"] == s["total_blocks"]
