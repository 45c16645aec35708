"""ModelRunner.prepare builds exactly the step tensors of the plain per-token rule (written out
below), over random scheduled batches: chunked prefills, decodes, tokens still in flight (patched
from the previous step's sampled ids), finishes and preemptions."""

from __future__ import annotations

import random

import pytest
import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.scheduler import Scheduler
from runner.model_runner import ModelRunner
from runner.sampling_params import SamplingParams
from runner.sequence import PENDING, Sequence


def bare_runner(block_size: int, max_num_seqs: int) -> ModelRunner:
    runner = ModelRunner.__new__(ModelRunner)  # prepare needs no model
    runner.block_size = block_size
    runner.device = torch.device("cpu")
    runner.config = EngineConfig(block_size=block_size, max_num_seqs=max_num_seqs)
    return runner


def expected(batch, bs: int, pending: torch.Tensor | None) -> dict:
    ids, pos, slots, rows = [], [], [], []
    nd = batch.num_decodes
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        start = seq.num_computed_tokens
        for p in range(start, start + n):
            tok = seq.token_ids[p]
            ids.append(int(pending[seq.pending_row]) if tok == PENDING else tok)
            pos.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
        if start + n == seq.num_tokens:
            rows.append(len(ids) - 1)

    def table(seqs):
        width = max(len(s.block_table) for s in seqs)
        return [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]

    dec, pre, q = batch.seqs[:nd], batch.seqs[nd:], batch.num_new_tokens[nd:]
    out = dict(ids=ids, pos=pos, slots=slots, rows=rows)
    if dec:
        out.update(dec_table=table(dec), dec_lens=[s.num_computed_tokens + 1 for s in dec])
    if pre:
        cu = [0]
        for n in q:
            cu.append(cu[-1] + n)
        lens = [s.num_computed_tokens + n for s, n in zip(pre, q, strict=True)]
        out.update(pre_table=table(pre), cu=cu, pre_lens=lens)
    return out


def graph_runner(block_size: int, max_num_seqs: int, monkeypatch, mapped: bool = False) -> ModelRunner:
    """bare_runner with decode graphs for batch sizes 1, 2 and 4 (CUDA's graph API stubbed: a replay
    only records itself), so prepare writes decode-only steps into their static buffers; mapped: with
    step graphs, which read their inputs from host rings."""
    from runner import cuda_graphs
    from tests.runner.graph_stubs import Model, stub_graphs

    stub_graphs(monkeypatch)
    runner = bare_runner(block_size, max_num_seqs)
    seed = 0 if mapped else None
    runner.graphs = cuda_graphs.DecodeGraphs(
        Model(), [], [1, 2, 4], 16, torch.device("cpu"), seed, max_num_seqs
    )
    return runner


def _mapped_launch(g) -> None:
    """What a mapped step graph runs around its forward: the input launch, then the replay counted
    (device and host), as kernels.publish and run_step do."""
    from kernels import dispatch as ops

    ops.mapped_step_inputs(
        g.host64, g.host32, g.published, g.inputs64, g.seq_lens, g.block_tables, g.tokens, 4
    )
    g.published += 1
    g.step_replays += 1


@pytest.mark.parametrize("mode", ["eager", "graphs", "mapped"])
def test_prepare_matches_the_per_token_rule(mode, monkeypatch):
    """With decode graphs, decode-only batches they take are prepared into their static buffers; with
    mapped step graphs into a host ring row that the graph's first launch moves in."""
    rng = random.Random(0)
    bs = 4
    graphs = mode != "eager"
    sched = Scheduler(BlockManager(num_blocks=40, block_size=bs), max_num_seqs=8, max_num_batched_tokens=24)
    runner = graph_runner(bs, 8, monkeypatch, mode == "mapped") if graphs else bare_runner(bs, 8)
    in_graph = 0
    sampled: torch.Tensor | None = None  # the previous step's sampled ids
    inflight: list[tuple[Sequence, int, int]] = []  # (seq, position, row in sampled)
    steps = 0
    for step in range(300):
        if rng.random() < 0.3:
            prompt = [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
            sched.add(Sequence(f"r{step}", prompt, SamplingParams(max_tokens=rng.randint(1, 30))))
        batch = sched.schedule()
        if not batch:
            continue
        steps += 1
        want = expected(batch, bs, sampled)
        mapped = mode == "mapped" and runner._decode_graph_takes(
            len(batch.seqs), batch.num_decodes < len(batch.seqs)
        )
        step_inputs = runner.prepare(batch, sampled, mapped=mapped)
        ids, pos, meta, rows_t, sampling = step_inputs[:5]
        if step_inputs.in_graph:  # a decode-only batch of <= 4: the graph's buffers, padded to 4
            in_graph += 1
            g, nd = runner.graphs, len(batch.seqs)
            if mapped:
                _mapped_launch(g)
            else:
                g.finish_inputs(4)  # what each decode graph launches first
            assert ids.data_ptr() == g.input_ids.data_ptr() and meta.num_decodes == nd
            assert g.slot_mapping[nd:].tolist() == [-1] * (4 - nd)
            assert g.seq_lens[nd:].tolist() == [0] * (4 - nd)
            assert meta.decode_seq_lens.data_ptr() == g.seq_lens.data_ptr()
            assert g.block_tables[:nd, : meta.decode_block_tables.shape[1]].tolist() == want["dec_table"]
        assert ids.tolist() == want["ids"] and pos.tolist() == want["pos"]
        assert meta.slot_mapping.tolist() == want["slots"]
        assert rows_t.tolist() == want["rows"]
        assert sampling == [
            i for i, (s, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
            if s.num_computed_tokens + n == s.num_tokens
        ]  # fmt: skip
        assert meta.num_decodes == batch.num_decodes
        if "dec_table" in want:
            assert meta.decode_block_tables.dtype == torch.int32
            assert meta.decode_block_tables.tolist() == want["dec_table"]
            assert meta.decode_seq_lens.tolist() == want["dec_lens"]
            assert meta.decode_max_seq_len == max(want["dec_lens"])
        else:
            assert meta.decode_block_tables is None
        if "pre_table" in want:
            assert meta.prefill_block_tables.tolist() == want["pre_table"]
            assert meta.prefill_cu_seqlens_q.tolist() == want["cu"]
            assert meta.prefill_seq_lens.tolist() == want["pre_lens"]
            assert meta.prefill_max_q == max(batch.num_new_tokens[batch.num_decodes :])
        else:
            assert meta.prefill_block_tables is None
        # the engine's order: sample this step (placeholders), read back the previous one, record K/V
        sampling = [
            s
            for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            if s.num_computed_tokens + n == s.num_tokens
        ]
        new = torch.randint(0, 1000, (max(len(sampling), 1),))
        launched = []
        for row, seq in enumerate(sampling):
            launched.append((seq, seq.num_tokens, row))
            seq.append_token(PENDING)
            seq.pending_row = row
            if seq.num_output_tokens >= seq.params.max_tokens:
                seq.done_scheduling = True
        for seq, p, row in inflight:
            if not seq.is_finished:
                seq.token_ids[p] = int(sampled[row])
                if seq.done_scheduling and p == seq.num_tokens - 1:  # its last token
                    sched.finish(seq)
                elif rng.random() < 0.03:  # a stop
                    del seq.token_ids[p + 1 :]
                    sched.finish(seq)
        sched.after_step(batch)
        sampled, inflight = new, launched
    assert steps > 100
    assert sched.num_preemptions > 0  # the pool is small: tables were freed and built again
    assert (in_graph > 50) == graphs


def test_a_prefill_chunk_ending_in_a_token_in_flight_is_patched():
    bs = 4
    sched = Scheduler(BlockManager(num_blocks=16, block_size=bs), max_num_seqs=4, max_num_batched_tokens=64)
    a = Sequence("a", [5, 6, 7], SamplingParams())
    b = Sequence("b", [8, 9, 10, 11, 12], SamplingParams())
    b.append_token(PENDING)
    b.pending_row = 2
    for s in (a, b):
        sched.add(s)
    batch = sched.schedule()
    ids, _, meta, rows, *_ = bare_runner(bs, 4).prepare(batch, torch.tensor([100, 101, 102]))
    assert ids.tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 102]
    # deferred: the in-flight token is filled in later (the previous step's sampling launches between)
    from runner.model_runner import _fill_pending

    later = bare_runner(bs, 4).prepare(batch, defer_pending=True)
    assert later.input_ids.tolist()[:8] == [5, 6, 7, 8, 9, 10, 11, 12]
    _fill_pending(later, torch.tensor([100, 101, 102]))
    assert later.input_ids.tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 102]
    assert rows.tolist() == [2, 8] and meta.prefill_cu_seqlens_q.tolist() == [0, 3, 9]
