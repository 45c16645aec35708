"""A wide decode layer's four projections (o + residual, gate_up + SiLU, down + residual, the next qkv) over
28 layers' weights: cuBLAS with the SiLU launch (the engine's folded wide tail) against kernels.ws_gemm,
without and with programmatic dependent launch. µs a layer, medians of CUDA-graph replays (H200).

    python -m kernels.bench_ws                 # M = 16, 64, 128, 256
    python -m kernels.bench_ws --m 64 --stages 3
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

H, A, INTER, QKV = 1024, 2048, 3072, 4096  # Qwen3-0.6B
LAYERS = 28


def _weights(device: torch.device, layers: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator(device=device).manual_seed(0)
    mk = lambda n, k: (torch.randn(n, k, device=device, generator=g) * k**-0.5).to(torch.bfloat16)
    return [dict(o=mk(H, A), gu=mk(2 * INTER, H), d=mk(H, INTER), q=mk(QKV, H)) for _ in range(layers)]


def _cublas(a, res, w, only=None):
    from kernels.activation import silu_and_mul

    if only in (None, "o"):
        res.addmm_(a, w["o"].t())
    if only in (None, "gu"):
        y = silu_and_mul(F.linear(res, w["gu"]))
    if only in (None, "d"):
        res.addmm_(y if only is None else _y(res), w["d"].t())
    if only in (None, "q"):
        return F.linear(res, w["q"])
    return res


_Y: dict = {}


def _y(res):  # a stand-in SiLU output for the down projection timed alone
    key = res.shape[0]
    if key not in _Y:
        _Y[key] = torch.randn(res.shape[0], INTER, device=res.device).to(res.dtype) * 0.1
    return _Y[key]


def _ws(a, res, w, pdl_on, stages, bn_gu, only=None):
    from kernels.ws_gemm import ws_linear

    if only in (None, "o"):
        ws_linear(a, w["o"], res, mode=1, pdl_on=pdl_on, stages=stages)
    if only in (None, "gu"):
        y = ws_linear(res, w["gu"], mode=2, pdl_on=pdl_on, stages=stages, bn=bn_gu)
    if only in (None, "d"):
        ws_linear(y if only is None else _y(res), w["d"], res, mode=1, pdl_on=pdl_on, stages=stages)
    if only in (None, "q"):
        return ws_linear(res, w["q"], pdl_on=pdl_on, stages=stages)
    return res


def _graph_us(fn, reps: int = 20) -> float:
    """Median µs of one replay of a graph of fn (LAYERS layers)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _check(m: int, ws, device) -> str:
    """One layer both ways from the same inputs: the relative error of the residual and the qkv."""
    g = torch.Generator(device=device).manual_seed(m)
    a = torch.randn(m, A, device=device, generator=g).to(torch.bfloat16)
    res0 = torch.randn(m, H, device=device, generator=g).to(torch.bfloat16)
    w = ws[0]
    r1, r2 = res0.clone(), res0.clone()
    q1 = _cublas(a, r1, w)
    q2 = _ws(a, r2, w, False, 4, None)
    err = lambda x, y: float((x.float() - y.float()).norm() / y.float().norm())
    return f"rel err residual {err(r2, r1):.1e}, qkv {err(q2, q1):.1e}"


def _sweep(m: int, ws, device, stages: int) -> None:
    a = torch.randn(m, A, device=device).to(torch.bfloat16)
    res = torch.randn(m, H, device=device).to(torch.bfloat16)
    run = lambda f: _graph_us(lambda: [f(w) for w in ws]) / LAYERS
    for only in ("o", "gu", "d", "q", None):
        cub = run(lambda w, o=only: _cublas(a, res, w, o))
        plain = run(lambda w, o=only: _ws(a, res, w, False, stages, None, o))
        chained = run(lambda w, o=only: _ws(a, res, w, True, stages, None, o))
        extra = ""
        if only in ("gu", None):
            wide = run(lambda w, o=only: _ws(a, res, w, True, stages, 32, o))
            extra = f"  gate_up BN 32 + PDL {wide:6.2f}"
        print(f"  {only or 'layer':<5} us a layer: cuBLAS {cub:6.2f}  ws {plain:6.2f}  "
              f"ws + PDL {chained:6.2f}{extra}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench_ws", description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", default="16,64,128,256", help="comma list of batch rows")
    parser.add_argument("--stages", type=int, default=4, help="activation tiles in flight")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (Hopper)")
    device = torch.device("cuda")
    ws = _weights(device, LAYERS)
    for m in (int(x) for x in args.m.split(",")):
        print(f"M={m}: {_check(m, ws, device)}")
        _sweep(m, ws, device, args.stages)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
