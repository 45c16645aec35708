"""kernels.qkv_new_token's tile configurations against cuBLAS's plain projection of the same shape, at the
wide decode steps' row counts (Qwen3-0.6B: 4,096 x 1,024 weights; each timing replays one CUDA graph of
28 layers' weights, as the engine reads them).

    python -m kernels.bench_qkv                                  # the default configs, both row passes
    python -m kernels.bench_qkv --rows 256,160 --configs "64,128,4,3 64,64,4,4" --row-pass dot
    python -m kernels.bench_qkv --tiny                           # a smoke run on the CPU (interpreter)

Prints us a launch (and the error against reference.qkv_new_token) per row count, configuration
(BLOCK_M, BLOCK_K, warps, stages) and `ROW_PASS` (how 1 / rms of the rows is taken)."""

from __future__ import annotations

import argparse

import torch

from kernels import reference as ref
from kernels.bench import BLOCK_SIZE, HEAD_DIM, HIDDEN, NUM_HEADS, NUM_KV_HEADS, Timer, _err, _randn

LAYERS = 28
CONFIGS = [(64, 128, 4, 3), (64, 64, 4, 4), (32, 128, 4, 3), (64, 128, 4, 2)]


def _config(text: str) -> tuple[int, int, int, int]:
    try:
        bm, bk, warps, stages = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a config is BLOCK_M,BLOCK_K,warps,stages, got {text!r}") from exc
    return bm, bk, warps, stages


def run(rows: list[int], configs, row_passes, device: torch.device, dtype, reps: int) -> list[str]:
    """One line a row count: cuBLAS's us a launch, then each row pass and configuration's."""
    layers = LAYERS if device.type == "cuda" else 1
    heads = NUM_HEADS + 2 * NUM_KV_HEADS
    ws = [_randn(heads * HEAD_DIM, HIDDEN, dtype=dtype, device=device) * HIDDEN**-0.5 for _ in range(layers)]
    timer, lines = Timer(device, reps, False), []
    for m in rows:
        lines.append("  ".join(_row(m, ws, configs, row_passes, timer, device, dtype)))
        print(lines[-1], flush=True)
    return lines


def _row(m: int, ws: list[torch.Tensor], configs, row_passes, timer: Timer, device, dtype) -> list[str]:
    from kernels import qkv_new_token as qnt

    inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
    cos_sin = ref.rope_cos_sin(inv_freq, 8192)
    nw = [(1 + 0.1 * _randn(HEAD_DIM, dtype=torch.float32, device=device)).to(dtype) for _ in range(2)]
    x = _randn(m, HIDDEN, dtype=dtype, device=device) * 2
    nb = m // BLOCK_SIZE + 2
    kc = torch.zeros(nb, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    slots, pos = (
        torch.randperm(nb * BLOCK_SIZE, device=device)[:m],
        torch.randint(0, 8192, (m,), device=device),
    )

    def args(w):
        return x, w, NUM_HEADS, NUM_KV_HEADS, nw[0], nw[1], 1e-6, 1e-6, pos, cos_sin, kc, vc, slots

    def cublas():
        return [torch.nn.functional.linear(x, w) for w in ws]

    def fused(cfg):
        return [qnt.qkv_new_token(*args(w), config=cfg) for w in ws]

    sec = timer.graph(cublas) or timer.eager(cublas)
    cells = [f"rows {m}: cuBLAS F.linear {sec / len(ws) * 1e6:.2f}"]
    want = ref.qkv_new_token(*args(ws[0]))
    default = qnt.ROW_PASS
    try:
        for row_pass in row_passes:
            qnt.ROW_PASS = row_pass
            for cfg in configs:
                err = _err(qnt.qkv_new_token(*args(ws[0]), config=cfg), want)
                sec = timer.graph(lambda c=cfg: fused(c)) or timer.eager(lambda c=cfg: fused(c))
                cells.append(f"{row_pass} {cfg} {sec / len(ws) * 1e6:.2f} (err {err:.2g})")
    finally:
        qnt.ROW_PASS = default
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench_qkv", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="256,192,160,128", help="comma list of row counts")
    parser.add_argument("--configs", default=None, help="space-separated BLOCK_M,BLOCK_K,warps,stages")
    parser.add_argument("--row-pass", default="loads dot", help="space-separated: loads, dot")
    parser.add_argument("--reps", type=int, default=30, help="timed replays per measurement (median)")
    parser.add_argument(
        "--tiny", action="store_true", help="a smoke run on the CPU through Triton's interpreter"
    )
    args = parser.parse_args(argv)
    passes = args.row_pass.split()
    for p in passes:
        if p not in ("loads", "dot"):
            parser.error(f"--row-pass: unknown {p!r} (loads, dot)")
    configs = [_config(c) for c in args.configs.split()] if args.configs else CONFIGS
    rows = [int(r) for r in args.rows.split(",")]
    if args.tiny:
        device, dtype, reps, rows, configs = torch.device("cpu"), torch.float32, 1, [5], [(16, 64, 4, 1)]
    elif torch.cuda.is_available():
        device, dtype, reps = torch.device("cuda"), torch.bfloat16, args.reps
    else:
        parser.error("needs a CUDA device (or --tiny)")
    torch.manual_seed(0)
    run(rows, configs, passes, device, dtype, reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
