"""The capture ladder's bookkeeping on the CPU (CUDA's graph API replaced by a recorder): every
size is run once outside and once inside its capture, largest first, all in the first pool; a
batch pads up to the next captured size."""

from __future__ import annotations

import contextlib

import torch

from kernels import dispatch as ops
from runner import cuda_graphs
from runner.cuda_graphs import capture_ladder, padded_size
from tests.runner.graph_stubs import Model, stub_graphs


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


def test_graph_inputs_are_finished_by_the_graphs_first_launch(monkeypatch):
    # prepare writes a decode step's tokens, lengths and block-table rows into the static buffers
    # (tests/runner/test_prepare.py); each graph first runs finish_inputs, which copies the table rows
    # into the graph's table and the tokens still in flight from `tokens` into the ids
    replays = stub_graphs(monkeypatch)
    cpu = torch.device("cpu")
    dec = cuda_graphs.DecodeGraphs(Model(), [], [1, 4], 6, cpu)
    assert dec.slot_mapping.tolist() == [-1] * 4 and dec.input_ids.data_ptr() == dec.inputs64.data_ptr()
    assert dec.seq_lens.data_ptr() == dec.inputs32.data_ptr() and dec.inputs32.numel() == 4 + 4 * 6
    assert dec.inputs64.numel() == 5 * 4 + 4 and dec.step_graphs == {}  # no sample_seed: no step graphs
    logits = dec.run(3)  # padded to the graph of 4
    assert logits.shape == (3, 10) and replays == [dec.graphs[4][0].name]
    dec.inputs64[:4] = torch.tensor([5, 6, 7, 0])
    dec.control.copy_(torch.tensor([2, 3, 2, 0]))  # two in flight, three rows of two blocks
    dec.inputs64[16:20] = torch.tensor([0, 2, 3, 1])  # ids[0] = tokens[3], ids[2] = tokens[1]
    dec.inputs32[4:10] = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32)
    dec.tokens.copy_(torch.tensor([40, 41, 42, 43]))
    dec.finish_inputs(4)
    assert dec.input_ids.tolist() == [43, 6, 41, 0]
    assert dec.block_tables[:3, :2].tolist() == [[1, 2], [3, 4], [5, 6]] and dec.block_tables[3].sum() == 0
    # the sampler replays its graph on the whole buffer that run() returned the leading rows of
    assert dec.static_output(logits) is dec.graphs[4][1]
    assert dec.static_output(logits.clone()) is None and dec.static_output(torch.zeros(9, 10)) is None


def test_step_graphs_sample_into_tokens(monkeypatch):
    replays = stub_graphs(monkeypatch)
    monkeypatch.setattr(cuda_graphs, "STEP_GRAPH_MAX_SIZE", 2)
    dec = cuda_graphs.DecodeGraphs(Model(), [], [1, 2, 4], 6, torch.device("cpu"), sample_seed=3)
    assert sorted(dec.step_graphs) == [1, 2] and dec.samples(2) and not dec.samples(3)
    # the captures ran the forward and the sampler: greedy rows of zero logits draw token 0, and the
    # seed advanced once per run (outside and inside each capture)
    assert dec.seed.item() == 3 + 4
    temps = torch.tensor([0.0])
    dec.tokens.fill_(9)
    out, host = dec.run_step(1, temps)
    assert out.data_ptr() == dec.tokens.data_ptr() and replays[-1] == dec.step_graphs[1][0].name
    assert host is not None and host.data_ptr() == dec.host_ring[0].data_ptr()  # the replay's ring row
    assert dec.temps[0].item() == 0.0
    dec.temps.fill_(5.0)
    dec.run_step(1, temps)  # the same temperatures tensor: not copied again
    assert dec.temps[0].item() == 5.0
    dec.run_step(1, torch.tensor([0.5]))
    assert dec.temps[0].item() == 0.5


def test_extend_graph_inputs_are_loaded_and_padded(monkeypatch):
    stub_graphs(monkeypatch)
    ext = cuda_graphs.ExtendGraphs(Model(), [], [16, 32], 6, torch.device("cpu"))
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


def test_step_graphs_publish_their_tokens_to_a_host_ring(monkeypatch):
    # the step graph's last launch writes its tokens into row `count % slots` of a
    # host ring (kernels.publish, its reference here); run_step hands out the row of its replay. The
    # stubbed replay runs nothing, so each step runs the graph's launches first (_step), with a draw
    # that writes a known value
    stub_graphs(monkeypatch)
    draw = {"value": 0}

    def step_end(x, residual, norm_weight, eps, weight, temps, seed, out, publish=None):
        out.fill_(draw["value"])  # the draw; then the rest of dispatch.lm_head_sample's step end
        seed.add_(1)
        if publish is not None:
            ops.publish_tokens(out, *publish)

    monkeypatch.setattr(cuda_graphs.ops, "lm_head_sample", step_end)
    dec = cuda_graphs.DecodeGraphs(Model(), [], [1, 2], 6, torch.device("cpu"), sample_seed=3)
    assert dec.host_ring.shape == (cuda_graphs.MAPPED_SLOTS, 2) and dec.published.item() == 0
    rows = []
    for step in range(6):
        draw["value"] = 10 + step
        dec.mapped_inputs()  # the row prepare writes (tests/runner/test_prepare.py)
        dec._step(2)
        _, host = dec.run_step(2, torch.zeros(2))
        rows.append(host)
        assert host.tolist() == [10 + step] * 2  # this replay's tokens, in its own row
    assert dec.published.item() == 6 and dec.step_replays == 6
    assert [r.data_ptr() for r in rows[:4]] == [dec.host_ring[i].data_ptr() for i in range(4)]
    assert rows[4].data_ptr() == rows[0].data_ptr()  # the ring wraps
