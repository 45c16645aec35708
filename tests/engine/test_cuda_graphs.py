"""The capture ladder's bookkeeping on the CPU (CUDA's graph API replaced by a recorder): every
size is run once outside and once inside its capture, largest first, all in the first pool; a
batch pads up to the next captured size."""

from __future__ import annotations

import contextlib

import torch

from engine import cuda_graphs
from engine.cuda_graphs import capture_ladder, padded_size


class _Graph:
    made = 0

    def __init__(self) -> None:
        _Graph.made += 1
        self.name = f"pool{_Graph.made}"

    def pool(self) -> str:
        return self.name


def test_capture_ladder(monkeypatch):
    events = []
    state = {"capturing": None}

    @contextlib.contextmanager
    def graph(g, pool=None):
        state["capturing"] = (g, pool)
        yield
        state["capturing"] = None

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
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


def test_decode_graphs_sample(monkeypatch):
    # sampling graphs: one per size, over that size's logits; sample() replays the padded size's graph
    # for the logits run() returned, uploads temperatures only when they change, and declines other
    # logits (eager ones, or a batch whose temperatures do not match)
    replays = []

    class Graph(_Graph):
        def replay(self) -> None:
            replays.append(self.name)

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class Model:
        def __call__(self, ids, positions, kv_caches, meta):
            return torch.zeros(ids.shape[0], 4)

        def compute_logits(self, hidden):
            logits = torch.zeros(hidden.shape[0], 50)
            logits[:, 7] = 5.0
            return logits

    g = cuda_graphs.DecodeGraphs(Model(), [], [1, 4], 8, torch.device("cpu"), sample_seed=3)
    assert sorted(g.sample_graphs) == [1, 4] and g.seed.dtype == torch.int32
    one = torch.zeros(3, dtype=torch.int64)
    logits = g.run(one, one, one, torch.zeros((3, 2), dtype=torch.int32), one.int())
    replays.clear()
    tokens = g.sample(logits, (0.0, 0.0, 0.0))
    assert tokens is not None and tokens.shape == (3,) and len(replays) == 1
    assert tokens.data_ptr() == g.sample_graphs[4][1].data_ptr()
    assert torch.equal(tokens, torch.full((3,), 7))  # the eager warm-up run of the capture: greedy
    assert g.temperatures[:3].tolist() == [0.0, 0.0, 0.0]
    g.temperatures.fill_(9.0)
    g.sample(logits, (0.0, 0.0, 0.0))  # same key: nothing uploaded
    assert g.temperatures[0].item() == 9.0
    g.sample(logits, (0.5, 0.0, 1.0))
    assert g.temperatures[:3].tolist() == [0.5, 0.0, 1.0]
    assert g.sample(logits.clone(), (0.0, 0.0, 0.0)) is None  # not the graph's output
    assert g.sample(logits, (0.0, 0.0)) is None
    plain = cuda_graphs.DecodeGraphs(Model(), [], [1], 8, torch.device("cpu"))
    assert plain.sample_graphs == {} and plain.sample(plain.graphs[1][1], (0.0,)) is None
