"""Whether two half batches on two streams beat one decode batch: W2's decode steps replayed as one
CUDA graph of the whole batch, as two half-batch graphs one after the other, and as the two halves
replayed at the same time on two streams (one half's attention, bound by its K/V reads, beside the
other half's projections, which at these widths keep few SMs busy).

    python -m engine.bench_overlap                     # W2's steps 0, 200, 400 and 600
    python -m engine.bench_overlap --steps 0 --capture same --repeats 5

Each graph set (the whole batch, half A, half B) has its own capture stream (cuBLAS keys its workspace
by stream, so graphs captured on one stream share it) and its own arrival counters for the attention's
split merge (kernels._jit.fresh_arrival_counters); `--capture same` captures all three on torch's
default capture stream. First two graphs of plain matmuls are replayed the same three ways: whether
graphs run side by side at all. A replay that has not finished after `--timeout` seconds is reported
and the run ends (exit status 3). The rows of a half are every other row of the batch (alike in keys);
no K/V is written (every step is replayed many times). Needs a CUDA device; the forward is the
engine's (Qwen3-0.6B shape, random bf16 weights; `--shape tiny` for a small model)."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from functools import partial

import numpy as np

MAX_LEN = 4096
DEVICE = "cuda"  # tests run the flow on the CPU with CUDA's graph and stream API stubbed


def _stall_guard(label: str, seconds: float) -> threading.Timer:
    def stalled() -> None:
        print(f"stalled: {label} has not finished after {seconds:.0f} s", flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, stalled)
    timer.daemon = True
    timer.start()
    return timer


def timed_ms(label: str, fn, repeats: int, timeout: float) -> float:
    """Mean ms of fn() on the device over `repeats` calls, after one untimed call."""
    import torch

    guard = _stall_guard(label, timeout)
    try:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
    finally:
        guard.cancel()
    return start.elapsed_time(end) / repeats


def side_by_side(first, second, streams):
    """fn that runs first() and second() on two streams after the current stream's work, and makes the
    current stream wait for both."""
    import torch

    def run() -> None:
        cur = torch.cuda.current_stream()
        for s, fn in zip(streams, (first, second), strict=True):
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                fn()
        for s in streams:
            cur.wait_stream(s)

    return run


def pair_ms(label: str, a, b, streams, repeats: int, timeout: float) -> tuple[float, float]:
    """ms of a() then b() on the current stream, and of the two on two streams (side_by_side)."""
    serial = timed_ms(f"{label} one after the other", lambda: (a(), b()), repeats, timeout)
    return serial, timed_ms(f"{label} on two streams", side_by_side(a, b, streams), repeats, timeout)


def half_rows(n: int) -> tuple[list[int], list[int]]:
    """The batch rows of half A and half B: every other row."""
    return list(range(0, n, 2)), list(range(1, n, 2))


def _matmul_graph(device, stream):
    import torch

    x = torch.randn(128, 1024, device=device, dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16) / 32

    def body():
        y = x
        for _ in range(50):
            y = y @ w
        return y

    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        body()
    return graph


def _model(shape: str, device):
    import tempfile
    from pathlib import Path

    import torch

    from engine.bench import QWEN3_06B, _checkpoint
    from engine.models.loader import build_model, load_hf_config
    from engine.models.tiny import BENCH_SHAPE

    big = shape == "qwen3-0.6b"
    folder = Path(tempfile.mkdtemp(prefix="chatloom-overlap-"))
    path = _checkpoint(QWEN3_06B if big else dict(BENCH_SHAPE), 151936 if big else 8192, folder, dummy=True)
    return build_model(load_hf_config(str(path)), "dummy", str(path), str(device), torch.bfloat16, MAX_LEN, 0)


def _load(graphs, ctx: list[int], tables: list[list[int]], rng: np.random.Generator) -> None:
    """One decode step of these rows into a graph set's static inputs (as ModelRunner.prepare writes a
    graph step), writing no K/V."""
    import torch

    from engine.model_runner import Decodes, graph_step_arrays

    nd, width = len(ctx), max(len(t) for t in tables)
    table = np.zeros((nd, width), dtype=np.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = t
    none = np.zeros(0, dtype=np.int64)
    pos = np.array(ctx, dtype=np.int64) - 1
    cols = Decodes(rng.integers(0, 10000, nd), pos, np.full(nd, -1, dtype=np.int64), none, none, table)
    a64, a32 = graph_step_arrays(graphs.sizes[-1], cols)
    graphs.inputs64[: a64.size].copy_(torch.from_numpy(a64))
    graphs.inputs32[: a32.size].copy_(torch.from_numpy(a32))


def run(args) -> dict:
    import torch

    from engine.cuda_graphs import DecodeGraphs, default_sizes, padded_size
    from kernels._jit import fresh_arrival_counters
    from kernels.bench import BLOCK_SIZE
    from kernels.bench_w2 import engine_tables, w2_steps

    if not torch.cuda.is_available():
        raise SystemExit("engine.bench_overlap needs a CUDA device")
    device = torch.device(DEVICE)
    replay = (torch.cuda.Stream(), torch.cuda.Stream())
    own = args.capture == "own"
    capture = [torch.cuda.Stream() if own else None for _ in range(3)]
    result: dict = {"steps": []}

    ga, gb = (_matmul_graph(device, capture[i]) for i in (1, 2))
    mm = pair_ms("matmul graphs", ga.replay, gb.replay, replay, args.repeats, args.timeout)
    result["matmul_ms"] = mm
    print(f"two graphs of 50 matmuls: one after the other {mm[0]:.3f} ms, on two streams {mm[1]:.3f} ms")

    steps = [s for s in w2_steps(1, False) if s[0] in set(args.steps) and len(s[1]) >= 2]
    if not steps:
        raise SystemExit(f"none of the steps {args.steps} has two or more W2 sequences decoding")
    tables, num_blocks = engine_tables(False)
    model = _model(args.shape, device)
    attn = model.layers[0].self_attn
    shape = (num_blocks, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim)
    zeros = lambda: torch.zeros(shape, dtype=torch.bfloat16, device=device)  # noqa: E731
    kv = [(zeros(), zeros()) for _ in model.layers]  # ~34 GB at the Qwen3-0.6B shape
    ladder = default_sizes(256)
    whole = sorted({padded_size(ladder, len(c)) for _, c, _ in steps})
    halves = sorted({padded_size(ladder, -(-len(c) // 2)) for _, c, _ in steps})
    max_blocks = -(-MAX_LEN // BLOCK_SIZE)
    sets = []
    for sizes, stream in ((whole, capture[0]), (halves, capture[1]), (halves, capture[2])):
        fresh_arrival_counters()
        sets.append(DecodeGraphs(model, kv, sizes, max_blocks, device, capture_stream=stream))
    full, half_a, half_b = sets
    rng = np.random.default_rng(0)

    print("step  batch  keys | one graph ms | halves one after the other | halves on two streams")
    for t, ctx, rows in steps:
        blocks = [tables[i][: -(-c // BLOCK_SIZE)] for c, i in zip(ctx, rows, strict=True)]
        _load(full, ctx, blocks, rng)
        ra, rb = half_rows(len(ctx))
        _load(half_a, [ctx[i] for i in ra], [blocks[i] for i in ra], rng)
        _load(half_b, [ctx[i] for i in rb], [blocks[i] for i in rb], rng)
        one = timed_ms(f"step {t}: one graph", partial(full.run, len(ctx)), args.repeats, args.timeout)
        a, b = partial(half_a.run, len(ra)), partial(half_b.run, len(rb))
        ms = [one, *pair_ms(f"step {t}: halves", a, b, replay, args.repeats, args.timeout)]
        keys = sum(ctx) / len(ctx)
        side = f"{ms[2]:8.3f} ({ms[2] / ms[0]:.2f}x)"
        print(f"{t:4d}  {len(ctx):5d}  {keys:4.0f} | {ms[0]:12.3f} | {ms[1]:26.3f} | {side}")
        result["steps"].append({"step": t, "batch": len(ctx), "ms": ms})
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engine.bench_overlap",
        description="W2 decode steps: one batch graph against two half-batch graphs on two streams (CUDA).",
    )
    p.add_argument(
        "--steps", type=int, nargs="+", default=[0, 200, 400, 600], help="W2 decode steps to replay"
    )
    p.add_argument("--repeats", type=int, default=20, help="timed replays per measurement")
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds before a measurement counts as stalled"
    )
    p.add_argument(
        "--capture",
        choices=["own", "same"],
        default="own",
        help="each graph set on its own capture stream (own) or all on torch's default (same)",
    )
    p.add_argument("--shape", choices=["qwen3-0.6b", "tiny"], default="qwen3-0.6b", help="the model's shape")
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
