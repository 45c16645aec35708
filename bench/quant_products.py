"""`python -m bench.quant_products`: one int8 product of SmolLM2's shapes at 1-32 rows (--rows), on the
packed weight-only kernel, on each int8 GEMM kernels.quant_linear.int8_gemm can pick here (`_int_mm`
runs on every CPU, as a scalar loop without VNNI; fbgemm's where torch's quantized engine is x86) and in
float32 on the dequantized weight (quant_linear._route's choices); then the
float32 weight an int4 product of WIDE_M rows or more rebuilds from its nibbles, eager and compiled;
microseconds a call (best of the repeats), for docs/performance.md."""

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
    gemms = ["int_mm"] + (["fbgemm"] if Q.int8_gemm() == "fbgemm" else [])
    print(
        f"int8 products, {args.threads} threads, int8_gemm here: {Q.int8_gemm() or 'none'}; us a call: "
        f"packed kernel / {' / '.join(gemms)} / float32 on the dequantized weight"
    )
    for n, k in ((1536, 576), (576, 1536), (49152, 576)):
        qw = Q.quantize(torch.randn(n, k), "int8")
        qw.refine = Q.REFINE_TOP if n > 10000 else 0  # the logits: x in one part on fbgemm
        for m in args.rows:
            calls = max(1, (5 if n > 10000 else 100) * 32 // max(m, 32))
            x = torch.randn(m, k)
            timed = [lambda x=x, qw=qw: pack(x.bfloat16(), qw.data, qw.scales)]
            timed += [lambda x=x, qw=qw, g=g: Q._int8_dynamic(x, qw, g) for g in gemms]
            timed.append(lambda x=x, qw=qw: torch.nn.functional.linear(x, Q.dequantize(qw)))
            us = " / ".join(f"{_best_us(f, args.repeats, calls):8.0f}" for f in timed)
            print(f"{n:>6} x {k:<5} {m:>4} rows: {us}")
    print("int4 wide products' weight from its nibbles (split scales): us a call, eager / compiled")
    for n, k in ((1536, 576), (576, 1536)):
        # a weight on GGUF Q4_1's grid (per block of 32: fp16 d and m, q in 0..15, both ends used), as
        # SmolLM2's are: quantize keeps it exact with split scales
        q = torch.randint(0, 16, (n, k // 32, 32)).float()
        q[..., 0], q[..., 1] = 0, 15
        d = (torch.rand(n, k // 32, 1) * 0.02 + 1e-3).half().float()
        m = (-torch.rand(n, k // 32, 1) * 0.1).half().float()
        qw = Q.quantize((d * q + m).reshape(n, k), "int4", split="both")
        assert qw.lo_scales is not None
        eager = _best_us(lambda qw=qw: Q._dense_int4(qw.nibbles, qw.scales, qw.lo_scales), args.repeats, 20)
        fused = _best_us(lambda qw=qw: Q._dense_wide(qw), args.repeats, 20)
        print(
            f"{n:>6} x {k:<5}: {eager:8.0f} / {fused:8.0f}"
            + (" (compile failed)" if Q._compile_failed else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
