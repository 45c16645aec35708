"""A decode layer's tail at wide batches: kernels.wide_tail (four GEMM launches with the norms, SiLU and
residual adds folded in) against the unfused path (cuBLAS projections and the elementwise launches),
28 layers' weights at the Qwen3-0.6B shape streamed from HBM, one CUDA graph per measurement.

    python -m kernels.bench_wide                     # M = 16, 32, 64, 128, 256: us per layer
    python -m kernels.bench_wide --m 64,256 --sweep  # also each projection's tile configs (TUNED lines)
    python -m kernels.bench_wide --tiny              # a tiny shape on the CPU (Triton's interpreter)
"""

from __future__ import annotations

import argparse
import itertools

import torch

LAYERS = 28
PROJECTIONS = ("o", "gate_up", "down", "qkv")


def _graph_time(call, reps: int) -> float:
    """Seconds per replay of a CUDA graph of call() (median of reps)."""
    from kernels.bench import _streamed

    return _streamed(lambda _i: call(), 1, reps)


def _inputs(m: int, ws, device, dtype):
    width, hidden = ws[0].o.shape[1], ws[0].o.shape[0]
    a = torch.randn(m, width, device=device, dtype=dtype)
    res = torch.randn(m, hidden, device=device, dtype=dtype)
    return a, res


def _tails(fn, a, res, ws):
    def run():
        for w in ws:
            fn(a, res, w)

    return run


def _projection_case(name: str, m: int, ws, device, dtype):
    """(launch(w, config) over the layers, N_OUT, K, silu): one projection of the wide tail alone."""
    from kernels.wide_tail import _gemm, _Norm

    hidden = ws[0].o.shape[0]
    parts = torch.rand(16, m, device=device) * hidden / 16
    if name == "o":
        x, res = _inputs(m, ws, device, dtype)
        return (lambda w, c: _gemm(x, w.o, None, residual=res, config=c)), hidden, x.shape[1], False
    if name == "gate_up":
        h = torch.randn(m, hidden, device=device, dtype=dtype)
        launch = lambda w, c: _gemm(h, w.gate_up, None, norm=_Norm(parts, w.norm2, 1e-6), silu=True, config=c)
        return launch, w_rows(ws, "gate_up") // 2, hidden, True
    if name == "down":
        act = torch.randn(m, ws[0].down.shape[1], device=device, dtype=dtype)
        res = torch.randn(m, hidden, device=device, dtype=dtype)
        return (lambda w, c: _gemm(act, w.down, None, residual=res, config=c)), hidden, act.shape[1], False
    h = torch.randn(m, hidden, device=device, dtype=dtype)
    return ((lambda w, c: _gemm(h, w.qkv_next, None, norm=_Norm(parts, w.norm1_next, 1e-6), config=c)),
            w_rows(ws, "qkv_next"), hidden, False)  # fmt: skip


def w_rows(ws, field: str) -> int:
    return getattr(ws[0], field).shape[0]


def _candidates(m: int, n_out: int, k: int):
    from kernels.wide_tail import WideConfig, _m_bucket

    bucket = _m_bucket(m)
    bms = sorted({min(bucket, 64), min(bucket, 32) if bucket <= 64 else 128})
    out = []
    for bm, bn, split in itertools.product(bms, (32, 64, 128), (1, 2, 4, 8)):
        programs = -(-m // bm) * -(-n_out // bn) * split
        if bn > n_out or k % (128 * split) or not 64 <= programs <= 1536:
            continue
        warps = 8 if bm * bn >= 128 * 64 else 4
        out.append(WideConfig(bm, bn, 128, warps, 3, split))
    return out


def _cublas_times(name: str, m: int, ws, device, dtype, reps: int) -> str:
    """The projection alone through F.linear over the layers: cuBLAS as torch picks it, and cuBLASLt."""
    field = {"o": "o", "gate_up": "gate_up", "down": "down", "qkv": "qkv_next"}[name]
    x = torch.randn(m, getattr(ws[0], field).shape[1], device=device, dtype=dtype)
    run = lambda: [torch.nn.functional.linear(x, getattr(w, field)) for w in ws]
    out = []
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        out.append(f"{lib} {_graph_time(run, reps) / len(ws) * 1e6:6.2f}")
    torch.backends.cuda.preferred_blas_library("default")
    return "  ".join(out)


def sweep(ms: list[int], ws, device, dtype, reps: int, names=PROJECTIONS) -> dict:
    """Best config per (projection, M); prints TUNED lines for kernels/wide_tail.py."""
    from kernels.wide_tail import _m_bucket, choose_config

    best, lines = {}, []
    for m in ms:
        for name in names:
            launch, n_out, k, silu = _projection_case(name, m, ws, device, dtype)
            results = []
            over_layers = lambda c, launch=launch: [launch(w, c) for w in ws]
            for cfg in _candidates(m, n_out, k):
                try:
                    t = _graph_time(lambda cfg=cfg, run=over_layers: run(cfg), reps) / len(ws)
                except Exception as exc:  # a tile the chip cannot hold
                    print(f"  {name} M={m} {tuple(cfg)}: {type(exc).__name__}")
                    continue
                results.append((t, cfg))
            results.sort()
            default = choose_config(m, n_out, k, silu)
            t_default = _graph_time(lambda default=default, run=over_layers: run(default), reps) / len(ws)
            t, cfg = results[0]
            best[(name, m)] = cfg
            print(f"{name:8} M={m:<4} best {t * 1e6:6.2f} us {tuple(cfg)}  default {t_default * 1e6:6.2f}  "
                  f"{_cublas_times(name, m, ws, device, dtype, reps)}  "
                  + "  ".join(f"{tuple(c)}={x * 1e6:.2f}" for x, c in results[1:4]))  # fmt: skip
            rows = n_out * (2 if silu else 1)
            lines.append(f"    ({rows}, {k}, {_m_bucket(m)}): WideConfig{tuple(cfg)},  # {name} M={m}: "
                         f"{t * 1e6:.2f} us")  # fmt: skip
    print("TUNED = {\n" + "\n".join(lines) + "\n}")
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench_wide", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--m", default="16,32,64,128,256", help="batch sizes (comma list)")
    parser.add_argument("--sweep", action="store_true", help="also sweep each projection's tile configs")
    parser.add_argument("--only", default=",".join(PROJECTIONS), help="projections to sweep (comma list)")
    parser.add_argument("--reps", type=int, default=20, help="graph replays per measurement (median)")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape on the CPU (interpreter)")
    args = parser.parse_args(argv)
    ms = [int(m) for m in args.m.split(",") if m.strip()]
    if args.tiny:
        return _tiny(ms)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (or --tiny)")
    from kernels import dispatch as ops
    from kernels import wide_tail
    from kernels.bench import tail_layers

    ops.WIDE_TAIL = False  # `unfused` below: dispatch's path without the wide tail
    device, dtype = torch.device("cuda"), torch.bfloat16
    ws = tail_layers(dtype, device, LAYERS)
    mib = LAYERS * sum(t.numel() * t.element_size() for t in ws[0] if isinstance(t, torch.Tensor)) / 2**20
    print(f"# {LAYERS} layers' tails ({mib:.0f} MiB of weights), bf16, us per layer (CUDA graph of all)")
    names = [n for n in args.only.split(",") if n in PROJECTIONS]
    best = sweep(ms, ws, device, dtype, args.reps, names) if args.sweep else {}
    unfused = lambda a, r, w: ops.decode_layer_tail(a, r.clone(), w)  # the unfused path consumes r
    clone = lambda a, r, w: r.clone()
    for m in ms:
        a, res = _inputs(m, ws, device, dtype)
        t_clone = _graph_time(_tails(clone, a, res, ws), args.reps)
        row = {"unfused": _graph_time(_tails(unfused, a, res, ws), args.reps) - t_clone}
        for pdl in (False, True):
            fn = lambda a, r, w, pdl=pdl: wide_tail.decode_layer_tail(a, r, w, use_pdl=pdl)
            row["wide" + ("+pdl" if pdl else "")] = _graph_time(_tails(fn, a, res, ws), args.reps)
            if best:
                cfgs = {name: best[(name, m)] for name in PROJECTIONS if (name, m) in best}
                fn = lambda a, r, w, pdl=pdl, c=cfgs: wide_tail.decode_layer_tail(
                    a, r, w, configs=c, use_pdl=pdl
                )
                row["swept" + ("+pdl" if pdl else "")] = _graph_time(_tails(fn, a, res, ws), args.reps)
        got = wide_tail.decode_layer_tail(a, res, ws[0])
        expect = ops.decode_layer_tail(a, res.clone(), ws[0])
        err = max((g.float() - e.float()).abs().max().item() / e.float().abs().max().item()
                  for g, e in zip(got, expect, strict=True))  # fmt: skip
        print(f"M={m:<4} " + "  ".join(f"{k} {v / LAYERS * 1e6:6.2f}" for k, v in row.items())
              + f"  us/layer  (rel err vs unfused {err:.1e})")  # fmt: skip
    return 0


def _tiny(ms: list[int]) -> int:
    """The wide tail vs the reference at a tiny shape through the interpreter: prints the relative error."""
    from kernels import reference as ref
    from kernels import wide_tail

    torch.manual_seed(0)
    h, a_w, inter, nq = 64, 64, 48, 96
    r = lambda *s: torch.randn(*s) * s[-1] ** -0.5
    w = ref.TailWeights(r(h, a_w), None, 1 + 0.1 * torch.randn(h), 1e-6, r(2 * inter, h), None, r(h, inter),
                        None, 1 + 0.1 * torch.randn(h), 1e-6, r(nq, h), None)  # fmt: skip
    for m in ms[:2]:
        a, res = torch.randn(m, a_w), torch.randn(m, h)
        got = wide_tail.decode_layer_tail(a, res, w)
        expect = ref.decode_layer_tail(a, res.clone(), w)
        err = max((g - e).abs().max().item() / e.abs().max().item() for g, e in zip(got, expect, strict=True))
        print(f"M={m:<4} wide tail vs reference: rel err {err:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
