"""The capture ladder's bookkeeping on the CPU (CUDA's graph API replaced by a recorder): every
size is run once outside and once inside its capture, largest first, all in the first pool; a
batch pads up to the next captured size."""

from __future__ import annotations

import contextlib

import torch

from engine import cuda_graphs
from engine.cuda_graphs import capture_ladder, padded_size
from tests.engine.graph_stubs import Model, stub_graphs


def test_capture_ladder(monkeypatch):
    events = []
    state = {"capturing": None}

    @contextlib.contextmanager
    def graph(g, pool=None):
        state["capturing"] = (g, pool)
        yield
        state["capturing"] = None

    stub_graphs(monkeypatch)  # graphs named pool1, pool2, ... in the order they are made
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))

    def forward(n):
        cap = state["capturing"]
        events.append(("captured" if cap else "eager", n, cap[1] if cap else None))
        return torch.full((n,), float(n))

    graphs = capture_ladder([1, 4, 2], forward, "test", prepare=lambda n: events.append(("prepare", n)))
    runs = [e for e in events if e != "sync"]
    assert runs == [
        ("prepare", 4), ("eager", 4, None), ("captured", 4, None),
        ("prepare", 2), ("eager", 2, None), ("captured", 2, "pool1"),
        ("prepare", 1), ("eager", 1, None), ("captured", 1, "pool2"),
    ]  # fmt: skip
    assert sorted(graphs) == [1, 2, 4]
    assert all(torch.equal(out, torch.full((n,), float(n))) for n, (_, out) in graphs.items())
    assert events[-1] == "sync"


def test_padded_size():
    sizes = cuda_graphs.default_sizes(40)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 40
    assert padded_size(sizes, 3) == 4 and padded_size(sizes, 17) == 24 and padded_size(sizes, 40) == 40
    assert padded_size(sizes, 41) is None
    assert cuda_graphs.default_extend_sizes(100) == [16, 32, 64]


def test_graph_inputs_are_loaded_and_padded(monkeypatch):
    # run() copies a step's inputs into the captured graph's static buffers: the padding rows/tokens
    # up to the captured size write no K/V (slot -1) and decode rows attend to nothing (length 0);
    # a decode step's tokens and lengths are already there (prepare), run() adds the block tables
    replays = stub_graphs(monkeypatch)
    cpu = torch.device("cpu")
    dec = cuda_graphs.DecodeGraphs(Model(), [], [1, 4], 6, cpu)
    # the static inputs are views of two buffers that prepare fills (tests/engine/test_prepare.py)
    assert dec.slot_mapping.tolist() == [-1] * 4 and dec.input_ids.data_ptr() == dec.inputs64.data_ptr()
    assert dec.seq_lens.data_ptr() == dec.inputs32.data_ptr() and dec.inputs32.numel() == 4 + 4 * 6
    logits = dec.run(3, torch.ones((3, 2), dtype=torch.int32))  # padded to the graph of 4
    assert logits.shape == (3, 10) and replays == [dec.graphs[4][0].name]
    assert dec.block_tables[:3, :2].tolist() == [[1, 1]] * 3 and dec.block_tables[3].tolist() == [0] * 6
    # a step not prepared in place (model_runner.GRAPH_INPUTS_IN_PLACE off) is copied in by load()
    dec.slot_mapping.fill_(99)
    dec.seq_lens.fill_(99)
    ids = torch.tensor([5, 6, 7])
    dec.load(ids, ids + 10, ids + 20, ids.int())
    assert dec.input_ids[:3].tolist() == [5, 6, 7] and dec.positions[:3].tolist() == [15, 16, 17]
    assert dec.slot_mapping.tolist() == [25, 26, 27, -1] and dec.seq_lens.tolist() == [5, 6, 7, 0]
    # the sampler replays its graph on the whole buffer that run() returned the leading rows of
    assert dec.static_output(logits) is dec.graphs[4][1]
    assert dec.static_output(logits.clone()) is None and dec.static_output(torch.zeros(9, 10)) is None

    ext = cuda_graphs.ExtendGraphs(Model(), [], [16, 32], 6, cpu)
    ext.slot_mapping.fill_(99)
    n = torch.arange(20)
    ext.run(
        n, n + 100, n + 200, torch.ones((1, 3), dtype=torch.int32), torch.tensor([0, 20]), torch.tensor([120])
    )
    assert ext.input_ids[:20].tolist() == list(range(20)) and ext.positions[19].item() == 119
    assert (
        ext.slot_mapping[:20].tolist() == list(range(200, 220))
        and ext.slot_mapping[20:].tolist() == [-1] * 12
    )
    assert ext.last_row.item() == 19 and ext.seq_len.tolist() == [120] and ext.replays == 1
