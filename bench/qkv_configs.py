"""kernels.qkv_new_token's tile configurations against cuBLAS's plain projection of the same shape, at the
wide decode steps' row counts (Qwen3-0.6B: 4,096 x 1,024 weights; each timing replays one CUDA graph of
28 layers' weights, as the engine reads them).

    python -m bench.qkv_configs                                  # the default configs, TMA tiles
    python -m bench.qkv_configs --rows 256,160 --configs "64,128,4,3 64,64,4,4"
    python -m bench.qkv_configs --loads "pointers tma"
    python -m bench.qkv_configs --tiny                           # a smoke run on the CPU (interpreter)

Prints us a launch (and the error against reference.qkv_new_token) per row count, configuration
(BLOCK_M, BLOCK_K, warps, stages) and way the product's tiles are copied in: `tma` (x's rows aligned,
as the engine's are) or `pointers` (the fallback the kernel takes for x at an unaligned offset)."""

from __future__ import annotations

import argparse

import torch

from bench.kernels import Timer, _err, qkv_new_token_inputs, qkv_weight
from kernels import reference as ref

LAYERS = 28
CONFIGS = [(64, 64, 4, 6), (64, 128, 4, 4), (64, 128, 4, 3), (64, 64, 4, 4)]


def _config(text: str) -> tuple[int, int, int, int]:
    try:
        bm, bk, warps, stages = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a config is BLOCK_M,BLOCK_K,warps,stages, got {text!r}") from exc
    return bm, bk, warps, stages


def run(rows: list[int], configs, device: torch.device, dtype, reps: int,
        loads: tuple[str, ...] = ("tma",)) -> list[str]:  # fmt: skip
    """One line a row count: cuBLAS's us a launch, then each way of loading and configuration's."""
    ws = [qkv_weight(dtype, device) for _ in range(LAYERS if device.type == "cuda" else 1)]
    timer, lines = Timer(device, reps, False), []
    for m in rows:
        lines.append("  ".join(_row(m, ws, configs, timer, dtype, device, loads)))
        print(lines[-1], flush=True)
    return lines


def _row(m: int, ws: list[torch.Tensor], configs, timer: Timer, dtype, device, loads) -> list:
    from kernels import qkv_new_token as qnt

    x, rest = qkv_new_token_inputs(m, dtype, device)

    def cublas():
        return [torch.nn.functional.linear(x, w) for w in ws]

    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    unaligned = flat[1:].view(x.shape).copy_(x)  # an odd offset: no TMA source, the pointer tiles

    def fused(cfg, xs=x):
        return [qnt.qkv_new_token(xs, w, *rest, config=cfg) for w in ws]

    sec = timer.graph(cublas) or timer.eager(cublas)
    cells = [f"rows {m}: cuBLAS F.linear {sec / len(ws) * 1e6:.2f}"]
    want = ref.qkv_new_token(x, ws[0], *rest)
    for how in loads:
        xs = x if how == "tma" else unaligned
        for cfg in configs:
            err = _err(qnt.qkv_new_token(xs, ws[0], *rest, config=cfg), want)
            run = lambda c=cfg, xs=xs: fused(c, xs)
            sec = timer.graph(run) or timer.eager(run)
            cells.append(f"{how} {cfg} {sec / len(ws) * 1e6:.2f} (err {err:.2g})")
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.qkv_configs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="256,192,160,128", help="comma list of row counts")
    parser.add_argument("--configs", default=None, help="space-separated BLOCK_M,BLOCK_K,warps,stages")
    parser.add_argument("--loads", default="tma", help="space-separated: pointers, tma")
    parser.add_argument("--reps", type=int, default=30, help="timed replays per measurement (median)")
    parser.add_argument(
        "--tiny", action="store_true", help="a smoke run on the CPU through Triton's interpreter"
    )
    args = parser.parse_args(argv)
    loads = tuple(args.loads.split())
    for how in loads:
        if how not in ("pointers", "tma"):
            parser.error(f"--loads: unknown {how!r} (pointers, tma)")
    configs = [_config(c) for c in args.configs.split()] if args.configs else CONFIGS
    rows = [int(r) for r in args.rows.split(",")]
    if args.tiny:
        device, dtype, reps, rows, configs = torch.device("cpu"), torch.float32, 1, [5], [(16, 64, 4, 1)]
    elif torch.cuda.is_available():
        device, dtype, reps = torch.device("cuda"), torch.bfloat16, args.reps
    else:
        parser.error("needs a CUDA device (or --tiny)")
    torch.manual_seed(0)
    run(rows, configs, device, dtype, reps, loads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
