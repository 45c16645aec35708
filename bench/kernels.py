"""Micro-benchmarks of every Triton kernel against its torch reference at the Qwen3-0.6B shape.

    python -m bench.kernels                      # all kernels, bf16, on CUDA
    python -m bench.kernels --only decode,prefill --flush-l2
    python -m bench.kernels --tiny               # tiny shapes; runs on the CPU through the interpreter

Columns: `triton` and `torch` are eager per-call times (launch overhead included, as the engine would
pay without CUDA graphs); `graph` is the Triton call replayed from a CUDA graph (GPU time only); where
the reference is itself a device launch inside the engine's graphs (`order`), `torch` is replayed from
a graph too and the speedup is graph against graph;
GB/s is the bytes the kernel must move divided by the best Triton time; `err` is the max abs
difference from the reference run in float32 on the same inputs.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from kernels import reference as ref

# Qwen3-0.6B
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE, VOCAB = 16, 8, 128, 1024, 3072, 151_936
# the KV-cache block size production runs on CUDA (EngineConfig.resolve_block_size)
BLOCK_SIZE = EngineConfig().resolve_block_size("cuda")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KERNELS = [
    "decode", "prefill", "store_kv", "rms_norm", "fused_add_rms_norm", "rope", "qk_norm_rope_store",
    "silu_and_mul", "bitmask", "gemv", "sample", "order", "qkv_new_token",
]  # fmt: skip


@dataclass
class Case:
    kernel: str
    shape: str
    run: Callable[[], object]  # the Triton launcher call
    ref: Callable[[], object] | None  # the reference call (None: not comparable)
    bytes: int  # minimum bytes moved by the kernel
    flops: int = 0
    check: Callable[[], float] | None = None  # max abs error vs the fp32 reference
    ref_graph: bool = False  # the reference is a device launch too: time it from a CUDA graph, like `graph`


class Timer:
    def __init__(self, device: torch.device, reps: int, flush_l2: bool):
        self.device, self.reps = device, reps
        self.cuda = device.type == "cuda"
        # 256 MiB written before each timed call evicts the H200's L2 (~60 MiB)
        self.flush = None
        if flush_l2 and self.cuda:
            self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)

    def eager(self, fn: Callable[[], object]) -> float:
        """Median seconds per call."""
        for _ in range(3):
            fn()
        if not self.cuda:
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)
        torch.cuda.synchronize()
        new_event = lambda: torch.cuda.Event(enable_timing=True)
        events = [(new_event(), new_event()) for _ in range(self.reps)]
        for start, end in events:
            if self.flush is not None:
                self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3

    def graph(self, fn: Callable[[], object]) -> float | None:
        if not self.cuda:
            return None
        try:
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
        except Exception:  # a kernel that syncs cannot be captured: report eager only
            return None
        return self.eager(graph.replay)


def _randn(*shape, dtype, device):
    return torch.randn(*shape, device=device).to(dtype)


def _paged(batch: int, ctx: int, q_len: int, dtype, device):
    """A pool with shuffled blocks: q (batch*q_len, H, D), caches, block tables, cu_seqlens_q, seq_lens."""
    per_seq = (ctx + BLOCK_SIZE - 1) // BLOCK_SIZE
    num_blocks = batch * per_seq + 1
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache, v_cache = _randn(*shape, dtype=dtype, device=device), _randn(*shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks - 1, device=device)[: batch * per_seq].view(batch, per_seq).int()
    cu = torch.arange(0, batch + 1, device=device, dtype=torch.int32) * q_len
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    q = _randn(batch * q_len, NUM_HEADS, HEAD_DIM, dtype=dtype, device=device)
    return q, k_cache, v_cache, tables, cu, seq_lens


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _f32(*ts):
    return [t.float() if t.is_floating_point() else t for t in ts]


def qkv_weight(dtype, device) -> torch.Tensor:
    """A qkv projection's weight at the bench shape ((H + 2 HK) * D, hidden), scaled to unit outputs."""
    return (
        _randn((NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, HIDDEN, dtype=dtype, device=device) * HIDDEN**-0.5
    )


def qkv_new_token_inputs(b: int, dtype, device) -> tuple[torch.Tensor, tuple]:
    """kernels.qkv_new_token's inputs for b new tokens but the weight: (x, the arguments after the weight)."""
    x = _randn(b, HIDDEN, dtype=dtype, device=device)
    inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
    nw = [(1 + 0.1 * _randn(HEAD_DIM, dtype=torch.float32, device=device)).to(dtype) for _ in range(2)]
    nb = b // BLOCK_SIZE + 2
    kc = torch.zeros(nb, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    slots = torch.randperm(nb * BLOCK_SIZE, device=device)[:b]
    pos = torch.randint(0, 8192, (b,), device=device)
    return x, (NUM_HEADS, NUM_KV_HEADS, nw[0], nw[1], 1e-6, 1e-6, pos, ref.rope_cos_sin(inv_freq, 8192), kc,
               torch.zeros_like(kc), slots)  # fmt: skip


def build_cases(dtype, device, tiny: bool, only: set[str]) -> list[Case]:
    from kernels.activation import silu_and_mul
    from kernels.bitmask import apply_token_bitmask_
    from kernels.decode_attention import paged_decode_attention
    from kernels.kv_cache import store_kv
    from kernels.prefill_attention import paged_prefill_attention
    from kernels.rmsnorm import fused_add_rms_norm, rms_norm
    from kernels.rope import apply_rope

    elt = torch.tensor([], dtype=dtype).element_size()
    scale = HEAD_DIM**-0.5
    cases: list[Case] = []
    # decode: (batch, context); prefill: (batch, context, new tokens per sequence)
    decode_shapes = [(b, c) for b in (1, 32) for c in (512, 1024, 2048, 4096)]
    prefill_shapes = [(32, 128, 128), (32, 1024, 128), (1, 3764, 100), (1, 4096, 4096)]
    if tiny:
        decode_shapes, prefill_shapes = [(1, 64), (2, 100)], [(2, 16, 16), (2, 40, 8)]
    tokens = [8] if tiny else [32, 4096]

    if "decode" in only:
        for b, ctx in decode_shapes:
            q, kc, vc, bt, _, sl = _paged(b, ctx, 1, dtype, device)
            out = torch.empty_like(q)
            max_len = ctx

            def run(q=q, kc=kc, vc=vc, bt=bt, sl=sl, out=out, max_len=max_len):
                return paged_decode_attention(q, kc, vc, bt, sl, scale, out=out, max_seq_len=max_len)

            def check(q=q, kc=kc, vc=vc, bt=bt, sl=sl, run=run):
                return _err(run(), ref.decode_attention(*_f32(q, kc, vc), bt, sl, scale))

            cases.append(Case(
                "decode", f"B={b} ctx={ctx}", run,
                lambda q=q, kc=kc, vc=vc, bt=bt, sl=sl: ref.decode_attention(q, kc, vc, bt, sl, scale),
                2 * b * ctx * NUM_KV_HEADS * HEAD_DIM * elt + 2 * q.numel() * elt,
                4 * b * ctx * NUM_HEADS * HEAD_DIM, check,
            ))  # fmt: skip

    if "prefill" in only:
        for b, ctx, qlen in prefill_shapes:
            q, kc, vc, bt, cu, sl = _paged(b, ctx, qlen, dtype, device)
            out = torch.empty_like(q)

            def run(q=q, kc=kc, vc=vc, bt=bt, cu=cu, sl=sl, out=out, qlen=qlen):
                return paged_prefill_attention(q, kc, vc, bt, cu, sl, qlen, scale, out=out)

            def check(q=q, kc=kc, vc=vc, bt=bt, cu=cu, sl=sl, run=run):
                return _err(run(), ref.paged_attention(*_f32(q, kc, vc), bt, cu, sl, scale))

            # causal pairs: each query sees the cached prefix and the new tokens up to itself
            pairs = b * (qlen * (ctx - qlen) + qlen * (qlen + 1) // 2)
            cases.append(Case(
                "prefill", f"{b}x{qlen} ctx={ctx}", run,
                lambda q=q, kc=kc, vc=vc, bt=bt, cu=cu, sl=sl: ref.paged_attention(
                    q, kc, vc, bt, cu, sl, scale
                ),
                2 * q.numel() * elt + 2 * b * ctx * NUM_KV_HEADS * HEAD_DIM * elt,
                4 * pairs * NUM_HEADS * HEAD_DIM, check,
            ))  # fmt: skip

    for n in tokens:
        if "store_kv" in only:
            k = _randn(n, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
            v = _randn(n, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
            nb = n // BLOCK_SIZE + 2
            kc = torch.zeros(nb, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
            vc = torch.zeros_like(kc)
            slots = torch.randperm(nb * BLOCK_SIZE, device=device)[:n]

            def check(k=k, v=v, kc=kc, vc=vc, slots=slots):
                store_kv(k, v, kc, vc, slots)
                kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
                ref.store_kv(k, v, kr, vr, slots)
                return max(_err(kc, kr), _err(vc, vr))

            cases.append(Case(
                "store_kv", f"{n} tokens", lambda k=k, v=v, kc=kc, vc=vc, s=slots: store_kv(k, v, kc, vc, s),
                lambda k=k, v=v, kc=kc, vc=vc, s=slots: ref.store_kv(k, v, kc, vc, s), 4 * k.numel() * elt,
                check=check,
            ))  # fmt: skip
        x = _randn(n, HIDDEN, dtype=dtype, device=device)
        w = _randn(HIDDEN, dtype=dtype, device=device)
        if "rms_norm" in only:
            cases.append(Case(
                "rms_norm", f"{n}x{HIDDEN}", lambda x=x, w=w: rms_norm(x, w, 1e-6),
                lambda x=x, w=w: ref.rms_norm(x, w, 1e-6), 2 * x.numel() * elt,
                check=lambda x=x, w=w: _err(rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6)),
            ))  # fmt: skip
        if "fused_add_rms_norm" in only:
            res = _randn(n, HIDDEN, dtype=dtype, device=device)
            xs, rs = x.clone(), res.clone()

            def check(x=x, res=res, w=w):
                a, _ = fused_add_rms_norm(x.clone(), res.clone(), w, 1e-6)
                return _err(a, ref.fused_add_rms_norm(x, res, w, 1e-6)[0])

            cases.append(Case(
                "fused_add_rms_norm", f"{n}x{HIDDEN} in place",
                lambda xs=xs, rs=rs, w=w: fused_add_rms_norm(xs, rs, w, 1e-6),
                lambda x=x, res=res, w=w: ref.fused_add_rms_norm(x, res, w, 1e-6), 4 * x.numel() * elt,
                check=check,
            ))  # fmt: skip
        if "rope" in only:
            qkv = _randn(n, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
            q, k = qkv[:, :NUM_HEADS], qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS]
            inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
            cos_sin = ref.rope_cos_sin(inv_freq, 8192)
            pos = torch.randint(0, 8192, (n,), device=device)

            def check(q=q, k=k, pos=pos, cos_sin=cos_sin):
                eq, ek = ref.apply_rope(q, k, pos, cos_sin)
                gq, gk = apply_rope(q.clone(), k.clone(), pos, cos_sin)
                return max(_err(gq, eq), _err(gk, ek))

            cases.append(Case(
                "rope", f"{n} tokens, qkv view", lambda q=q, k=k, p=pos, cs=cos_sin: apply_rope(q, k, p, cs),
                lambda q=q, k=k, p=pos, cs=cos_sin: ref.apply_rope(q, k, p, cs),
                2 * n * (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM * elt + n * HEAD_DIM * 4, check=check,
            ))  # fmt: skip
        if "qk_norm_rope_store" in only:
            from kernels.qk_norm_rope import qk_norm_rope_store_kv

            qkv = _randn(n, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
            q, k = qkv[:, :NUM_HEADS], qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS]
            v = qkv[:, NUM_HEADS + NUM_KV_HEADS :]
            inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
            cos_sin = ref.rope_cos_sin(inv_freq, 8192)
            pos = torch.randint(0, 8192, (n,), device=device)
            nw = [_randn(HEAD_DIM, dtype=dtype, device=device) for _ in range(2)]
            nb = n // BLOCK_SIZE + 2
            kc = torch.zeros(nb, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
            vc = torch.zeros_like(kc)
            slots = torch.randperm(nb * BLOCK_SIZE, device=device)[:n]
            args = (nw[0], nw[1], 1e-6, pos, cos_sin, kc, vc, slots)

            def check(q=q, k=k, v=v, args=args):
                eq, ek = ref.qk_norm_rope_store_kv(q, k, v, *args)
                gq, gk = qk_norm_rope_store_kv(q.clone(), k.clone(), v, *args)
                return max(_err(gq, eq), _err(gk, ek))

            def unfused(q=q, k=k, v=v, w=nw, pos=pos, cs=cos_sin, kc=kc, vc=vc, s=slots):
                # the four launches it replaces, on the Triton kernels
                qn = rms_norm(q.reshape(-1, HEAD_DIM), w[0], 1e-6)
                kn = rms_norm(k.reshape(-1, HEAD_DIM), w[1], 1e-6)
                qr, kr = apply_rope(qn.view(q.shape), kn.view(k.shape), pos, cs)
                store_kv(kr, v, kc, vc, s)

            cases.append(Case(
                "qk_norm_rope_store", f"{n} tokens (vs 4 triton)",
                lambda q=q, k=k, v=v, args=args: qk_norm_rope_store_kv(q, k, v, *args), unfused,
                2 * n * (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM * elt, check=check,
            ))  # fmt: skip
        if "silu_and_mul" in only:
            gu = _randn(n, 2 * INTERMEDIATE, dtype=dtype, device=device)
            cases.append(Case(
                "silu_and_mul", f"{n}x{2 * INTERMEDIATE}", lambda gu=gu: silu_and_mul(gu),
                lambda gu=gu: ref.silu_and_mul(gu), 3 * n * INTERMEDIATE * elt,
                check=lambda gu=gu: _err(silu_and_mul(gu), ref.silu_and_mul(gu)),
            ))  # fmt: skip

    if "bitmask" in only:
        for b in [2] if tiny else [1, 32, 256]:
            vocab = 1000 if tiny else VOCAB
            logits = _randn(b, vocab, dtype=torch.float32, device=device)
            words = (vocab + 31) // 32
            mask = torch.randint(-(2**31), 2**31 - 1, (b, words), dtype=torch.int32, device=device)

            def check(logits=logits, mask=mask):
                a, r = logits.clone(), logits.clone()
                apply_token_bitmask_(a, mask)
                ref.apply_token_bitmask_(r, mask)
                return 0.0 if torch.equal(a, r) else float("inf")

            cases.append(Case(
                "bitmask", f"{b}x{vocab} fp32", lambda lg=logits, m=mask: apply_token_bitmask_(lg, m),
                lambda lg=logits, m=mask: ref.apply_token_bitmask_(lg, m),
                b * vocab * 4 // 2 + mask.numel() * 4, check=check,
            ))  # fmt: skip
    if "order" in only:  # the wide decode's rows longest first: one launch against the device argsort
        from kernels.order import longest_first

        for b in [5] if tiny else [32, 128, 256]:
            lens = torch.randint(100, 2048, (b,), dtype=torch.int32, device=device)
            argsort = lambda lens=lens: torch.argsort(lens, descending=True).to(torch.int32)
            wrong = lambda lens=lens: float(longest_first(lens).tolist() != ref.longest_first(lens).tolist())
            cases.append(Case(
                "order", f"{b} rows", lambda lens=lens: longest_first(lens), argsort, 8 * b, check=wrong,
                ref_graph=True,
            ))  # fmt: skip
    if "qkv_new_token" in only:  # the wide folded decode steps' qkv projection with the new token's work
        from kernels.qkv_new_token import qkv_new_token

        for b in [5] if tiny else [160, 256]:
            w = qkv_weight(dtype, device)
            x, rest = qkv_new_token_inputs(b, dtype, device)
            args = (x, w, *rest)
            cases.append(Case(
                "qkv_new_token", f"{b}x{w.shape[0]}x{HIDDEN}", lambda a=args: qkv_new_token(*a),
                lambda a=args: ref.qkv_new_token(*a), (w.numel() + 2 * x.numel()) * elt,
                flops=2 * b * w.numel(), check=lambda a=args: _err(qkv_new_token(*a), ref.qkv_new_token(*a)),
                ref_graph=True,
            ))  # fmt: skip
    return cases + _gemv_sample_cases(dtype, device, tiny, only)


PREFILL_SWEEP = [
    (64, 64, 4, 3), (64, 32, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (32, 64, 4, 3), (16, 64, 4, 3),
    (64, 64, 4, 2), (64, 64, 8, 3), (32, 32, 4, 3), (32, 64, 4, 4), (32, 128, 4, 2), (64, 32, 8, 3),
    (64, 128, 8, 2), (32, 64, 8, 3),
]  # fmt: skip
DECODE_SWEEP = [
    (64, 4, 3), (32, 4, 3), (128, 4, 3), (64, 8, 3), (128, 8, 3), (64, 4, 2), (32, 4, 4), (16, 4, 4),
]  # fmt: skip
SPLITS_SWEEP = [1, 2, 4, 8, 16, 32, 64]


def sweep(dtype, device, timer: Timer, tiny: bool, only: set[str] = frozenset({"prefill", "decode"})) -> None:
    """Times the attention kernels over tile configurations and decode split counts; prints the best.
    Put the winners into PREFILL_CONFIGS (kernels/prefill_attention.py) and DECODE_CONFIGS /
    choose_num_splits (kernels/decode_launch.py).
    `only`: the kernels of --only swept ("prefill", "decode")."""
    from kernels import decode_attention as da
    from kernels import decode_launch as dl
    from kernels import prefill_attention as pf
    from kernels._jit import sm_count

    key = "interpret" if device.type == "cpu" else ("fp32" if dtype == torch.float32 else "16bit")
    scale = HEAD_DIM**-0.5
    prefill_default, decode_defaults = pf.PREFILL_CONFIGS[key], dict(dl.DECODE_CONFIGS)
    # (batch, context, new tokens): W1 prompts, W2-like cached prefix, M1's turn 10, one long prompt, a
    # W2 prefill step (8,192 tokens of ~585-token prompts)
    prefill_shapes = [(32, 128, 128), (32, 1024, 128), (1, 3764, 100), (1, 4096, 4096), (14, 585, 585)]
    if tiny:
        prefill_shapes = [(2, 16, 16)]
    if "prefill" not in only:
        prefill_shapes = []
    decode_shapes = [(1, 64)] if tiny else [(b, c) for b in (1, 32, 256) for c in (256, 1024, 4096)]
    if "decode" not in only:
        decode_shapes = []
    prefill_sweep = [(16, 16, 4, 1)] if tiny else PREFILL_SWEEP
    decode_sweep = [(16, 4, 1)] if tiny else DECODE_SWEEP
    splits_sweep = [1, 2] if tiny else SPLITS_SWEEP
    try:
        print("# prefill: (BLOCK_M, BLOCK_N, warps, stages) -> us (graph replay if possible)")
        for b, ctx, qlen in prefill_shapes:
            q, kc, vc, bt, cu, sl = _paged(b, ctx, qlen, dtype, device)
            results = []
            for cfg in prefill_sweep:
                pf.PREFILL_CONFIGS[key] = cfg
                fn = lambda q=q, kc=kc, vc=vc, bt=bt, cu=cu, sl=sl, qlen=qlen: pf.paged_prefill_attention(
                    q, kc, vc, bt, cu, sl, qlen, scale
                )
                try:
                    t = timer.graph(fn) or timer.eager(fn)
                except Exception as exc:  # a config the chip cannot hold
                    print(f"  {cfg}: {type(exc).__name__}")
                    continue
                results.append((t, cfg))
            results.sort()
            cells = "  ".join(f"{c}={t * 1e6:.1f}" for t, c in results)
            print(f"prefill {b}x{qlen} ctx={ctx}: best {results[0][1]}  | {cells}")
        if decode_shapes:
            print("# decode: (BLOCK_N, warps, stages) x num_splits -> us")
        for b, ctx in decode_shapes:
            q, kc, vc, bt, _, sl = _paged(b, ctx, 1, dtype, device)
            results = []
            for cfg in decode_sweep:
                dl.DECODE_CONFIGS[key] = cfg
                if key == "16bit":
                    dl.DECODE_CONFIGS["16bit_wide"] = dl.DECODE_CONFIGS["16bit_wide_table"] = cfg
                for splits in splits_sweep:
                    if splits > 1 and ctx // splits < cfg[0]:
                        continue
                    fn = lambda q=q, kc=kc, vc=vc, bt=bt, sl=sl, s=splits: da.paged_decode_attention(
                        q, kc, vc, bt, sl, scale, num_splits=s
                    )
                    try:
                        t = timer.graph(fn) or timer.eager(fn)
                    except Exception as exc:
                        print(f"  {cfg} splits={splits}: {type(exc).__name__}")
                        continue
                    results.append((t, cfg, splits))
            results.sort()
            auto = dl.choose_num_splits(b, NUM_KV_HEADS, ctx, sm_count(device))
            top = "  ".join(f"{c}/{s}={t * 1e6:.1f}" for t, c, s in results[:6])
            print(f"decode B={b} ctx={ctx}: auto splits {auto}; best {top}")
        if "decode" in only:
            _sweep_fused_decode(key, dtype, device, timer, tiny, decode_sweep, splits_sweep)
    finally:
        pf.PREFILL_CONFIGS[key] = prefill_default
        dl.DECODE_CONFIGS.update(decode_defaults)


def _new_token(seq_lens: torch.Tensor, tables: torch.Tensor, dtype, device):
    """The fused decode launch's inputs for a batch whose contexts end at seq_lens (b,): raw q (b, H, D)
    and the new token's NewTokenQK (its K/V go to each sequence's slot of its last position)."""
    from kernels.decode_launch import NewTokenQK

    b = seq_lens.shape[0]
    qkv = _randn(b, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    pos = seq_lens.to(device=device, dtype=torch.int64) - 1
    slots = tables.long().gather(1, (pos // BLOCK_SIZE)[:, None])[:, 0] * BLOCK_SIZE + pos % BLOCK_SIZE
    inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, HEAD_DIM, 2, device=device).float() / HEAD_DIM))
    nw = [(1 + 0.1 * _randn(HEAD_DIM, dtype=torch.float32, device=device)).to(dtype) for _ in range(2)]
    new = NewTokenQK(
        qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS], qkv[:, NUM_HEADS + NUM_KV_HEADS :], nw[0], nw[1], 1e-6,
        pos, ref.rope_cos_sin(inv_freq, int(seq_lens.max())), slots,
    )  # fmt: skip
    return qkv[:, :NUM_HEADS], new


def _sweep_fused_decode(key: str, dtype, device, timer: Timer, tiny: bool, configs, splits_sweep) -> None:
    """The engine's decode launch (q/k norm, RoPE and the new K/V store before the attention) at the
    decode shapes of W3 (one stream), W1 (32 x ~256) and W2 (256 x ~860) over the same configs."""
    from kernels import decode_attention as da
    from kernels import decode_launch as dl
    from kernels._jit import sm_count

    print("# fused decode (q/k norm + RoPE + K/V store + attention): (BLOCK_N, warps, stages) x splits -> us")
    print("# (batch 1 split: the peeled launch, the swept (BLOCK_N, warps) with PEEL_STAGES stages)")
    default_peel = dl.PEEL_TILE
    for b, ctx in [(1, 64)] if tiny else [(1, 768), (1, 4096), (32, 256), (256, 860)]:
        _, kc, vc, bt, _, sl = _paged(b, ctx, 1, dtype, device)
        q, new = _new_token(torch.full((b,), ctx, device=device), bt, dtype, device)
        results = []
        try:
            for cfg, splits in itertools.product(configs, splits_sweep):
                if splits > 1 and ctx // splits < cfg[0]:
                    continue
                dl.DECODE_CONFIGS[key] = cfg
                dl.PEEL_TILE = tuple(cfg[:2])
                if key == "16bit":
                    dl.DECODE_CONFIGS["16bit_wide"] = dl.DECODE_CONFIGS["16bit_wide_table"] = cfg
                fn = lambda q=q, kc=kc, vc=vc, bt=bt, sl=sl, new=new, s=splits: da.paged_decode_attention(
                    q, kc, vc, bt, sl, HEAD_DIM**-0.5, num_splits=s, new_token=new
                )
                try:
                    t = timer.graph(fn) or timer.eager(fn)
                except Exception as exc:
                    print(f"  {cfg} splits={splits}: {type(exc).__name__}")
                    continue
                results.append((t, cfg, splits))
        finally:
            dl.PEEL_TILE = default_peel
        results.sort()
        auto = dl.choose_num_splits(b, NUM_KV_HEADS, 4096, sm_count(device))
        top = "  ".join(f"{c}/{s}={t * 1e6:.1f}" for t, c, s in results[:8])
        print(f"fused decode B={b} ctx={ctx}: engine splits {auto} (graphs: bound 4096); best {top}")


RAGGED_BATCHES = (24, 48, 96, 160, 256)
RAGGED_SWEEP = [1, 2, 4, 8]  # num_splits


def sweep_ragged(dtype, device, timer: Timer, tiny: bool) -> None:
    """Decode attention over ragged contexts (uniform in 256-2048 keys, as in W2's steps) at batch
    sizes that fill the SMs one to a few times: by split count, then unsplit (head-major) in row order
    and longest first (`order`), then the wide tile
    configurations at the largest batch with the engine's dispatch. GB/s of K/V read; the first line is
    what a plain streaming read (torch sum over 2 GiB) reaches on this device."""
    from kernels import decode_attention as da
    from kernels import decode_launch as dl
    from kernels._jit import sm_count

    stream = torch.ones((1 << 20) if tiny else (1 << 30), dtype=torch.bfloat16, device=device)
    t = timer.eager(stream.sum)
    print(f"# streaming read: {stream.numel() * 2 / t / 1e9:.0f} GB/s")
    del stream
    print("# ragged decode: num_splits -> us (GB/s of K/V read)")
    gen = torch.Generator().manual_seed(0)
    wide = dl.wide_config_key(True)  # the block-table row held in registers
    key = "interpret" if device.type == "cpu" else ("fp32" if dtype == torch.float32 else wide)
    default = dl.DECODE_CONFIGS[key]

    def timed(batch, splits, ordered: bool, fused: bool = False) -> str:
        q, kc, vc, bt, sl, order, nbytes = batch
        o = order if ordered else None
        nt = None
        if fused:  # the raw q of a qkv row, as the engine passes it
            q, nt = _new_token(sl, bt, q.dtype, q.device)
        fn = lambda: da.paged_decode_attention(
            q, kc, vc, bt, sl, HEAD_DIM**-0.5, num_splits=splits, order=o, new_token=nt
        )
        t = timer.graph(fn) or timer.eager(fn)
        return f"{t * 1e6:.1f} ({nbytes / t / 1e9:.0f})"

    try:
        for b in (4,) if tiny else RAGGED_BATCHES:
            top = 64 if tiny else 2048
            q, kc, vc, bt, _, _ = _paged(b, top, 1, dtype, device)
            sl = torch.randint(top // 8, top + 1, (b,), generator=gen).to(device=device, dtype=torch.int32)
            order = dl.longest_first(sl)
            kv_bytes = int(sl.sum()) * NUM_KV_HEADS * HEAD_DIM * 2 * kc.element_size()
            batch = (q, kc, vc, bt, sl, order, kv_bytes)
            auto = dl.choose_num_splits(b, NUM_KV_HEADS, 4096, sm_count(device))
            row = "  ".join(f"{s}={timed(batch, s, False)}" for s in ([1, 2] if tiny else RAGGED_SWEEP))
            print(f"ragged B={b} ({kv_bytes / 1e6:.0f} MB): engine {auto}; {row}")
            cells = [f"{name}={timed(batch, 1, o)}" for name, o in (("rows", False), ("longest-first", True))]
            ordered = dl.wants_order(b, NUM_KV_HEADS, device)
            cells.append(
                f"engine with the new token's norm, RoPE and store={timed(batch, None, ordered, True)}"
            )
            print(f"  unsplit by dispatch: {'  '.join(cells)}")
        for fused in (False, True):
            cells = []
            for cfg in [(16, 4, 1)] if tiny else DECODE_SWEEP:
                dl.DECODE_CONFIGS[key] = cfg
                try:
                    cells.append(f"{cfg}={timed(batch, 1, ordered, fused)}")
                except Exception as exc:  # a config the chip cannot hold
                    cells.append(f"{cfg}={type(exc).__name__}")
            what = "with the new token fused" if fused else "engine dispatch"
            print(f"  B={b} (BLOCK_N, warps, stages), {what}: {'  '.join(cells)}")
    finally:
        dl.DECODE_CONFIGS[key] = default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kernels",
        description="Micro-benchmarks of the Triton kernels vs their torch references (Qwen3-0.6B shapes: "
        f"{NUM_HEADS} q heads, {NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, hidden {HIDDEN}; cache block "
        f"size {BLOCK_SIZE}). Decode: batch 1 and 32 at context 512-4096; prefill: 32x128 new tokens, "
        "32x128 after a 896-token cached prefix, M1's 100 tokens after 3664 cached, 1x4096.",
    )
    parser.add_argument("--only", default=",".join(KERNELS), help=f"comma list from: {','.join(KERNELS)}")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per measurement (median)")
    parser.add_argument("--no-ref", action="store_true", help="skip timing the torch references")
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph replay timing")
    parser.add_argument("--no-check", action="store_true", help="skip the error check vs the fp32 reference")
    parser.add_argument("--flush-l2", action="store_true", help="write 256 MiB before each timed call")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (smoke test; allowed on the CPU)")
    parser.add_argument("--sweep", action="store_true",
                        help="instead: sweep attention tile configs and decode split counts")  # fmt: skip
    parser.add_argument("--sweep-tail", action="store_true",
                        help="instead: time the one-launch decode layer tail (kernels.decode_tail) over "
                        "configurations against its four projections launched one by one")  # fmt: skip
    parser.add_argument("--sweep-ragged", action="store_true",
                        help="instead: time decode attention over ragged contexts by splits")  # fmt: skip
    parser.add_argument("--sweep-gemv", default="",
                        help="instead: sweep kernels.gemv configs vs cuBLAS at these M (comma list), "
                        "and time the fused sampling")  # fmt: skip
    parser.add_argument("--sweep-lm-head", action="store_true",
                        help="instead: time the lm_head + sampling at M = 1, 2, 4 (F.linear then "
                        "sample_tokens) against kernels.lm_head_sample's one launch over block "
                        "configs")  # fmt: skip
    from bench import switches as bench_switches

    bench_switches.add_option(parser, "flip a module-level switch for this run (as chatloom bench --set)")
    args = parser.parse_args(argv)
    for name, value in bench_switches.apply_or_exit(parser, args.set).items():
        print(f"# set {name} = {value!r}")

    only = {k.strip() for k in args.only.split(",") if k.strip()}
    unknown = only - set(KERNELS)
    if unknown:
        parser.error(f"unknown kernels: {sorted(unknown)}")
    if torch.cuda.is_available():
        device = torch.device("cuda")
        torch.backends.cuda.matmul.allow_tf32 = False
    elif args.tiny:
        device = torch.device("cpu")
        args.reps = min(args.reps, 3)
        if args.dtype == "bf16":  # bf16 is silently wrong in Triton's interpreter
            args.dtype = "fp32"
    else:
        parser.error("needs a CUDA device (or --tiny to smoke-test on the CPU through Triton's interpreter)")

    torch.manual_seed(0)
    timer = Timer(device, args.reps, args.flush_l2)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (triton interpreter)"
    import triton

    print(f"# {name}  torch {torch.__version__}  triton {triton.__version__}  dtype {args.dtype}  "
          f"reps {args.reps}  flush_l2 {args.flush_l2}")  # fmt: skip
    if args.sweep:
        sweep(DTYPES[args.dtype], device, timer, args.tiny, only)
        return 0
    if args.sweep_ragged:
        sweep_ragged(DTYPES[args.dtype], device, timer, args.tiny)
        return 0
    if args.sweep_tail:
        if device.type != "cuda":
            parser.error("--sweep-tail needs a CUDA device")
        sweep_tail(DTYPES[args.dtype], device)
        return 0
    if args.sweep_lm_head:
        sweep_lm_head(DTYPES[args.dtype], device, timer, args.tiny)
        return 0
    if args.sweep_gemv:
        if device.type != "cuda":
            parser.error("--sweep-gemv needs a CUDA device")
        sweep_gemv(DTYPES[args.dtype], device, [int(m) for m in args.sweep_gemv.split(",")])
        sweep_sampling(device)
        return 0
    header = f"{'kernel':<19} {'shape':<22} {'triton us':>10} {'graph us':>9} {'torch us':>10} "
    header += f"{'speedup':>8} {'GB/s':>8} {'TFLOP/s':>8} {'err':>9}"
    print(header)
    for case in build_cases(DTYPES[args.dtype], device, args.tiny, only):
        t_tri = timer.eager(case.run)
        t_graph = None if args.no_graph else timer.graph(case.run)
        t_ref = None if args.no_ref or case.ref is None else timer.eager(case.ref)
        t_base = t_tri
        if t_ref is not None and case.ref_graph and t_graph is not None:  # graph against graph
            t_ref, t_base = timer.graph(case.ref) or t_ref, t_graph
        best = min(t for t in (t_tri, t_graph) if t is not None)
        err = None if args.no_check or case.check is None else case.check()
        fmt = lambda t: "-" if t is None else f"{t * 1e6:.1f}"
        speed = "-" if t_ref is None else f"{t_ref / t_base:.2f}x"
        tflops = f"{case.flops / best / 1e12:.1f}" if case.flops else "-"
        err_s = "-" if err is None else f"{err:.2e}"
        print(
            f"{case.kernel:<19} {case.shape:<22} {fmt(t_tri):>10} {fmt(t_graph):>9} {fmt(t_ref):>10} "
            f"{speed:>8} {case.bytes / best / 1e9:>8.1f} {tflops:>8} {err_s:>9}"
        )
    return 0


# ---- GEMV (decode projections) and fused sampling --------------------------------------------------

GEMV_SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}


def _streamed(call: Callable[[int], object], copies: int, reps: int) -> float:
    """Seconds per call of call(i) over `copies` weight copies, captured in one CUDA graph and replayed:
    each call reads its weights from HBM (the copies are several times the L2), as in a decode step."""
    for i in range(copies):
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            call(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / copies)
    return statistics.median(times)


def tail_layers(dtype, device, copies: int) -> list:
    """`copies` layers' tail weights (reference.TailWeights, no biases) at the Qwen3-0.6B shapes, random,
    each scaled by 1/sqrt(its input width): enough of them that streaming all evicts the first from L2."""
    from kernels.reference import TailWeights

    r = lambda *shape: _randn(*shape, dtype=dtype, device=device) * shape[-1] ** -0.5
    norm = lambda: (1 + 0.1 * torch.randn(HIDDEN, device=device)).to(dtype)
    inter, width, nq = INTERMEDIATE, NUM_HEADS * HEAD_DIM, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    return [
        TailWeights(r(HIDDEN, width), None, norm(), 1e-6, r(2 * inter, HIDDEN), None, r(HIDDEN, inter), None,
                    norm(), 1e-6, r(nq, HIDDEN), None)
        for _ in range(copies)
    ]  # fmt: skip


def sweep_tail(dtype, device, reps: int = 10) -> None:
    """Times kernels.decode_tail (o_proj -> norm + gate_up -> SiLU + down -> next norm + qkv in one
    launch with grid barriers) over configurations against the same four projections launched one by
    one (what the engine ran before), at the Qwen3-0.6B shapes, 8 layers' weights streamed from HBM;
    then the default configuration (the one the engine launches)."""
    from kernels import cooperative
    from kernels import dispatch as ops
    from kernels import reference as ref
    from kernels.decode_tail import TailConfig, decode_layer_tail

    copies = 8
    width = NUM_HEADS * HEAD_DIM
    ws = tail_layers(dtype, device, copies)
    mib = sum(t.numel() * t.element_size() for t in ws[0] if isinstance(t, torch.Tensor)) / 2**20
    print(f"# decode layer tail ({mib:.0f} MiB of weights a layer): us per layer (graph replay of {copies})")
    shapes = ((4, 4), (3, 4), (2, 4), (5, 4), (6, 4), (1, 8), (2, 8), (3, 8), (1, 16))
    configs = [TailConfig(*c) for c in shapes]
    for m in (1,):
        a, res = _randn(m, width, dtype=dtype, device=device), _randn(m, HIDDEN, dtype=dtype, device=device)
        expect, _ = ref.decode_layer_tail(a.float(), res.float(), ref.TailWeights(*(
            t.float() if isinstance(t, torch.Tensor) else t for t in ws[0])))  # fmt: skip
        by_op = lambda i, a=a, res=res: ops.decode_layer_tail_by_op(a, res, ws[i])
        t_ops = _streamed(by_op, copies, reps)
        staged = lambda i, a=a, res=res: decode_layer_tail(a, res, ws[i], fused=False)
        t_staged = _streamed(staged, copies, reps)
        results = []
        for cfg in configs:
            try:
                got, _ = decode_layer_tail(a, res, ws[0], config=cfg)
                err = _err(got, expect) / expect.abs().max().item()
                t = _streamed(lambda i, a=a, res=res, cfg=cfg: decode_layer_tail(a, res, ws[i], config=cfg),
                              copies, reps)  # fmt: skip
            except Exception as exc:  # a config the chip cannot hold
                print(f"  M={m} {tuple(cfg)}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            resident = [c for k, c in cooperative._RESIDENT.items() if k[2] == cfg]
            if resident and resident[-1] != cfg:  # lowered to what stays resident: time it once
                if any(c == resident[-1] for _, c, _ in results):
                    continue
                cfg = resident[-1]
            results.append((t, cfg, err))
        results.sort(key=lambda x: x[0])
        gbs = mib * 2**20 / 1e12
        print(f"tail M={m}: per op {t_ops * 1e6:.2f} us, staged launches {t_staged * 1e6:.2f}, "
              f"one launch best {results[0][0] * 1e6:.2f} ({gbs / results[0][0]:.2f} TB/s) "
              f"{tuple(results[0][1])} rel_err {results[0][2]:.1e}")  # fmt: skip
        print("    top: " + "  ".join(f"{tuple(c)}={t * 1e6:.2f}" for t, c, _ in results[:6]))
        t_default = _streamed(lambda i, a=a, res=res: decode_layer_tail(a, res, ws[i]), copies, reps)
        print(f"    default config: {t_default * 1e6:.2f} us")
        try:
            from kernels import decode_tail_tma as tma
        except ImportError as exc:  # a Triton without Gluon's Hopper TMA
            print(f"    TMA tail: unavailable ({exc})")
            continue
        if not tma.fits(m, dtype, ws[0], device):
            print("    TMA tail: does not fit these shapes or this device")
            continue
        got, _ = tma.decode_layer_tail(a, res, ws[0])
        err = _err(got, expect) / expect.abs().max().item()
        t_tma = _streamed(lambda i, a=a, res=res: tma.decode_layer_tail(a, res, ws[i]), copies, reps)
        print(f"    TMA tail (kernels.decode_tail_tma): {t_tma * 1e6:.2f} us ({gbs / t_tma:.2f} TB/s) "
              f"rel_err {err:.1e}")  # fmt: skip
        _sweep_tail_then_attention(tma, a, res, ws, reps)


def _sweep_tail_then_attention(tma, a, res, ws, reps: int) -> None:
    """The TMA tail and then the next layer's fused decode attention (a layer at batch 1 as the engine
    launches it) at W3's middle context (768 keys), 8 layers' weights and caches streamed, with
    programmatic dependent launch (kernels.pdl) on and off."""
    from kernels import dispatch as ops
    from kernels import pdl

    caches = []
    for _ in ws:
        _, kc, vc, bt, _, sl = _paged(1, 768, 1, a.dtype, a.device)
        caches.append((kc, vc, bt, sl, _new_token(sl, bt, a.dtype, a.device)[1]))

    def layer(i: int) -> torch.Tensor:
        qkv, _ = tma.decode_layer_tail(a, res, ws[i])
        q, k, v = qkv.view(1, -1, HEAD_DIM).split([NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS], dim=1)
        kc, vc, bt, sl, t = caches[i]
        return ops.qk_norm_rope_decode_attention(
            q, k, v, t.q_norm_weight, t.k_norm_weight, t.eps, t.positions, t.cos_sin, kc, vc, t.slot_mapping,
            bt, sl, HEAD_DIM**-0.5,
        )  # fmt: skip

    times = {}
    saved = pdl.PDL
    try:
        for on in (True, False):
            pdl.PDL = on
            times[on] = _streamed(layer, len(ws), reps)
    finally:
        pdl.PDL = saved
    print(
        f"    tail then the fused decode attention launch (768 keys): {times[True] * 1e6:.2f} us with "
        f"programmatic dependent launch (kernels.pdl), {times[False] * 1e6:.2f} without"
    )


def _gemv_sweep_configs(m: int) -> list:
    from kernels.gemv import GemvConfig

    if m == 1:  # the (BLOCK_N, BLOCK_K) fp32 accumulator: <= 128 registers a thread
        return [GemvConfig("fma", bn, bk, 1, w, 1) for bn in (1, 2, 4, 8, 16) for bk in (512, 1024, 2048)
                for w in (2, 4, 8) if bn * bk <= 4096 * w]  # fmt: skip
    if m <= 8:
        fma = [GemvConfig("fma", bn, bk, 1, 4, 1) for bn in (2, 4, 8) for bk in (128, 256)
               if m * bn * bk <= 8192]  # fmt: skip
        dot = [GemvConfig("dot", 16, 128, s, 4, 3) for s in (1, 2, 4)] if m == 8 else []
        return fma + dot
    if m <= 32:
        return [GemvConfig("dot", bn, bk, s, 4, 3) for bn in (16, 32, 64) for bk in (128, 256)
                for s in (1, 2, 4)]  # fmt: skip
    return [GemvConfig("dot", bn, 128, s, 4, 3) for bn in (32, 64) for s in (1, 2, 4)]


def sweep_gemv(dtype, device, ms: list[int], reps: int = 10) -> None:
    """Times kernels.gemv configurations vs cuBLAS (F.linear) on the Qwen3-0.6B projections, weights
    streamed from HBM; prints the best per (shape, M) as TUNED entries for kernels/gemv.py, and the wins."""
    from kernels.gemv import block_m_for, choose_config, gemv

    elt = torch.tensor([], dtype=dtype).element_size()
    weights = {}
    for name, (n, k) in GEMV_SHAPES.items():
        copies = max(4, (256 << 20) // (n * k * elt))
        weights[name] = [_randn(n, k, dtype=dtype, device=device) for _ in range(copies)]
    tuned, wins = [], {}
    print("# gemv sweep: us per call (graph replay, weights streamed); TB/s of weight bytes")
    for m in ms:
        for name, (n, k) in GEMV_SHAPES.items():
            ws = weights[name]
            x = _randn(m, k, dtype=dtype, device=device)
            t_cublas = _streamed(lambda i, ws=ws, x=x: torch.nn.functional.linear(x, ws[i]), len(ws), reps)
            expect = torch.nn.functional.linear(x.float(), ws[0].float())
            results = []
            for cfg in _gemv_sweep_configs(m):
                try:
                    err = _err(gemv(x, ws[0], config=cfg), expect) / expect.abs().max().item()
                    t = _streamed(lambda i, ws=ws, x=x, cfg=cfg: gemv(x, ws[i], config=cfg), len(ws), reps)
                except Exception as exc:  # a config the chip cannot hold
                    print(f"  {name} M={m} {tuple(cfg)}: {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                results.append((t, tuple(cfg), err))
            results.sort()
            t_auto = _streamed(lambda i, ws=ws, x=x: gemv(x, ws[i]), len(ws), reps)
            best_t, best_cfg, best_err = results[0]
            tb = n * k * elt / 1e12
            print(f"{name:8} M={m:<3} cublas {t_cublas * 1e6:7.2f} ({tb / t_cublas:.2f} TB/s)  "
                  f"best {best_t * 1e6:7.2f} ({tb / best_t:.2f} TB/s) {best_cfg} rel_err {best_err:.1e}  "
                  f"auto {t_auto * 1e6:7.2f} {tuple(choose_config(m, n, k, device))}")  # fmt: skip
            print("    top: " + "  ".join(f"{c}={t * 1e6:.2f}" for t, c, _ in results[:5]))
            tuned.append(f"    ({n}, {k}, {block_m_for(m)}): GemvConfig{best_cfg},  # {name} M={m}: "
                         f"{best_t * 1e6:.2f} us vs cuBLAS {t_cublas * 1e6:.2f}")  # fmt: skip
            if best_t < 0.97 * t_cublas:
                wins[(n, k)] = max(wins.get((n, k), 0), m)
            if name == "down" and m == 1:  # silu_and_mul fused into the down projection's input
                from kernels.activation import silu_and_mul

                gu = _randn(m, 2 * k, dtype=dtype, device=device)
                t_two = _streamed(lambda i, ws=ws, gu=gu: gemv(silu_and_mul(gu), ws[i]), len(ws), reps)
                t_fused = _streamed(lambda i, ws=ws, gu=gu: gemv(gu, ws[i], silu_mul=True), len(ws), reps)
                print(f"    silu_and_mul + down: two launches {t_two * 1e6:.2f} us, "
                      f"fused {t_fused * 1e6:.2f} us")  # fmt: skip
            if name in ("qkv", "gate_up") and m == 1:  # the residual add + RMSNorm fused into the input
                _sweep_norm_gemv(name, m, k, ws, dtype, device, reps)
    print("TUNED = {\n" + "\n".join(tuned) + "\n}")
    print(f"wins (N, K) -> largest M: {wins}")


def _sweep_norm_gemv(name: str, m: int, k: int, ws: list, dtype, device, reps: int) -> None:
    from kernels.gemv import gemv
    from kernels.gemv_norm import add_rms_norm_gemv
    from kernels.rmsnorm import fused_add_rms_norm

    x, res = _randn(m, k, dtype=dtype, device=device), _randn(m, k, dtype=dtype, device=device)
    nw = _randn(k, dtype=dtype, device=device)
    # in place, as the engine runs it: the values drift over the replays, the times do not
    t_two = _streamed(lambda i: gemv(fused_add_rms_norm(x, res, nw, 1e-6)[0], ws[i]), len(ws), reps)
    t_fused = _streamed(lambda i: add_rms_norm_gemv(x, res, nw, 1e-6, ws[i]), len(ws), reps)
    t_first = _streamed(lambda i: add_rms_norm_gemv(x, None, nw, 1e-6, ws[i]), len(ws), reps)
    print(f"    fused_add_rms_norm + {name}: two launches {t_two * 1e6:.2f} us, fused {t_fused * 1e6:.2f} us "
          f"(no residual: {t_first * 1e6:.2f} us)")  # fmt: skip


def sweep_sampling(device, reps: int = 20) -> None:
    """Fused sampling (kernels.sampling) vs the engine's torch path (softmax, exponential_, divide,
    argmax; default generator: a private one cannot be captured), graph replay, float32 Qwen-vocab logits."""
    from kernels.sampling import sample_tokens

    for b in (1, 32, 256):
        logits = torch.randn(b, VOCAB, device=device) * 4
        temps = torch.full((b,), 0.6, device=device)
        t_fused = _streamed(lambda i, lg=logits, t=temps: sample_tokens(lg, t, 1234 + i), 8, reps)
        t_torch = _streamed(lambda i, lg=logits, t=temps: ref.sample_tokens(lg, t), 8, reps)
        print(f"sample B={b:<4} fused {t_fused * 1e6:7.2f} us  torch {t_torch * 1e6:7.2f} us  "
              f"({b * VOCAB * 4 / t_fused / 1e9:.0f} GB/s)")  # fmt: skip


def _lm_head_configs(m: int, sms: int, tiny: bool) -> list[dict]:
    """(BLOCK_N, warps) x programs per SM."""
    if tiny:
        return [dict(block_n=16, num_warps=4, num_programs=p) for p in (1, 4)]
    tiles = [(4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (16, 4), (16, 8)]
    return [dict(block_n=bn, num_warps=w, num_programs=pps * sms)
            for bn, w in tiles for pps in (4, 8, 12) if pps * sms * bn <= VOCAB]  # fmt: skip


def sweep_lm_head(dtype, device, timer: Timer, tiny: bool, reps: int = 10) -> None:
    """The end of a decode step: logits = F.linear(x, W) (cuBLAS) then kernels.sampling.sample_tokens,
    against kernels.lm_head_sample (both in one launch) over block configs, at the Qwen3-0.6B vocabulary
    (W is 311 MB in bf16, several times the L2: every call streams it from HBM); CUDA-graph replay of 4
    calls, the seed read from the device as the engine's graphs do; TB/s of W bytes. Each config is
    checked: its tokens equal sample_tokens on the logits it writes (`ok`), logits err vs F.linear."""
    from kernels._jit import sm_count
    from kernels.lm_head_sample import choose_config, lm_head_sample
    from kernels.sampling import sample_tokens

    n, k = (200, 32) if tiny else (VOCAB, HIDDEN)
    w = _randn(n, k, dtype=dtype, device=device) * k**-0.5 * 3
    tb = w.numel() * w.element_size() / 1e12
    timed = timer.eager if device.type != "cuda" else lambda fn: _streamed(lambda i: fn(), 4, reps)
    sms = sm_count(device) if device.type == "cuda" else 1
    us = lambda t: f"{t * 1e6:8.2f} us ({tb / t:.2f} TB/s)"
    how = "graph replay" if device.type == "cuda" else "eager, interpreted"
    print(f"# lm_head + sampling, W {n}x{k} {dtype}: us per call ({how}), TB/s of W bytes; "
          f"configs (block_n, num_warps, num_programs) on {sms} SMs")  # fmt: skip
    for m in (1, 2) if tiny else (1, 2, 4):
        x, seed = _randn(m, k, dtype=dtype, device=device), torch.tensor([1234], device=device)
        temps = torch.full((m,), 0.7, device=device)
        logits = torch.empty(m, n, dtype=dtype, device=device)
        want = torch.nn.functional.linear(x, w)
        t_linear = timed(lambda x=x: torch.nn.functional.linear(x, w))
        t_two = timed(lambda x=x, t=temps, s=seed: sample_tokens(torch.nn.functional.linear(x, w), t, s))
        print(f"lm_head M={m}: F.linear {us(t_linear)}, F.linear + sample_tokens {us(t_two)}")
        results = []
        for cfg in [{}, *_lm_head_configs(m, sms, tiny)]:
            run = lambda x=x, t=temps, s=seed, cfg=cfg, **kw: lm_head_sample(x, w, t, s, **cfg, **kw)
            try:
                got = run(logits_out=logits)
                ok = torch.equal(got, sample_tokens(logits, temps, seed))
                err = _err(logits, want) / want.abs().max().item()
                t = timed(run)
            except Exception as exc:  # a config the chip cannot hold
                print(f"    {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            named = tuple(choose_config(m, n, device, **cfg))
            results.append((t, named, ok, err))
            print(f"    {'default ' if not cfg else ''}{named}: {us(t)} {'ok' if ok else 'MISMATCH'} "
                  f"rel_err {err:.1e}")  # fmt: skip
        keep = lambda x=x, t=temps, s=seed, lg=logits: lm_head_sample(x, w, t, s, logits_out=lg)
        print(f"    default with logits_out: {us(timed(keep))}")
        if results:
            best = min(results)
            print(f"lm_head M={m}: best fused {us(best[0])} {best[1]} {'ok' if best[2] else 'MISMATCH'} vs "
                  f"F.linear + sample_tokens {us(t_two)}")  # fmt: skip


def _gemv_sample_cases(dtype, device, tiny: bool, only: set[str]) -> list[Case]:
    from kernels.gemv import gemv
    from kernels.sampling import sample_tokens

    elt = torch.tensor([], dtype=dtype).element_size()
    cases: list[Case] = []
    if "gemv" in only:
        shapes = {"tiny": (48, 40)} if tiny else GEMV_SHAPES
        for m in (1, 8) if tiny else (1, 32):
            for name, (n, k) in shapes.items():
                x, w = _randn(m, k, dtype=dtype, device=device), _randn(n, k, dtype=dtype, device=device)
                cases.append(Case(
                    "gemv", f"{name} M={m} {n}x{k}", lambda x=x, w=w: gemv(x, w),
                    lambda x=x, w=w: ref.linear(x, w), (n * k + m * k + m * n) * elt, 2 * m * n * k,
                    check=lambda x=x, w=w: _err(gemv(x, w), ref.linear(*_f32(x, w))),
                ))  # fmt: skip
    if "sample" in only:  # the logits in the model's dtype, as the engine samples them
        vocab = 1000 if tiny else VOCAB
        for b in [2] if tiny else [1, 32, 256]:
            logits = (torch.randn(b, vocab, device=device) * 4).to(dtype)
            temps = torch.full((b,), 0.6, device=device)
            greedy = torch.zeros(b, device=device)
            cases.append(Case(
                "sample", f"{b}x{vocab} T=0.6", lambda lg=logits, t=temps: sample_tokens(lg, t, 7),
                lambda lg=logits, t=temps: ref.sample_tokens(lg, t), logits.numel() * logits.element_size(),
                check=lambda lg=logits, g=greedy: float(
                    not torch.equal(sample_tokens(lg, g, 7), lg.argmax(dim=-1))
                ),
            ))  # fmt: skip
    return cases


if __name__ == "__main__":
    raise SystemExit(main())
