"""CUDA's graph API stubbed for CPU tests of the graph bookkeeping (runner.cuda_graphs), and a model
that returns zeros of the right shapes."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch


class Graph:
    """A stand-in for torch.cuda.CUDAGraph: a pool name per graph, replays recorded."""

    made = 0
    replays: list[str] = []

    def __init__(self) -> None:
        Graph.made += 1
        self.name = f"pool{Graph.made}"

    def pool(self) -> str:
        return self.name

    def replay(self) -> None:
        Graph.replays.append(self.name)


class Model:
    norm = SimpleNamespace(weight=torch.ones(4), eps=1e-6)

    def __call__(self, ids, positions, kv_caches, meta, final_norm=True):
        x = torch.zeros(ids.shape[0], 4)
        return x if final_norm else (x, x.clone())

    logits_weight = torch.zeros(10, 4)

    def compute_logits(self, hidden):
        return torch.zeros(hidden.shape[0], 10)


def stub_graphs(monkeypatch) -> list[str]:
    """Replaces capture and replay with Graph; returns the (emptied) list of replayed graph names."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    Graph.made, Graph.replays = 0, []
    return Graph.replays
