"""W2's decode attention replayed step by step: the engine's fused decode launch on the contexts W2's
decode steps have, timed from CUDA graphs, per tile configuration.

    python -m bench.w2_attention                       # every 50th step, the engine's configs and others
    python -m bench.w2_attention --stride 100 --configs "128,4,3 64,4,3"
    python -m bench.w2_attention --tiny                # a few small steps on the CPU (Triton's interpreter)
    python -m bench.w2_attention --layouts "shuffled engine contiguous" --configs 128,4,3
    python -m bench.w2_attention --new-token "fused folded none" --configs 128,4,3
    python -m bench.w2_attention --set kernels.decode_launch.TABLE_REGS_MAX=2048 --configs 128,4,3

W2 (../shared/reference/benchmarks.md) decodes 256 sequences of 100-1,024 prompt tokens, each for its
own 100-1,024 tokens: its steps go from batch 256 at ~600 keys to a few sequences at ~2,000. Each sampled
step stands for the `stride` steps around it, so `W2 total` estimates the whole run's decode attention
(28 layers); the engine's own time is in `python -m bench --workload w2 --profile`. Per step it
prints us and TB/s of K/V read; configurations are (BLOCK_N, warps, stages) of DECODE_CONFIGS' wide key
(batch x KV heads >= SMs) and, below that, its split key. Layouts place each sequence's cache blocks in
the pool: `shuffled` (random blocks), `engine` (as a first-free allocator hands them out in W2: each
prompt's blocks in admission order, then one block at a time as the sequences cross block boundaries
together) and `contiguous` (each sequence's blocks one run). The new token's work before the K/V walk
(`--new-token`): `fused` (q/k norm, RoPE and the K/V store in the launch), `folded` (the same after the
row's 1 / rms, as a model with folded norms runs it), `none` (the cache walked alone: what that work
costs the launch) or `separate` (fused's work as a launch of its own, kernels.qk_norm_rope, before the
attention over the cache). Two modes time the qkv projection with it, all 28 layers' weights in turn:
`gemm` (cuBLAS's projection of the un-normalized residual, then `folded`) and `epilogue`
(kernels.qkv_new_token, the work in the projection's epilogue, then the cache walked alone).
"""

from __future__ import annotations

import argparse

import torch

from bench.kernels import BLOCK_SIZE, HEAD_DIM, HIDDEN, NUM_HEADS, NUM_KV_HEADS, Timer, _new_token, _randn

LAYERS = 28
WIDE_CONFIGS = [(128, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 2), (64, 8, 3), (32, 4, 4), (128, 8, 3)]


def w2_steps(stride: int, tiny: bool) -> list[tuple[int, list[int], list[int]]]:
    """(step, contexts of the sequences still decoding at it, the new token included, their indices)
    every `stride` steps of W2 (tiny: 2 sequences of a few dozen keys)."""
    from bench.workloads import w2_workload

    prompts, outs = w2_workload()
    ins = [len(p) for p in prompts]
    if tiny:
        ins, outs = [20, 37], [5, 9]
    steps = []
    for t in range(0, max(outs), stride):
        rows = [i for i, o in enumerate(outs) if o > t]
        if rows:
            steps.append((t, [ins[i] + t + 1 for i in rows], rows))
    return steps


def engine_tables(tiny: bool) -> tuple[list[list[int]], int]:
    """Every W2 sequence's whole block table as a first-free allocator builds it (prompts admitted in
    order, then each decode step's new blocks in batch order), and the blocks used."""
    from bench.workloads import w2_workload

    prompts, outs = w2_workload()
    ins = [len(p) for p in prompts]
    if tiny:
        ins, outs = [20, 37], [5, 9]
    tables, nxt = [], 0
    for n in ins:
        k = -(-(n + 1) // BLOCK_SIZE)
        tables.append(list(range(nxt, nxt + k)))
        nxt += k
    for t in range(1, max(outs)):
        for i, (n, o) in enumerate(zip(ins, outs, strict=True)):
            if o > t and n + t + 1 > len(tables[i]) * BLOCK_SIZE:
                tables[i].append(nxt)
                nxt += 1
    return tables, nxt


def _batch(ctx: list[int], rows: list[int], layout: str, pool, dtype, device, gen: torch.Generator, eng,
           new_token: str = "fused", table_width: int = 0):  # fmt: skip
    """q, block tables (`layout`), seq_lens, the new token of one step (NewTokenQK, or None for `none`)
    and the mode (`new_token`); rows: the W2 sequences still decoding. table_width > 0: each table row
    padded to that many entries (as the engine's graphs size it by max_model_len)."""
    k_cache, v_cache = pool
    per_seq = -(-max(ctx) // BLOCK_SIZE)
    if layout == "shuffled":
        blocks = torch.randperm(k_cache.shape[0], generator=gen)[: len(ctx) * per_seq]
    elif layout == "contiguous":
        blocks = torch.arange(len(ctx) * per_seq)
    else:
        blocks = torch.tensor([(eng[r] + [0] * per_seq)[:per_seq] for r in rows]).flatten()
    tables = blocks.view(len(ctx), per_seq).to(device=device, dtype=torch.int32)
    if table_width > per_seq:
        tables = torch.nn.functional.pad(tables, (0, table_width - per_seq))
    seq_lens = torch.tensor(ctx, dtype=torch.int32, device=device)
    q, new = _new_token(seq_lens, tables, dtype, device)
    if new_token in ("folded", "gemm", "epilogue"):
        hidden = _randn(len(ctx), HIDDEN, dtype=dtype, device=device)
        new = new._replace(row_scale=hidden, row_eps=1e-6)
    return q, tables, seq_lens, (None if new_token == "none" else new), new_token


_QKV_WEIGHTS: list[torch.Tensor] = []


def _qkv_weights(dtype, device) -> list[torch.Tensor]:
    """LAYERS qkv weights at Qwen3-0.6B's shape (each layer's read from memory, as the engine's); one on
    the CPU (the interpreter's smoke runs)."""
    if not _QKV_WEIGHTS or _QKV_WEIGHTS[0].device != device or _QKV_WEIGHTS[0].dtype != dtype:
        n, layers = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, LAYERS if device.type == "cuda" else 1
        scale = HIDDEN**-0.5
        _QKV_WEIGHTS[:] = [_randn(n, HIDDEN, dtype=dtype, device=device) * scale for _ in range(layers)]
    return _QKV_WEIGHTS


def _project_attend(mode: str, pool, tables, seq_lens, new, order, bound) -> None:
    """One step's qkv projection and decode attention over every layer's weights: `gemm` (cuBLAS, then
    the folded launch) or `epilogue` (kernels.qkv_new_token, then the cache walked alone)."""
    from kernels import decode_attention as da
    from kernels.qkv_new_token import qkv_new_token

    h = new.row_scale
    for w in _qkv_weights(h.dtype, h.device):
        if mode == "gemm":
            qkv = torch.nn.functional.linear(h, w).view(h.shape[0], NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM)
            q, k, v = qkv.split([NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS], dim=1)
            nt = new._replace(k=k, v=v)
        else:
            q = qkv_new_token(h, w, NUM_HEADS, NUM_KV_HEADS, new.q_norm_weight, new.k_norm_weight, new.eps,
                              new.row_eps, new.positions, new.cos_sin, *pool, new.slot_mapping)  # fmt: skip
            nt = None
        da.paged_decode_attention(q, pool[0], pool[1], tables, seq_lens, HEAD_DIM**-0.5, max_seq_len=bound,
                                  new_token=nt, order=order)  # fmt: skip


def _attend(q, pool, tables, seq_lens, new, separate: bool, order, bound):
    """One step's decode attention: the new token's work (NewTokenQK, or None) in the launch, or with
    `separate` as qk_norm_rope_store_kv's launch and then the attention over the cache."""
    from kernels import decode_attention as da
    from kernels.qk_norm_rope import qk_norm_rope_store_kv

    if separate:
        qk_norm_rope_store_kv(q, new.k, new.v, new.q_norm_weight, new.k_norm_weight, new.eps, new.positions,
                              new.cos_sin, pool[0], pool[1], new.slot_mapping)  # fmt: skip
        new = None
    return da.paged_decode_attention(
        q, pool[0], pool[1], tables, seq_lens, HEAD_DIM**-0.5, max_seq_len=bound, new_token=new, order=order
    )


def replay(
    configs: list[tuple[int, int, int]],
    layouts: tuple[str, ...],
    stride: int,
    timer: Timer,
    dtype,
    device,
    tiny: bool,
    new_tokens: tuple[str, ...] = ("fused",),
    table_width: int = 0,
) -> None:
    from kernels import decode_launch as dl

    steps = w2_steps(stride, tiny)
    eng, used = engine_tables(tiny)
    blocks = max(used, max(len(ctx) * -(-max(ctx) // BLOCK_SIZE) for _, ctx, _ in steps))  # the widest
    shape = (blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    pool = _randn(*shape, dtype=dtype, device=device), _randn(*shape, dtype=dtype, device=device)
    keys = ("interpret",) if device.type == "cpu" else ("16bit_wide", "16bit_wide_table", "16bit")
    saved = {k: dl.DECODE_CONFIGS[k] for k in keys}
    try:
        for layout in layouts:
            for new_token in new_tokens:
                width = f", table width {table_width}" if table_width else ""
                print(f"# layout {layout}, new token {new_token}{width}")
                gen = torch.Generator().manual_seed(0)
                batches = [
                    (t, ctx, _batch(ctx, rows, layout, pool, dtype, device, gen, eng, new_token, table_width))
                    for t, ctx, rows in steps
                ]
                _replay(configs, keys, batches, pool, stride, timer, device)
    finally:
        dl.DECODE_CONFIGS.update(saved)


def _replay(configs, keys, batches, pool, stride: int, timer: Timer, device) -> None:
    """Times every config over one layout's steps (DECODE_CONFIGS[keys] set to each in turn)."""
    from kernels import decode_launch as dl

    totals = {}
    for cfg in configs:
        for k in keys:  # the wide steps' tile and the split steps' alike
            dl.DECODE_CONFIGS[k] = cfg
        total, cells = 0.0, []
        for t, ctx, (q, tables, seq_lens, new, mode) in batches:
            order = dl.longest_first(seq_lens) if dl.wants_order(len(ctx), NUM_KV_HEADS, device) else None
            bound = tables.shape[1] * BLOCK_SIZE
            if mode in ("gemm", "epilogue"):  # every layer's projection in the timed graph
                fn = lambda tb=tables, sl=seq_lens, nt=new, mode=mode, o=order, m=bound: _project_attend(
                    mode, pool, tb, sl, nt, o, m
                )
                layers = len(_qkv_weights(pool[0].dtype, pool[0].device))
            else:
                fn = lambda q=q, tb=tables, sl=seq_lens, nt=new, sep=mode == "separate", o=order, m=bound: (
                    _attend(q, pool, tb, sl, nt, sep, o, m)
                )
                layers = 1
            sec = (timer.graph(fn) or timer.eager(fn)) / layers
            nbytes = sum(ctx) * NUM_KV_HEADS * HEAD_DIM * 2 * pool[0].element_size()
            cells.append(f"{t}:B{len(ctx)} {sec * 1e6:.1f} ({nbytes / sec / 1e12:.2f})")
            total += sec * stride * LAYERS
        totals[cfg] = total
        print(f"{cfg}: W2 total {total * 1e3:.0f} ms | step:batch us (TB/s): {'  '.join(cells)}")
    best = min(totals, key=totals.get)
    print(f"best {best}: {totals[best] * 1e3:.0f} ms (first listed: {totals[configs[0]] * 1e3:.0f} ms)")


def _config(text: str) -> tuple[int, int, int]:
    try:
        block_n, warps, stages = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a config is BLOCK_N,warps,stages, got {text!r}") from exc
    return block_n, warps, stages


def _names(
    parser: argparse.ArgumentParser, flag: str, text: str, allowed: tuple[str, ...]
) -> tuple[str, ...]:
    """The space-separated names of a list option, each one of `allowed` (else the parser's error)."""
    names = tuple(text.split())
    for name in names:
        if name not in allowed:
            parser.error(f"{flag}: unknown {name!r} ({', '.join(allowed)})")
    return names


def main(argv: list[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.w2_attention", description=summary)
    parser.add_argument("--stride", type=int, default=50, help="time every STRIDE-th decode step of W2")
    parser.add_argument(
        "--configs", default=None, help="space-separated BLOCK_N,warps,stages (default: a sweep)"
    )
    parser.add_argument("--reps", type=int, default=30, help="timed replays per step (median)")
    parser.add_argument(
        "--layouts", default="shuffled", help="space-separated block layouts: shuffled, engine, contiguous"
    )
    parser.add_argument(
        "--new-token",
        default="fused",
        help="space-separated: fused, folded, none, separate (the new token's work); gemm, epilogue (with "
        "the qkv projection)",
    )
    parser.add_argument(
        "--table-width",
        type=int,
        default=0,
        metavar="N",
        help="block-table entries a sequence (0: its step's longest context; the engine's graphs take "
        "max_model_len / 16: 256 at W2's 4,096, 2,560 at 40,960)",
    )
    from bench import switches as bench_switches

    bench_switches.add_option(
        parser, "flip a module-level switch for this run (as chatloom bench --set; repeatable)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny steps on the CPU through Triton's interpreter"
    )
    args = parser.parse_args(argv)
    for name, value in bench_switches.apply_or_exit(parser, args.set).items():
        print(f"# set {name} = {value!r}")
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
    layouts = _names(parser, "--layouts", args.layouts, ("shuffled", "engine", "contiguous"))
    new_tokens = _names(
        parser, "--new-token", args.new_token, ("fused", "folded", "none", "separate", "gemm", "epilogue")
    )
    timer = Timer(device, reps, False)
    stride = 4 if args.tiny else args.stride
    replay(configs, layouts, stride, timer, dtype, device, args.tiny, new_tokens, args.table_width)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
