"""G1 (shared/reference/benchmarks.md): 64 constrained `tool_choice="required"` requests over five
n8n-style tools, then the same prompts unconstrained with the same per-request lengths; `repeats`
such pairs, the median ratio reported (one run takes about a second on the H200: single runs are noisy).
`around(label)`: a context manager put around each timed run (the bench's --profile / --timeline).

    run_g1(llm)  # an engine.LLM; prints and returns the numbers
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import jsonschema

G1_TOOLS = Path(__file__).with_name("g1_tools.json")  # a copy of shared/reference/g1_tools.json


def g1_tools() -> list[dict]:
    """G1's five tools (OpenAI `tools` entries)."""
    return json.loads(G1_TOOLS.read_text())["tools"]


def g1_prompts(n: int = 64, prompt_len: int = 256, seed: int = 2) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randint(0, 10000) for _ in range(prompt_len)] for _ in range(n)]


def count_valid(texts: list[str], tools: list[dict], dialect=None, eos: tuple[str, ...] = ()) -> int:
    """Outputs whose every call parses and validates in the dialect's form (and that have at least one
    call); `eos` are end-of-turn texts a stopped output ends with."""
    from grammar.dialects import HERMES
    from grammar.tools import _function

    dialect = dialect or HERMES
    schemas = {f["name"]: f.get("parameters") or {} for f in map(_function, tools)}
    valid = 0
    for text in texts:
        for end in (*eos, "<|im_end|>"):
            text = text.removesuffix(end)
        try:
            calls = _calls(text.strip(), dialect)
            for call in calls:
                jsonschema.validate(call[dialect.args_key], schemas[call["name"]])
        except (ValueError, KeyError, TypeError, jsonschema.ValidationError):
            continue
        valid += bool(calls)
    return valid


def _calls(text: str, dialect) -> list[dict]:
    """The calls of a whole reply written in `dialect`; ValueError when it is anything else."""
    decoder = json.JSONDecoder()
    if dialect.list_form:  # [TOOL_CALLS][{...}, {...}]
        if not text.startswith(dialect.open.strip()):
            raise ValueError("no opening marker")
        calls = json.loads(text[len(dialect.open.strip()) :])
        if not isinstance(calls, list):
            raise ValueError("not a list")
        return calls
    calls, i = [], 0
    while i < len(text):
        if dialect.open:
            if not text.startswith(dialect.open.strip(), i):
                raise ValueError("no opening marker")
            i += len(dialect.open.strip())
        while i < len(text) and text[i].isspace():
            i += 1
        call, i = decoder.raw_decode(text, i)
        calls.append(call)
        rest = text[i:].lstrip() if dialect.close else text[i:]
        if dialect.close:
            if not rest.startswith(dialect.close.strip()):
                raise ValueError("no closing marker")
            rest = rest[len(dialect.close.strip()) :]
        i = len(text) - len(rest)
        sep = dialect.sep if dialect.sep.strip() else ""
        if sep and text.startswith(sep, i):
            i += len(sep)
        while i < len(text) and text[i].isspace():
            i += 1
    return calls


class _TimedConstraint:
    # wraps a TokenConstraint: time spent filling masks (grammar + budget), rows and steps filled
    __slots__ = ("inner", "stats")

    def __init__(self, inner, stats: dict):
        self.inner = inner
        self.stats = stats

    def fill_bitmask(self, bitmask, row: int, remaining_tokens: int) -> None:
        t0 = time.perf_counter()
        self.inner.fill_bitmask(bitmask, row, remaining_tokens)
        self._count(time.perf_counter() - t0, 1)

    @staticmethod
    def fill_bitmasks(bitmask, rows: list) -> None:
        # the engine's one call per step: the inner kind's batch fill, timed as a whole
        first = rows[0][0]
        inner = [(c.inner, row, remaining) for c, row, remaining in rows]
        fill = getattr(first.inner, "fill_bitmasks", None)
        t0 = time.perf_counter()
        if fill is not None:
            fill(bitmask, inner)
        else:
            for c, row, remaining in inner:
                c.fill_bitmask(bitmask, row, remaining)
        first._count(time.perf_counter() - t0, len(rows))

    def _count(self, seconds: float, rows: int) -> None:
        self.stats["mask_s"] += seconds
        self.stats["masks"] += rows
        self.stats["fills"] += 1

    def mask_key(self, remaining_tokens: int):
        key_of = getattr(self.inner, "mask_key", None)
        return key_of(remaining_tokens) if key_of is not None else None

    def accept_token(self, token_id: int) -> bool:
        return self.inner.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()


class _TimedFactory:
    def __init__(self, inner):
        self.inner = inner
        self.stats = {"mask_s": 0.0, "masks": 0, "fills": 0}

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


def _timed_run(llm, prompts, params, around, label: str) -> tuple[list, float]:
    """(outputs, seconds) of one timed run from an empty prefix cache, inside around(label) if given."""
    llm.reset_prefix_cache()
    with around(label) if around else nullcontext():
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        return outs, time.perf_counter() - t0


def run_g1(
    llm,
    n_requests: int = 64,
    prompt_len: int = 256,
    max_tokens: int = 512,
    temperature: float = 0.6,
    repeats: int = 3,
    around: Callable[[str], AbstractContextManager] | None = None,
    tools_path: str | Path = G1_TOOLS,
    out: Callable[[str], None] = print,
) -> dict:
    # imported here: the workload's data (g1_tools, g1_prompts) stays importable on its own
    from grammar.api import build_constraint
    from runner.sampling_params import SamplingParams

    tools = json.loads(Path(tools_path).read_text())["tools"]
    prompts = g1_prompts(n_requests, prompt_len)
    vocab_size = _model_vocab(llm)
    tokenizer = llm.tokenizer
    from grammar.dialects import dialect_for

    dialect = dialect_for(tokenizer)
    eos = tuple(t for t in (getattr(tokenizer, "eos_token", None),) if t)
    out(f"G1 vocabulary: {len(tokenizer)} tokens, dialect {dialect.name}")

    t0 = time.perf_counter()
    factory = build_constraint(
        tokenizer,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=max_tokens,
        vocab_size=vocab_size,
    )
    factory.wait()
    compile_s = time.perf_counter() - t0  # cold: token tables (first use), budget automaton, backend

    # warm-up on other prompts (kernels, allocator), then empty the prefix cache
    warm = g1_prompts(2, 32, seed=99)
    llm.generate(warm, SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True))
    llm.reset_prefix_cache()
    # the first constrained run, on other prompts: a served tool set is reused by every request, so
    # the grammar's masks (cached by DFA state) are warm for the timed run; reported apart, as cold
    first = SamplingParams(temperature=temperature, max_tokens=max_tokens, constraint=factory)
    t0 = time.perf_counter()
    first_outs = llm.generate(g1_prompts(n_requests, prompt_len, seed=98), first)
    first_tok_s = sum(len(o.outputs[0].token_ids) for o in first_outs) / (time.perf_counter() - t0)
    llm.reset_prefix_cache()
    sampler = getattr(getattr(llm, "core", None), "sampler", None)
    table = getattr(sampler, "device_masks", None)  # CUDA: rows cached on the GPU, looked up first
    d_hits0, d_misses0 = (table.hits, table.misses) if table is not None else (0, 0)

    timed = _TimedFactory(factory)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, constraint=timed)
    pairs = []  # (constrained tokens, s, unconstrained tokens, s) per repeat
    lengths: list[int] = []
    complete = valid = n_requests
    for _ in range(max(1, repeats)):
        # each pair: the constrained run, then the same prompts unconstrained with its lengths
        outs, constrained_s = _timed_run(llm, prompts, params, around, "constrained")
        token_ids = [o.outputs[0].token_ids for o in outs]
        lengths = [len(ids) for ids in token_ids]
        texts = [tokenizer.decode(ids, skip_special_tokens=False) for ids in token_ids]
        complete = min(complete, sum(o.outputs[0].finish_reason == "stop" for o in outs))
        valid = min(valid, count_valid(texts, tools, dialect, eos))

        free = [SamplingParams(temperature=temperature, max_tokens=n, ignore_eos=True) for n in lengths]
        free_outs, unconstrained_s = _timed_run(llm, prompts, free, around, "unconstrained")
        free_tokens = sum(len(o.outputs[0].token_ids) for o in free_outs)
        pairs.append((sum(lengths), constrained_s, free_tokens, unconstrained_s, lengths))

    # each pair samples anew (the engine's random stream goes on), so pairs differ in length; which
    # one is the median depends on the timings
    ranked = sorted(pairs, key=lambda p: (p[0] / p[1]) / (p[2] / p[3]))  # by ratio
    ratios = [(c / cs) / (f / fs) for c, cs, f, fs, _ in ranked]
    runs = len(ranked)
    total, constrained_s, free_tokens, unconstrained_s, lengths = ranked[runs // 2]
    result = {
        "backend": "llguidance",
        "requests": n_requests,
        "output_tokens": total,
        "repeats": runs,
        "constrained_tok_s": total / constrained_s,
        "unconstrained_tok_s": free_tokens / unconstrained_s,
        "ratio": ratios[runs // 2],
        "ratios": ratios,
        "pair_tokens": [p[0] for p in ranked],  # constrained output tokens of each pair, in ratio order
        "complete": complete,
        "valid": valid,
        "compile_ms": compile_s * 1e3,
        "mask_us_per_token": timed.stats["mask_s"] / max(timed.stats["masks"], 1) * 1e6,
        "mask_ms_per_step": timed.stats["mask_s"] / max(timed.stats["fills"], 1) * 1e3,
        "mask_s": timed.stats["mask_s"] / runs,
        "min_tokens": factory.min_tokens,
        "first_run_tok_s": first_tok_s,
    }
    if table is not None:
        d_hits, d_misses = table.hits - d_hits0, table.misses - d_misses0
        result["device_mask_hit_rate"] = d_hits / max(d_hits + d_misses, 1)
    out(
        f"G1 ({result['backend']}): {n_requests} requests, {total} output tokens in the median pair "
        f"(longest {max(lengths)}, shortest {min(lengths)}; shortest valid call {factory.min_tokens})"
    )
    out(f"  first constrained run (other prompts, cold mask cache) {first_tok_s:9.1f} tok/s")
    c_tok_s = result["constrained_tok_s"]
    out(f"  constrained   {c_tok_s:9.1f} tok/s ({constrained_s:.2f} s), the median pair of {runs}")
    out(f"  unconstrained {result['unconstrained_tok_s']:9.1f} tok/s ({unconstrained_s:.2f} s)")
    spread = ", ".join(f"{r:.3f} ({n} tokens)" for r, n in zip(ratios, result["pair_tokens"], strict=True))
    out(
        f"  ratio {result['ratio']:.3f} (median of {runs} pairs: {spread}); "
        f"complete {complete}/{n_requests}; valid {valid}/{n_requests} (worst run)"
    )
    mask_us, mask_ms = result["mask_us_per_token"], result["mask_ms_per_step"]
    out(
        f"  grammar compile {result['compile_ms']:.0f} ms (cold); mask {mask_us:.0f} us/token, "
        f"{mask_ms:.2f} ms/step ({result['mask_s']:.2f} s per run)"
        + (f"; GPU mask rows {result['device_mask_hit_rate']:.0%} hits" if table is not None else "")
    )
    return result


def measure_masks(
    tokenizer,
    n_requests: int = 16,
    vocab_size: int = 151936,
    max_tokens: int = 256,
    seed: int = 0,
    out: Callable[[str], None] = print,
) -> dict:
    """On the G1 tool set (required, parallel): llguidance's tokenizer setup, cold compile, and
    per-token mask time (matcher fill + budget) over random-logit requests."""
    import numpy as np
    import torch

    from grammar.budget import BudgetAutomaton, vocab_tables
    from grammar.constraint import GrammarConstraint
    from grammar.dialects import HERMES
    from grammar.llguidance_backend import LLGuidanceBackend
    from grammar.tools import grammar_spec
    from grammar.vocab import allowed_ids, vocab_for

    tools = g1_tools()
    t0 = time.perf_counter()
    vocab = vocab_for(tokenizer, vocab_size)
    vocab_tables(vocab)
    setup_s = time.perf_counter() - t0
    spec = grammar_spec(tools, "required", True, dialect=HERMES, vocab=vocab)
    t0 = time.perf_counter()
    budget = BudgetAutomaton(spec.budget_regex, vocab)
    budget_ms = (time.perf_counter() - t0) * 1e3
    out(
        f"budget automaton: {budget_ms:.0f} ms, {budget.n_states} DFA states, "
        f"{len(budget.helper_ids)} helper tokens, shortest call {budget.min_tokens} tokens"
    )
    t0 = time.perf_counter()
    grammar = LLGuidanceBackend(vocab).compile(spec.lark)
    compile_ms = (time.perf_counter() - t0) * 1e3
    rng = np.random.default_rng(seed)
    bitmask = torch.empty(1, vocab.mask_words, dtype=torch.int32)
    times: list[float] = []
    valid = 0
    for _ in range(n_requests):
        c = GrammarConstraint(grammar.matcher(), budget.cursor(), vocab)
        ids: list[int] = []
        for step in range(max_tokens):
            bitmask.fill_(-1)
            t0 = time.perf_counter()
            c.fill_bitmask(bitmask, 0, max_tokens - step)
            times.append(time.perf_counter() - t0)
            allowed = allowed_ids(bitmask[0], vocab_size)
            tok = int(allowed[rng.integers(len(allowed))])
            if not c.accept_token(tok):
                break
            ids.append(tok)
            if c.is_terminated():
                break
        text = tokenizer.decode(ids, skip_special_tokens=False)
        valid += count_valid([text], tools)
    arr = np.array(times) * 1e6
    p50, p99 = np.median(arr), np.percentile(arr, 99)
    out(
        f"llguidance setup {setup_s:5.1f} s  compile {compile_ms:8.1f} ms  mask mean {arr.mean():7.0f} us"
        f"  p50 {p50:6.0f} us  p99 {p99:7.0f} us  valid {valid}/{n_requests}  ({len(times)} tokens)"
    )
    return {
        "budget_ms": budget_ms,
        "setup_s": setup_s,
        "compile_ms": compile_ms,
        "mask_us_mean": float(arr.mean()),
        "mask_us_p50": float(p50),
        "mask_us_p99": float(p99),
        "valid": valid,
        "requests": n_requests,
        "tokens": len(times),
    }


if __name__ == "__main__":
    from tokenizers import Tokenizer

    from models.qwen_vocab import qwen_tokenizer_json

    measure_masks(Tokenizer.from_file(str(qwen_tokenizer_json())))
