"""G1 (shared/reference/benchmarks.md): 64 constrained `tool_choice="required"` requests over five
n8n-style tools, then the same prompts unconstrained with the same per-request lengths.

    run_g1(llm)  # an engine.LLM; prints and returns the numbers
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import jsonschema

from grammar.api import build_constraint
from grammar.backend import DEFAULT_BACKEND

G1_TOOLS = Path(__file__).with_name("g1_tools.json")  # a copy of shared/reference/g1_tools.json


def g1_prompts(n: int = 64, prompt_len: int = 256, seed: int = 2) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(0, 10000) for _ in range(prompt_len)] for _ in range(n)]


def count_valid(texts: list[str], tools: list[dict]) -> int:
    """Outputs whose every call parses and validates (and that have at least one call)."""
    from grammar.tools import _function

    schemas = {f["name"]: f.get("parameters") or {} for f in map(_function, tools)}
    valid = 0
    for text in texts:
        text = text.removesuffix("<|im_end|>")
        parts = text.split("<tool_call>")
        ok = parts[0].strip() == "" and len(parts) > 1
        for part in parts[1:]:
            body, sep, rest = part.partition("</tool_call>")
            try:
                call = json.loads(body)
                jsonschema.validate(call["arguments"], schemas[call["name"]])
            except (ValueError, KeyError, TypeError, jsonschema.ValidationError):
                ok = False
            ok = ok and bool(sep) and rest.strip() == ""
        valid += ok
    return valid


class _TimedConstraint:
    # wraps a TokenConstraint: time spent filling masks (grammar + budget), tokens constrained
    __slots__ = ("inner", "stats")

    def __init__(self, inner, stats: dict):
        self.inner = inner
        self.stats = stats

    def fill_bitmask(self, bitmask, row: int, remaining_tokens: int) -> None:
        t0 = time.perf_counter()
        self.inner.fill_bitmask(bitmask, row, remaining_tokens)
        self.stats["mask_s"] += time.perf_counter() - t0
        self.stats["masks"] += 1

    def accept_token(self, token_id: int) -> bool:
        return self.inner.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()


class _TimedFactory:
    def __init__(self, inner):
        self.inner = inner
        self.stats = {"mask_s": 0.0, "masks": 0}

    def ready(self) -> bool:
        return self.inner.ready()

    def new(self) -> _TimedConstraint:
        return _TimedConstraint(self.inner.new(), self.stats)


def _model_vocab(llm) -> int | None:
    size = getattr(getattr(llm, "core", None), "vocab_size", None)
    if size is None:
        cfg = Path(str(llm.config.model)) / "config.json"
        size = json.loads(cfg.read_text()).get("vocab_size") if cfg.exists() else None
    return size


def run_g1(
    llm,
    n_requests: int = 64,
    prompt_len: int = 256,
    max_tokens: int = 512,
    temperature: float = 0.6,
    backend: str | None = None,
    tools_path: str | Path = G1_TOOLS,
    out: Callable[[str], None] = print,
) -> dict:
    from engine.sampling_params import SamplingParams

    tools = json.loads(Path(tools_path).read_text())["tools"]
    prompts = g1_prompts(n_requests, prompt_len)
    vocab_size = _model_vocab(llm)
    tokenizer = llm.tokenizer

    t0 = time.perf_counter()
    factory = build_constraint(tokenizer, tools=tools, tool_choice="required", parallel_tool_calls=True,
                               max_tokens=max_tokens, vocab_size=vocab_size, backend=backend)
    factory.wait()
    compile_s = time.perf_counter() - t0  # cold: token tables (first use), budget automaton, backend

    # warm-up on other prompts (kernels, allocator), then empty the prefix cache
    warm = g1_prompts(2, 32, seed=99)
    llm.generate(warm, SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True))
    llm.reset_prefix_cache()

    timed = _TimedFactory(factory)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, constraint=timed)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    constrained_s = time.perf_counter() - t0
    token_ids = [o.outputs[0].token_ids for o in outs]
    lengths = [len(ids) for ids in token_ids]
    texts = [tokenizer.decode(ids, skip_special_tokens=False) for ids in token_ids]
    complete = sum(o.outputs[0].finish_reason == "stop" for o in outs)
    valid = count_valid(texts, tools)

    llm.reset_prefix_cache()
    free = [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True) for n in lengths]
    t0 = time.perf_counter()
    free_outs = llm.generate(prompts, free)
    unconstrained_s = time.perf_counter() - t0
    free_tokens = sum(len(o.outputs[0].token_ids) for o in free_outs)

    total = sum(lengths)
    result = {
        "backend": backend or DEFAULT_BACKEND,
        "requests": n_requests,
        "output_tokens": total,
        "constrained_tok_s": total / constrained_s,
        "unconstrained_tok_s": free_tokens / unconstrained_s,
        "ratio": (total / constrained_s) / (free_tokens / unconstrained_s),
        "complete": complete,
        "valid": valid,
        "compile_ms": compile_s * 1e3,
        "mask_us_per_token": timed.stats["mask_s"] / max(timed.stats["masks"], 1) * 1e6,
        "min_tokens": factory.min_tokens,
    }
    out(f"G1 ({result['backend']}): {n_requests} requests, {total} output tokens "
        f"(longest {max(lengths)}, shortest {min(lengths)}; shortest valid call {factory.min_tokens})")
    out(f"  constrained   {result['constrained_tok_s']:9.1f} tok/s ({constrained_s:.2f} s)")
    out(f"  unconstrained {result['unconstrained_tok_s']:9.1f} tok/s ({unconstrained_s:.2f} s)")
    out(f"  ratio {result['ratio']:.3f}; complete {complete}/{n_requests}; valid {valid}/{n_requests}")
    mask_us = result["mask_us_per_token"]
    out(f"  grammar compile {result['compile_ms']:.0f} ms (cold); mask {mask_us:.0f} us/token")
    return result
