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
