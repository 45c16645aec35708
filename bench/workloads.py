"""chatloom bench: the workloads of benchmarks.md, run by our engine (and a peer) in one process.

    chatloom bench --workload c1 --peer hf      # CPU: mixed chat traffic vs HF static batching
    chatloom bench --workload w1|w2|w3 [--peer hf]   # GPU: Qwen3-0.6B shape, dummy weights
    chatloom bench --workload m1                # replayed 10-turn conversation: warm vs cold TTFT
    chatloom bench --workload g1                # grammar-constrained tool calls vs unconstrained
    chatloom bench --workload cpu1 --model F.gguf --peer all [--quantization int8]  # CPU vs llama.cpp, HF
    chatloom bench --workload s1                # speculative decoding on / off (bench/speculative.py)

Runs without the web stack (also as `python -m bench`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import speculative
from bench import switches as bench_switches
from bench.cpu1 import bench_cpu1
from models.tiny import BENCH_SHAPE, build_checkpoint

HBM_BYTES_PER_S = 4.3e12  # H200

QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
)


# ---- workloads (token ids fixed by the recipes of benchmarks.md) ---------------------------------
def _mixed_workload(n: int, in_range: tuple[int, int], out_range: tuple[int, int], max_id: int):
    """benchmarks.md's mixed recipe: Random(0); per request n_in, its ids, then n_out."""
    rng = random.Random(0)
    prompts, outs = [], []
    for _ in range(n):
        n_in = rng.randint(*in_range)
        prompts.append([rng.randint(0, max_id) for _ in range(n_in)])
        outs.append(rng.randint(*out_range))
    return prompts, outs


def c1_workload() -> tuple[list[list[int]], list[int]]:
    return _mixed_workload(16, (32, 256), (16, 128), 8000)


def w1_workload() -> tuple[list[list[int]], list[int]]:
    rng = random.Random(0)
    return [[rng.randint(0, 10000) for _ in range(128)] for _ in range(32)], [256] * 32


def w2_workload() -> tuple[list[list[int]], list[int]]:
    return _mixed_workload(256, (100, 1024), (100, 1024), 10000)


def w3_workload() -> tuple[list[list[int]], list[int]]:
    rng = random.Random(1)
    return [[rng.randint(0, 10000) for _ in range(512)]], [512]


def m1_turns() -> list[list[int]]:
    """Prompts of turns 1..10 of the replayed conversation (the last has 3,764 tokens)."""
    rng = random.Random(5)
    history = [rng.randint(0, 10000) for _ in range(64)]
    prompts = []
    for turn in range(10):
        history = history + [rng.randint(0, 10000) for _ in range(100)]
        prompts.append(list(history))
        if turn < 9:
            history = history + [rng.randint(0, 10000) for _ in range(300)]
    return prompts


def warmup_prompts(n: int, length: int) -> list[list[int]]:
    rng = random.Random(12345)
    return [[rng.randint(0, 8000) for _ in range(length)] for _ in range(n)]


def warmup_like(prompts: list[list[int]]) -> list[list[int]]:
    """Prompts of the workload's shapes with other token ids: kernels compile, the cache stays cold."""
    rng = random.Random(54321)
    return [[rng.randint(0, 8000) for _ in range(len(p))] for p in prompts]


# ---- helpers --------------------------------------------------------------------------------------
def _params(max_tokens: int, temperature: float):
    from engine import SamplingParams

    return SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True, seed=None)


def _checkpoint(shape: dict, vocab: int, folder: Path, dummy: bool) -> Path:
    if dummy:
        import transformers

        cfg = transformers.Qwen3Config(**shape, vocab_size=vocab, eos_token_id=151645)
        cfg.architectures = ["Qwen3ForCausalLM"]
        cfg.save_pretrained(folder)
        from models.tiny import write_tokenizer

        write_tokenizer(folder)
        return folder
    return build_checkpoint(folder, "qwen3", vocab_size=vocab, seed=0, shape=shape)


def _time_engine(llm, prompts, outs, temperature: float, label: str) -> tuple[float, int]:
    import torch

    from bench.observe import NewKernels

    params = [_params(n, temperature) for n in outs]
    llm.reset_prefix_cache()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    steps0 = llm.core.num_steps
    with _observed(llm), NewKernels() as new_kernels:
        t0 = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    produced = sum(len(r.token_ids) for r in results)
    assert produced == sum(outs), f"{label}: produced {produced} tokens, expected {sum(outs)}"
    print(
        f"{label}: {produced} tokens in {dt:.3f} s = {produced / dt:,.0f} tok/s "
        f"({llm.core.num_steps - steps0} steps)"
    )
    if torch.cuda.is_available():
        print(new_kernels.summary())
    return dt, produced


PROFILE = False
TIMELINE = False
BY_BATCH = False
TRACE: str | None = None


def _hf_peer(path: Path, prompts, outs, device: str, dtype, useful: int) -> float:
    """HF transformers generate on the same weights: the prompts left-padded into one static batch."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    longest = max(outs)
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    gen = dict(max_new_tokens=longest, min_new_tokens=longest, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(
            ids[:2, -32:], attention_mask=mask[:2, -32:], **{**gen, "max_new_tokens": 4, "min_new_tokens": 4}
        )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=mask, **gen)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    print(
        f"HF transformers generate (static batch of {len(prompts)}, {longest} steps): "
        f"{useful} useful tokens in {dt:.3f} s = {useful / dt:,.0f} tok/s"
    )
    return useful / dt


# ---- the workloads --------------------------------------------------------------------------------
def bench_c1(args) -> dict:
    import torch

    from engine import LLM

    torch.set_num_threads(args.threads)
    prompts, outs = c1_workload()
    assert sum(outs) == 1167 and max(outs) == 127, "C1 recipe checksum mismatch"
    with tempfile.TemporaryDirectory() as tmp:
        model = getattr(args, "model", None)  # a checkpoint folder or .gguf file in place of the random one
        path = model or _checkpoint({**BENCH_SHAPE}, 8192, Path(tmp), dummy=False)
        t0 = time.perf_counter()
        llm = LLM(path, device="cpu", dtype="float32", num_threads=args.threads)
        path = Path(llm.config.model)  # a .gguf file's converted folder, which the HF peer loads too
        print(f"engine start-up: {time.perf_counter() - t0:.2f} s")
        llm.generate(warmup_like(prompts), [_params(min(n, 8), 0.0) for n in outs])
        dt, produced = _time_engine(llm, prompts, outs, 0.0, "chatloom C1")
        ours = produced / dt
        result = {"workload": "c1", "chatloom_tok_s": ours}
        if args.peer == "hf":
            peer = _hf_peer(path, prompts, outs, "cpu", torch.float32, sum(outs))
            result.update(hf_tok_s=peer, ratio=ours / peer)
            print(f"ratio chatloom / HF: {ours / peer:.2f}x (target >= 3x)")
    return result


def bench_gpu(args) -> dict:
    import torch

    from engine import LLM

    if not torch.cuda.is_available():
        raise SystemExit(f"workload {args.workload} needs a CUDA device")
    prompts, outs = {"w1": w1_workload, "w2": w2_workload, "w3": w3_workload}[args.workload]()
    if args.workload == "w2":
        assert sum(len(p) for p in prompts) == 148779 and sum(outs) == 140084, "W2 checksum mismatch"
    with tempfile.TemporaryDirectory() as tmp:
        path = _checkpoint(QWEN3_06B, 151936, Path(tmp), dummy=True)
        t0 = time.perf_counter()
        llm = LLM(
            path,
            load_format="dummy",
            dtype="bfloat16",
            max_model_len=args.max_model_len,
            enforce_eager=args.eager,
            launch_ahead=not args.launch_after,
            max_num_seqs=max(len(prompts), 1) if args.workload != "w2" else 256,
            **({"max_num_batched_tokens": n} if (n := args.max_num_batched_tokens) is not None else {}),
            **({"block_size": b} if (b := args.block_size) is not None else {}),
            **({"batch_graph_max_tokens": g} if (g := args.batch_graph_max_tokens) is not None else {}),
            speculative_method=args.speculative,
        )
        print(f"engine start-up: {time.perf_counter() - t0:.2f} s")
        # warm-up: the workload's shapes and whole lengths with other ids, so that what the timed run
        # launches is compiled before it (with a warm-up of 16 tokens per request, W2 ran at 19.4k tok/s
        # in the first process on a fresh machine and 24.4k in the next one, its kernel cache warm)
        llm.generate(warmup_like(prompts), [_params(n, 0.6) for n in outs])
        dt, produced = _time_engine(llm, prompts, outs, 0.6, f"chatloom {args.workload.upper()}")
        weight_bytes = sum(p.numel() * p.element_size() for p in llm.core.runner.model.parameters())
        kv_per_token = llm.core.runner.block_bytes // llm.config.block_size
        # bytes a decode step must read: all weights + the KV of every running sequence's context
        steps = max(outs)
        kv = sum(sum(len(p) + j for j in range(n)) for p, n in zip(prompts, outs, strict=True))
        bound_s = (weight_bytes * steps + kv * kv_per_token) / HBM_BYTES_PER_S
        print(f"bandwidth bound {bound_s * 1e3:.1f} ms -> reached {bound_s / dt:.1%} of it")
        result = {"workload": args.workload, "chatloom_tok_s": produced / dt, "bound_fraction": bound_s / dt}
        if args.speculative != "off":
            st = llm.stats()  # warm-up and timed run together
            result.update({k: v for k, v in st.items() if k.startswith("spec_")})
            print(
                f"speculation {args.speculative}: "
                + ", ".join(f"{k} {v}" for k, v in result.items() if k.startswith("spec_"))
            )
        if args.peer == "hf":
            peer = _hf_peer(path_with_weights(llm, path), prompts, outs, "cuda", torch.bfloat16, sum(outs))
            result.update(hf_tok_s=peer, ratio=(produced / dt) / peer)
    return result


def path_with_weights(llm, folder: Path) -> Path:
    """Save the engine's dummy weights as a HF checkpoint so the peer runs the same weights."""
    import torch
    from safetensors.torch import save_file

    model = llm.core.runner.model
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    inter = mlp.down_proj.in_features
    tensors = {}
    for name, p in model.named_parameters():
        base = "model." + name
        if ".qkv_proj." in name:
            q, k, v = p.detach().split([attn.q_size, attn.kv_size, attn.kv_size])
            for part, t in zip(("q_proj", "k_proj", "v_proj"), (q, k, v), strict=True):
                tensors[base.replace("qkv_proj", part)] = t.contiguous()
        elif ".gate_up_proj." in name:
            g, u = p.detach().split([inter, inter])
            tensors[base.replace("gate_up_proj", "gate_proj")] = g.contiguous()
            tensors[base.replace("gate_up_proj", "up_proj")] = u.contiguous()
        else:
            tensors[base] = p.detach().contiguous()
    save_file({k: v.to(torch.bfloat16).cpu() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def bench_m1(args) -> dict:
    import torch

    turns = m1_turns()
    assert len(turns[-1]) == 3764, "M1 recipe checksum mismatch"
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        llm = _real_vocab_llm(args, Path(tmp))
        one = _params(1, 0.0)

        def ttft(prompt) -> float:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            llm.generate([prompt], one)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0

        llm.generate(warmup_prompts(2, 64), one)
        for _ in range(args.repeats):
            ttft(warmup_prompts(1, 3764)[0])  # warm the long-prefill path too

        def replay_turns_1_to_9() -> None:  # each prefilled by a 1-token generation, blocks retained
            llm.reset_prefix_cache()
            for prompt in turns[:-1]:
                llm.generate([prompt], one)

        warm, cold = [], []
        for _ in range(args.repeats):
            replay_turns_1_to_9()
            warm.append(ttft(turns[-1]))
            llm.reset_prefix_cache()
            cold.append(ttft(turns[-1]))
        if PROFILE:  # one more warm turn 10, profiled
            replay_turns_1_to_9()
            from bench.observe import Profile

            with Profile(enabled=True) as prof:
                dt = ttft(turns[-1])
            prof.report(dt, 1)
        w, c = min(warm), min(cold)
        hits = llm.stats()["prefix_cache_hit_tokens"]
        print(
            f"M1 turn-10 TTFT ({len(turns[-1])} prompt tokens): warm {w * 1e3:.1f} ms, "
            f"cold {c * 1e3:.1f} ms, "
            f"warm/cold {w / c:.1%} (prefix-cache hit tokens so far: {hits})"
        )
    return {"workload": "m1", "warm_ms": w * 1e3, "cold_ms": c * 1e3, "ratio": w / c}


def bench_g1(args) -> dict:
    """64 tool_choice=required requests through our tool-call grammar vs the same lengths free."""
    try:
        from bench.grammar import run_g1
    except ImportError as e:  # the grammar package needs its backend library
        raise SystemExit(f"G1 needs the grammar package and its backend: {e}") from e
    with tempfile.TemporaryDirectory() as tmp:
        llm = _real_vocab_llm(args, Path(tmp))
        around = (lambda label: _observed(llm, label)) if PROFILE or TIMELINE else None
        return run_g1(llm, around=around)


@contextlib.contextmanager
def _observed(llm, label: str | None = None):
    """--profile / --timeline around one timed run (reported after it, under `label` if given)."""
    steps0, t0 = llm.core.num_steps, time.perf_counter()
    from bench.observe import HostTimeline, Profile
    from bench.step_breakdown import StepBreakdown

    profiler, timeline = Profile(enabled=PROFILE, trace=TRACE), HostTimeline(llm.core, enabled=TIMELINE)
    kv_per_token = llm.core.runner.block_bytes // llm.config.block_size
    by_batch = StepBreakdown(llm.core, BY_BATCH, kv_per_token, HBM_BYTES_PER_S)
    with profiler, timeline, by_batch:
        yield
    wall, steps = time.perf_counter() - t0, llm.core.num_steps - steps0
    if label and (PROFILE or TIMELINE or BY_BATCH):
        print(f"[{label}]")
    profiler.report(wall, steps)
    timeline.report(wall, steps)
    by_batch.report()


def _real_vocab_llm(args, folder: Path):
    """M1/G1's engine: the Qwen3-0.6B shape with dummy bf16 weights on CUDA, else the CPU bench
    shape in float32; both with the real 151,936-token vocabulary."""
    import torch

    from engine import LLM

    ahead = not args.launch_after
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(args.threads)
    path = _checkpoint(QWEN3_06B if cuda else {**BENCH_SHAPE}, 151936, folder, dummy=cuda)
    if getattr(args, "tokenizer", None):
        _adopt_tokenizer(path, Path(args.tokenizer))
    if cuda:
        return LLM(path, load_format="dummy", dtype="bfloat16", max_model_len=4096, launch_ahead=ahead)
    return LLM(path, device="cpu", dtype="float32", num_threads=args.threads, launch_ahead=ahead)


def _adopt_tokenizer(folder: Path, src: Path) -> None:
    """--tokenizer: another family's tokenizer, chat template and bos/eos ids in the benchmark
    checkpoint; its embedding keeps 151,936 rows (every family's vocabulary fits), so the model's
    cost is Qwen's and only the vocabulary (and the dialect its template implies) changes."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / name).exists():
            shutil.copyfile(src / name, folder / name)
    theirs = json.loads((src / "config.json").read_text())
    if theirs.get("vocab_size", 0) > 151936:
        raise SystemExit(f"--tokenizer {src}: {theirs['vocab_size']} rows do not fit 151,936")
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update({k: theirs.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))


WORKLOADS = {
    "c1": bench_c1,
    "w1": bench_gpu,
    "w2": bench_gpu,
    "w3": bench_gpu,
    "m1": bench_m1,
    "g1": bench_g1,
    "cpu1": bench_cpu1,
    "s1": speculative.bench_s1,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="chatloom bench",
        description="Run a benchmark workload of benchmarks.md (engine start-up excluded, printed apart).",
    )
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS), help="which workload")
    p.add_argument(
        "--peer",
        choices=["none", "hf", "llamacpp", "all"],
        default="none",
        help="also run HF transformers generate; cpu1 also llama.cpp (llama-cpp-python) or both (all)",
    )
    p.add_argument(
        "--quantization",
        choices=["none", "int8", "int4"],
        default="none",
        help="cpu1: chatloom's weights (kernels.quant_linear); the quality against float32 is printed",
    )
    p.add_argument("--memory", action="store_true", help="cpu1: resident memory after load, per quantization")
    p.add_argument("--skip-quality", action="store_true", help="cpu1: no quantized-vs-float32 comparison")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for both sides (CPU workloads)")
    p.add_argument(
        "--model",
        metavar="DIR_OR_GGUF",
        help="C1: this checkpoint folder or .gguf file instead of the random benchmark model (S1: "
        "instead of the embedded SmolLM2)",
    )
    speculative.add_arguments(p)
    p.add_argument("--eager", action="store_true", help="GPU: no CUDA graphs")
    p.add_argument(
        "--launch-after",
        action="store_true",
        help="launch a late-sampling step's next forward only after its tokens are sampled",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        metavar="N",
        help="GPU workloads: the engine's token budget per step (default: EngineConfig's)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        metavar="N",
        help="W1-W3: tokens a KV-cache block holds (a power of two; default: EngineConfig's)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        metavar="N",
        help="W1-W3: the engine's context limit, which sizes the CUDA graphs' block tables (default: "
        "benchmarks.md's 4096; the checkpoint allows 40960)",
    )
    p.add_argument(
        "--batch-graph-max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="GPU workloads: steps with prefill chunks up to N tokens replay graphs (0: eager; default: "
        "EngineConfig's)",
    )
    p.add_argument(
        "--speculative",
        choices=["off", "ngram"],
        default="off",
        help="W1-W3: n-gram speculative decoding on (the random weights rarely repeat: this checks what it "
        "costs where proposals seldom come)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="M1/G1: a checkpoint folder whose tokenizer, chat template and eos ids replace Qwen's "
        "(e.g. one built by tests/families.py: SentencePiece, tekken, Llama 3, SmolLM2)",
    )
    p.add_argument("--repeats", type=int, default=3, help="M1: timed repetitions (best is reported)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p.add_argument("--profile", action="store_true", help="print where the timed run spends its time")
    p.add_argument("--trace", metavar="FILE", help="also write the Chrome trace to FILE (turns --profile on)")
    p.add_argument("--timeline", action="store_true", help="print the host's wall time per step part")
    p.add_argument(
        "--by-batch",
        action="store_true",
        help="print the timed run's steps grouped by kind (decode batch size, with prefill): host, device "
        "and K/V streaming time",
    )
    bench_switches.add_option(
        p, "flip a module-level switch for this run, e.g. kernels.pdl.PDL=False (repeatable)"
    )
    return p


def main(argv: list[str] | None = None) -> dict:
    global PROFILE, TIMELINE, TRACE, BY_BATCH
    parser = build_parser()
    args = parser.parse_args(argv)
    PROFILE, TIMELINE, TRACE = args.profile or bool(args.trace), args.timeline, args.trace
    BY_BATCH = args.by_batch
    switches = bench_switches.apply_or_exit(parser, args.set)
    if switches:
        print("switches: " + ", ".join(f"{k}={v!r}" for k, v in switches.items()))
    result = WORKLOADS[args.workload](args)
    if switches:
        result["switches"] = {k: repr(v) for k, v in switches.items()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
