"""engine.bench_overlap's host side: the decode steps it writes into graph inputs, the halves, the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import bench_overlap
from engine.model_runner import Decodes, graph_step_arrays


def test_graph_step_arrays_layout():
    d = Decodes(
        ids=np.array([7, -1]),
        pos=np.array([4, 9]),
        slots=np.array([20, 41]),
        pend_at=np.array([1]),
        pend_rows=np.array([3]),
        tables=np.array([[5, 0, 0], [8, 9, 2]], dtype=np.int32),
    )
    a64, a32 = graph_step_arrays(4, d)
    assert a64.tolist() == [7, -1, 0, 0, 4, 9, 0, 0, 20, 41, -1, -1, 1, 2, 3, 0, 1, 3]
    assert a32.tolist() == [5, 10, 0, 0, 5, 0, 0, 8, 9, 2]


def test_a_loaded_step_reaches_the_graph_inputs(monkeypatch):
    """What _load writes is what the graph's first launch turns into its lengths, tables and slots."""
    from engine.cuda_graphs import DecodeGraphs
    from tests.engine.graph_stubs import Model, stub_graphs

    stub_graphs(monkeypatch)
    g = DecodeGraphs(Model(), [], [1, 2, 4], 8, torch.device("cpu"))
    ctx, tables = [33, 5, 17], [[4, 6, 1], [9], [2, 3]]
    bench_overlap._load(g, ctx, tables, np.random.default_rng(0))
    g.finish_inputs(4)
    assert g.seq_lens.tolist() == [33, 5, 17, 0]
    assert g.positions[:3].tolist() == [32, 4, 16]
    assert g.slot_mapping.tolist() == [-1] * 4  # replayed steps write no K/V
    assert g.block_tables[:3, :3].tolist() == [[4, 6, 1], [9, 0, 0], [2, 3, 0]]
    assert all(0 <= i < 10000 for i in g.input_ids[:3].tolist())


def test_half_rows_split_every_other_row():
    assert bench_overlap.half_rows(5) == ([0, 2, 4], [1, 3])
    a, b = bench_overlap.half_rows(256)
    assert len(a) == len(b) == 128 and sorted(a + b) == list(range(256))


def test_cli_help_and_cpu_refusal(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_overlap.main(["--help"])
    assert exit_.value.code == 0
    assert "--capture" in capsys.readouterr().out
    if torch.cuda.is_available():
        pytest.skip("the CUDA refusal is for machines without one")
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench_overlap.main(["--steps", "0"])


def test_the_stall_guard_is_cancelled_by_a_finished_measurement(monkeypatch):
    exits = []
    monkeypatch.setattr(bench_overlap.os, "_exit", exits.append)
    guard = bench_overlap._stall_guard("nothing", 0.05)
    guard.cancel()
    guard.join()
    assert exits == []
    guard = bench_overlap._stall_guard("a stalled replay", 0.01)
    guard.join()
    assert exits == [3]


def test_the_flow_with_cuda_stubbed(monkeypatch):
    """The whole run on the CPU (tiny shape; CUDA's graphs, streams and events stubbed): each of W2's
    chosen steps is loaded whole into one graph set and split in two halves into the other two."""
    import contextlib

    from tests.engine.graph_stubs import stub_graphs

    class Stream:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def wait_stream(self, other) -> None:
            pass

    class Event:
        def __init__(self, **kwargs) -> None:
            pass

        def record(self) -> None:
            pass

        def elapsed_time(self, end) -> float:
            return 2.0

    stub_graphs(monkeypatch)
    for name, value in (
        ("is_available", lambda: True),
        ("Stream", Stream),
        ("Event", Event),
        ("current_stream", Stream),
        ("stream", lambda s: contextlib.nullcontext()),
    ):
        monkeypatch.setattr(torch.cuda, name, value)  # fmt: skip
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **k: randn(*a, **k))
    monkeypatch.setattr(bench_overlap, "DEVICE", "cpu")
    loads = []
    load = bench_overlap._load
    monkeypatch.setattr(
        bench_overlap, "_load", lambda g, ctx, t, rng: (loads.append((g, ctx)), load(g, ctx, t, rng))
    )

    result = bench_overlap.main(["--shape", "tiny", "--steps", "700", "--repeats", "2"])
    assert [s["step"] for s in result["steps"]] == [700]
    assert result["steps"][0]["ms"] == [1.0, 1.0, 1.0] and result["matmul_ms"] == (1.0, 1.0)
    (full, ctx), (a, ctx_a), (b, ctx_b) = loads
    assert len({id(full), id(a), id(b)}) == 3
    assert len(ctx) == result["steps"][0]["batch"] == 85 and (len(ctx_a), len(ctx_b)) == (43, 42)
    assert sorted(ctx_a + ctx_b) == sorted(ctx) and ctx_a == ctx[0::2]
