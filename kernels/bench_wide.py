"""A folded decode layer's tail at wide batches: kernels.wide_gemm (four Triton GEMMs chained by
programmatic dependent launch, the SiLU in gate_up's epilogue) against kernels.dispatch's cuBLAS path
(addmm_ / F.linear and the SiLU launch), 28 layers' weights at the Qwen3-0.6B shape streamed from HBM, one
CUDA graph per measurement.

    python -m kernels.bench_wide                     # M = 16, 32, 64, 128, 256: us per layer
    python -m kernels.bench_wide --m 64,256 --sweep  # also each projection's tiles (TUNED lines)
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


def _chain(tail, a, res0, ws):
    """call(): the residual reset, then the tails of every layer."""
    res = res0.clone()

    def run():
        res.copy_(res0)
        for w in ws:
            tail(a, res, w)

    return run


def _projection_case(name: str, m: int, ws, device, dtype):
    """(launch(w, config, **kw), weight rows N, K): one projection of the wide tail alone."""
    from kernels.wide_gemm import gemm

    hidden, width = ws[0].o.shape
    rnd = lambda *s: torch.randn(*s, device=device, dtype=dtype)
    if name == "o":
        x, res = rnd(m, width), rnd(m, hidden)
        return (lambda w, c, **kw: gemm(x, w.o, residual=res, sq_out=True, config=c, **kw)), hidden, width
    if name == "gate_up":
        h, parts = rnd(m, hidden), torch.rand(hidden // 32, m, device=device) * 32
        launch = lambda w, c, **kw: gemm(h, w.gate_up, silu_scale=(parts, 1e-6), config=c, **kw)
        return launch, ws[0].gate_up.shape[0], hidden
    if name == "down":
        act, res = rnd(m, ws[0].down.shape[1]), rnd(m, hidden)
        return (lambda w, c, **kw: gemm(act, w.down, residual=res, config=c, **kw)), hidden, act.shape[1]
    h = rnd(m, hidden)
    return (lambda w, c, **kw: gemm(h, w.qkv_next, config=c, **kw)), ws[0].qkv_next.shape[0], hidden


def _candidates(m: int, n: int, k: int):
    from kernels.wide_gemm import WideConfig, m_bucket

    bucket = m_bucket(m)
    bms = sorted({min(bucket, 16), min(bucket, 32), min(bucket, 64)} | ({128} if bucket >= 128 else set()))
    out = []
    for bm, bn, split in itertools.product(bms, (32, 64, 128), (1, 2, 4, 8)):
        programs = -(-m // bm) * -(-n // bn) * split
        if bn > n or k % (128 * split) or not 48 <= programs <= 1056:
            continue
        warps = 8 if bm * bn >= 128 * 64 else 4
        out.append(WideConfig(bm, bn, 128, warps, 3, split))
    return out


def _cublas_time(name: str, m: int, ws, device, dtype, reps: int) -> float:
    """The projection alone through F.linear over the layers (seconds a layer)."""
    field = {"o": "o", "gate_up": "gate_up", "down": "down", "qkv": "qkv_next"}[name]
    x = torch.randn(m, getattr(ws[0], field).shape[1], device=device, dtype=dtype)
    return _graph_time(lambda: [torch.nn.functional.linear(x, getattr(w, field)) for w in ws], reps) / len(ws)


def sweep(ms: list[int], ws, device, dtype, reps: int, names=PROJECTIONS) -> dict:
    """Best config per (projection, M) with PDL and prefetch; prints TUNED lines for kernels/wide_gemm.py."""
    from kernels.wide_gemm import choose_config, m_bucket

    best, lines = {}, []
    for m in ms:
        for name in names:
            launch, n, k = _projection_case(name, m, ws, device, dtype)
            results = []
            per_layer = lambda c, launch=launch, **kw: (
                _graph_time(lambda: [launch(w, c, **kw) for w in ws], reps) / len(ws)
            )
            for cfg in _candidates(m, n, k):
                try:
                    t = per_layer(cfg)
                except Exception as exc:  # a tile the chip cannot hold
                    print(f"  {name} M={m} {tuple(cfg)}: {type(exc).__name__}")
                    continue
                results.append((t, cfg))
            results.sort()
            default = choose_config(m, n, k)
            t, cfg = results[0]
            t_default, t_nopdl = per_layer(default), per_layer(cfg, use_pdl=False)
            best[(name, m)] = cfg
            t_cublas = _cublas_time(name, m, ws, device, dtype, reps)
            print(f"{name:8} M={m:<4} best {t * 1e6:6.2f} us {tuple(cfg)} (no pdl {t_nopdl * 1e6:6.2f})  "
                  f"default {t_default * 1e6:6.2f}  cublas {t_cublas * 1e6:6.2f}  "
                  + "  ".join(f"{tuple(c)}={x * 1e6:.2f}" for x, c in results[1:4]), flush=True)  # fmt: skip
            lines.append(f"    ({n}, {k}, {m_bucket(m)}): WideConfig{tuple(cfg)},  # {name} M={m}: "
                         f"{t * 1e6:.2f} us (cuBLAS {t_cublas * 1e6:.2f})")  # fmt: skip
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
    from kernels import wide_gemm
    from kernels.bench import tail_layers

    device, dtype = torch.device("cuda"), torch.bfloat16
    ws = tail_layers(dtype, device, LAYERS)
    mib = LAYERS * sum(t.numel() * t.element_size() for t in ws[0] if isinstance(t, torch.Tensor)) / 2**20
    print(f"# {LAYERS} layers' tails ({mib:.0f} MiB of weights), bf16, us per layer (CUDA graph of all)")
    names = [n for n in args.only.split(",") if n in PROJECTIONS]
    best = sweep(ms, ws, device, dtype, args.reps, names) if args.sweep else {}
    variants = {
        "cublas": lambda a, r, w: ops.folded_decode_layer_tail(a, r, w),
        "triton": lambda a, r, w: wide_gemm.folded_decode_layer_tail(a, r, w, use_pdl=False),
        "+pdl": lambda a, r, w: wide_gemm.folded_decode_layer_tail(a, r, w, use_pdl=True, prefetch=False),
        "+prefetch": lambda a, r, w: wide_gemm.folded_decode_layer_tail(a, r, w, use_pdl=True, prefetch=True),
    }
    for m in ms:
        a = torch.randn(m, ws[0].o.shape[1], device=device, dtype=dtype)
        res0 = torch.randn(m, ws[0].o.shape[0], device=device, dtype=dtype)
        t_reset = _graph_time(_chain(lambda a, r, w: None, a, res0, ws), args.reps)
        row = {k: _graph_time(_chain(fn, a, res0, ws), args.reps) - t_reset for k, fn in variants.items()}
        if best:
            cfgs = {name: best[(name, m)] for name in PROJECTIONS if (name, m) in best}
            fn = lambda a, r, w, c=cfgs: wide_gemm.folded_decode_layer_tail(a, r, w, configs=c)
            row["swept"] = _graph_time(_chain(fn, a, res0, ws), args.reps) - t_reset
        got = wide_gemm.folded_decode_layer_tail(a, res0.clone(), ws[0])
        expect = ops.folded_decode_layer_tail(a, res0.clone(), ws[0])
        err = max((g.float() - e.float()).abs().max().item() / e.float().abs().max().item()
                  for g, e in zip(got, expect, strict=True))  # fmt: skip
        print(f"M={m:<4} " + "  ".join(f"{k} {v / LAYERS * 1e6:6.2f}" for k, v in row.items())
              + f"  us/layer  (rel err vs cublas {err:.1e})", flush=True)  # fmt: skip
    return 0


def _tiny(ms: list[int]) -> int:
    """The Triton tail vs the reference at a tiny shape through the interpreter: prints the relative error."""
    from kernels import reference as ref
    from kernels import wide_gemm

    torch.manual_seed(0)
    h, a_w, inter, nq = 64, 64, 48, 96
    r = lambda *s: torch.randn(*s) * s[-1] ** -0.5
    ones = torch.ones(h)
    w = ref.TailWeights(r(h, a_w), None, ones, 1e-6, r(2 * inter, h), None, r(h, inter), None, ones, 1e-6,
                        r(nq, h), None)  # fmt: skip
    for m in ms[:2]:
        a, res = torch.randn(m, a_w), torch.randn(m, h)
        got = wide_gemm.folded_decode_layer_tail(a, res.clone(), w)
        expect = ref.decode_layer_tail(a, res.clone(), w)
        qkv = ref.row_scaled(got[0], got[1], w.eps1_next)
        err = max((g - e).abs().max().item() / e.abs().max().item()
                  for g, e in zip((qkv, got[1]), expect, strict=True))  # fmt: skip
        print(f"M={m:<4} wide tail vs reference: rel err {err:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
