"""`python -m bench.quant_products`: one int8 product of SmolLM2's shapes at 1-32 rows, on the packed
weight-only kernel and on the int8 GEMM that kernels.quant_linear uses from DYNAMIC_M rows; microseconds
a call (best of the repeats), for docs/performance.md."""

from __future__ import annotations

import argparse
import time


def _best_us(fn, repeats: int, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from kernels import quant_linear as Q

    pack = torch.ops.aten._weight_int8pack_mm
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"int8 products, {args.threads} threads: us a call, packed kernel / int8 GEMM")
    for n, k in ((1536, 576), (576, 1536), (49152, 576)):
        qw = Q.quantize(torch.randn(n, k), "int8")
        calls = 5 if n > 10000 else 100
        for m in args.rows:
            x = torch.randn(m, k)
            packed = _best_us(lambda x=x, qw=qw: pack(x.bfloat16(), qw.data, qw.scales), args.repeats, calls)
            gemm = _best_us(lambda x=x, qw=qw: Q._int8_dynamic(x, qw), args.repeats, calls)
            print(f"{n:>6} x {k:<5} {m:>3} rows: {packed:8.0f} / {gemm:8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
