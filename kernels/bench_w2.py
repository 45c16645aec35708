"""W2's decode attention replayed step by step: the engine's fused decode launch on the contexts W2's
decode steps have, timed from CUDA graphs, per tile configuration.

    python -m kernels.bench_w2                       # every 50th step, the engine's configs and others
    python -m kernels.bench_w2 --stride 100 --configs "128,4,3 64,4,3"
    python -m kernels.bench_w2 --configs "128,4,3 128,4,3,2 64,4,3,3"   # against the stream-K launch
    python -m kernels.bench_w2 --tiny                # a few small steps on the CPU (Triton's interpreter)

W2 (../shared/reference/benchmarks.md) decodes 256 sequences of 100-1,024 prompt tokens, each for its
own 100-1,024 tokens: its steps go from batch 256 at ~600 keys to a few sequences at ~2,000. Each sampled
step stands for the `stride` steps around it, so `W2 total` estimates the whole run's decode attention
(28 layers); the engine's own time is in `python -m engine.bench --workload w2 --profile`. Per step it
prints us and TB/s of K/V read; configurations are (BLOCK_N, warps, stages) of DECODE_CONFIGS' wide key
(batch x KV heads >= SMs) and, below that, its split key.
"""

from __future__ import annotations

import argparse

import torch

from kernels.bench import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, Timer, _new_token, _randn

LAYERS = 28
WIDE_CONFIGS = [(128, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 2), (64, 8, 3), (32, 4, 4), (128, 8, 3)]


def w2_steps(stride: int, tiny: bool) -> list[tuple[int, list[int]]]:
    """(step, contexts of the sequences still decoding at it, the new token included) every `stride`
    steps of W2 (tiny: 2 sequences of a few dozen keys)."""
    from engine.bench import w2_workload

    prompts, outs = w2_workload()
    ins = [len(p) for p in prompts]
    if tiny:
        ins, outs = [20, 37], [5, 9]
    steps = []
    for t in range(0, max(outs), stride):
        ctx = [n + t + 1 for n, o in zip(ins, outs, strict=True) if o > t]
        if ctx:
            steps.append((t, ctx))
    return steps


def _batch(ctx: list[int], pool: tuple[torch.Tensor, torch.Tensor], dtype, device, gen: torch.Generator):
    """q, caches, block tables (shuffled blocks of the pool), seq_lens and the new token of one step."""
    k_cache, v_cache = pool
    per_seq = -(-max(ctx) // BLOCK_SIZE)
    blocks = torch.randperm(k_cache.shape[0], generator=gen)[: len(ctx) * per_seq]
    tables = blocks.view(len(ctx), per_seq).to(device=device, dtype=torch.int32)
    seq_lens = torch.tensor(ctx, dtype=torch.int32, device=device)
    q, new = _new_token(seq_lens, tables, dtype, device)
    return q, tables, seq_lens, new


def _lean_fn(cfg: tuple[int, ...], q, pool, tables, seq_lens, new, device):
    """kernels.decode_lean's launch at cfg (BLOCK_N, warps, stages, programs per SM[, 0: the new token's
    q/k norm, RoPE and K/V store in a launch of their own before it]); its tile map is built once per
    step in the engine (shared by the layers), so outside the timed call here."""
    from kernels import decode_lean
    from kernels.qk_norm_rope import qk_norm_rope_store_kv

    tiles = decode_lean.tile_map(seq_lens, NUM_KV_HEADS, cfg[0], tables.shape[1] * BLOCK_SIZE)
    p = decode_lean.programs(device, cfg[3])
    fused = len(cfg) == 4 or cfg[4] != 0

    def run():
        nt = new
        if not fused:
            qk_norm_rope_store_kv(q, new.k, new.v, new.q_norm_weight, new.k_norm_weight, new.eps,
                                  new.positions, new.cos_sin, pool[0], pool[1], new.slot_mapping)  # fmt: skip
            nt = None
        decode_lean.lean_decode_attention(
            q, pool[0], pool[1], tables, seq_lens, HEAD_DIM**-0.5, new_token=nt, tiles=tiles, num_programs=p
        )

    return run


def replay(configs: list[tuple[int, ...]], stride: int, timer: Timer, dtype, device, tiny: bool) -> None:
    from kernels import decode_lean
    from kernels import paged_attention as pa

    steps = w2_steps(stride, tiny)
    blocks = max(len(ctx) * -(-max(ctx) // BLOCK_SIZE) for _, ctx in steps)  # the widest table
    shape = (blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    pool = _randn(*shape, dtype=dtype, device=device), _randn(*shape, dtype=dtype, device=device)
    keys = ("interpret",) if device.type == "cpu" else ("16bit_wide", "16bit")
    saved = {k: pa.DECODE_CONFIGS[k] for k in keys}
    lean_key = "interpret" if device.type == "cpu" else "16bit"
    saved_lean = decode_lean.LEAN_CONFIGS[lean_key]
    gen = torch.Generator().manual_seed(0)
    batches = [(t, ctx, _batch(ctx, pool, dtype, device, gen)) for t, ctx in steps]
    totals = {}
    try:
        for cfg in configs:
            lean = len(cfg) >= 4
            if lean:
                decode_lean.LEAN_CONFIGS[lean_key] = cfg[:4]
            else:
                for k in keys:  # the wide steps' tile and the split steps' alike
                    pa.DECODE_CONFIGS[k] = cfg
            total, cells = 0.0, []
            for t, ctx, (q, tables, seq_lens, new) in batches:
                order = pa.longest_first(seq_lens) if pa.wants_order(len(ctx), NUM_KV_HEADS, device) else None
                bound = tables.shape[1] * BLOCK_SIZE
                fn = lambda q=q, tb=tables, sl=seq_lens, nt=new, o=order, m=bound: pa.paged_decode_attention(
                    q, pool[0], pool[1], tb, sl, HEAD_DIM**-0.5, max_seq_len=m, new_token=nt, order=o
                )
                if lean:
                    fn = _lean_fn(cfg, q, pool, tables, seq_lens, new, device)
                sec = timer.graph(fn) or timer.eager(fn)
                nbytes = sum(ctx) * NUM_KV_HEADS * HEAD_DIM * 2 * pool[0].element_size()
                cells.append(f"{t}:B{len(ctx)} {sec * 1e6:.1f} ({nbytes / sec / 1e12:.2f})")
                total += sec * stride * LAYERS
            totals[cfg] = total
            print(f"{cfg}: W2 total {total * 1e3:.0f} ms | step:batch us (TB/s): {'  '.join(cells)}")
    finally:
        pa.DECODE_CONFIGS.update(saved)
        decode_lean.LEAN_CONFIGS[lean_key] = saved_lean
    best = min(totals, key=totals.get)
    print(f"best {best}: {totals[best] * 1e3:.0f} ms (first listed: {totals[configs[0]] * 1e3:.0f} ms)")


def _config(text: str) -> tuple[int, ...]:
    try:
        cfg = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a config is integers, got {text!r}") from exc
    if len(cfg) not in (3, 4, 5):
        raise argparse.ArgumentTypeError(
            f"a config is BLOCK_N,warps,stages[,programs per SM[,fused 0/1]], got {text!r}"
        )
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench_w2", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stride", type=int, default=50, help="time every STRIDE-th decode step of W2")
    parser.add_argument(
        "--configs",
        default=None,
        help="space-separated BLOCK_N,warps,stages (the engine's decode launch) or BLOCK_N,warps,stages,"
        "programs-per-SM[,0: q/k norm and RoPE launched apart] (the stream-K launch, kernels.decode_lean); "
        "default: a sweep of the first",
    )
    parser.add_argument("--reps", type=int, default=30, help="timed replays per step (median)")
    parser.add_argument(
        "--tiny", action="store_true", help="tiny steps on the CPU through Triton's interpreter"
    )
    args = parser.parse_args(argv)
    if args.tiny:
        device, dtype, reps = torch.device("cpu"), torch.float32, 1
    elif torch.cuda.is_available():
        device, dtype, reps = torch.device("cuda"), torch.bfloat16, args.reps
    else:
        parser.error("needs a CUDA device (or --tiny)")
    configs = [_config(c) for c in args.configs.split()] if args.configs else WIDE_CONFIGS
    if args.tiny and not args.configs:
        configs = [(16, 4, 1)]
    torch.manual_seed(0)
    replay(configs, 4 if args.tiny else args.stride, Timer(device, reps, False), dtype, device, args.tiny)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
