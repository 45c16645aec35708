"""Host mask filling for G1 on the CPU: the engine's per-step `GrammarConstraint.fill_bitmasks` over
`rows` requests that each write a valid G1 tool call (Qwen2.5 vocabulary, real tokenizer), and its
parts timed apart: llguidance's masks computed again (row by row), the budget narrowing, and
the Python around them. A row whose call ended starts a new request (continuous batching), so the
rows stay at different places in their calls.

    python -m bench.mask_profile --rows 16 64 --steps 200 [--max-tokens 512] [--profile] [--pool 4 16]

--pool N...: the step's rows on llguidance's LLExecutor with N threads instead (0: the engine's own fill,
row by row), to see whether a host's cores share them.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time

import numpy as np
import torch

from bench.grammar import g1_tools
from grammar.vocab import allowed_ids

MODEL_VOCAB = 151936  # Qwen2.5's embedding rows

# calls a model would write (the dialect's form: <tool_call>\n{json}\n</tool_call>), one or two a reply
CALLS = [
    [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}],
    [{"name": "get_weather", "arguments": {"city": "San Francisco"}}],
    [{"name": "create_ticket", "arguments": {"title": "Login page fails on Safari", "priority": 2}}],
    [
        {
            "name": "create_ticket",
            "arguments": {"title": "Export to CSV drops rows", "priority": 4, "tags": ["export", "bug"]},
        }
    ],
    [
        {
            "name": "send_email",
            "arguments": {"to": ["ops@example.com"], "subject": "Nightly backup finished", "urgent": False},
        }
    ],
    [
        {
            "name": "query_orders",
            "arguments": {"customer_id": 48213, "status": "shipped", "since": "2024-05-01"},
        }
    ],
    [
        {
            "name": "add_contact",
            "arguments": {"contact": {"name": "Ada Lovelace", "phone": "+44 20 7946 0000"}},
        }
    ],
    [
        {"name": "get_weather", "arguments": {"city": "Berlin"}},
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "fahrenheit"}},
    ],
]


def call_tokens(tok, vocab) -> list[list[int]]:
    """Token ids of each reply in CALLS, EOS last."""
    out = []
    for calls in CALLS:
        # the grammar's form: the envelope as models write it, the arguments compact
        body = [(c["name"], json.dumps(c["arguments"], separators=(",", ":"))) for c in calls]
        text = "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in body)
        out.append(tok.encode(text, add_special_tokens=False).ids + [vocab.eos_id])
    return out


class Batch:
    """`rows` requests in flight; each writes one reply of CALLS (or, with `replies` None, samples
    uniformly among the tokens its mask allows, as G1's dummy-weight model does), then a new request
    takes its row when its reply ended or its max_tokens ran out."""

    def __init__(self, factory, replies: list[list[int]] | None, rows: int, max_tokens: int, seed: int = 0):
        self.factory, self.replies, self.max_tokens = factory, replies, max_tokens
        self.rng = np.random.default_rng(seed)
        self.reqs = [self._start(i, skip=i % 23) for i in range(rows)]

    def _start(self, i: int, skip: int = 0):
        # [constraint, reply (None: sampled), tokens taken, sampled tokens]
        c = self.factory.new()
        if self.replies is None:
            return [c, None, 0, []]
        reply = self.replies[i % len(self.replies)]
        skip = min(skip, len(reply) - 1)
        for t in reply[:skip]:
            assert c.accept_token(t)
        return [c, reply, skip, []]

    def items(self) -> list[tuple]:
        # (constraint, row, remaining tokens)
        return [(r[0], row, self.max_tokens - r[2]) for row, r in enumerate(self.reqs)]

    def advance(self, bitmask: torch.Tensor, vocab_size: int) -> None:
        for row, r in enumerate(self.reqs):
            c, reply, pos, taken = r
            if reply is None:
                ids = allowed_ids(bitmask[row], vocab_size)
                t = int(ids[self.rng.integers(len(ids))])
                taken.append(t)
            else:
                t = reply[pos]
            assert c.accept_token(t), (row, pos)
            r[2] = pos + 1
            if c.is_terminated() or r[2] >= self.max_tokens:
                self.reqs[row] = self._start(row + pos)


def _narrow_each(bitmask: torch.Tensor, items: list[tuple]) -> None:
    # the budget row by row (before GrammarConstraint.narrow_rows existed)
    for c, row, remaining in items:
        c._narrow(bitmask[row], remaining)


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def run(tok, vocab, rows: int, steps: int, max_tokens: int, profile: bool, sampled: bool) -> dict:
    from grammar.api import build_constraint
    from grammar.constraint import GrammarConstraint

    narrow_rows = getattr(GrammarConstraint, "narrow_rows", None) or _narrow_each
    factory = build_constraint(
        tok, tools=g1_tools(), tool_choice="required", max_tokens=max_tokens, vocab_size=MODEL_VOCAB
    ).wait()
    batch = Batch(factory, None if sampled else call_tokens(tok, vocab), rows, max_tokens)
    bitmask = torch.empty(rows, vocab.mask_words, dtype=torch.int32)
    parts = {"fill_bitmasks": 0.0, "ll_rows": 0.0, "narrow": 0.0, "narrowed": 0}
    prof = cProfile.Profile() if profile else None
    for _ in range(steps):
        items = batch.items()
        # the engine's call, as a whole
        bitmask.fill_(-1)
        if prof:
            prof.enable()
        parts["fill_bitmasks"] += timed(GrammarConstraint.fill_bitmasks, bitmask, items)
        if prof:
            prof.disable()
        ref = bitmask.clone()
        # its parts: llguidance alone, row by row and on the executor; then the budget alone
        m = [(c.matcher, row) for c, row, _ in items]
        base, stride = bitmask.data_ptr(), bitmask.shape[1] * 4
        t0 = time.perf_counter()
        for r, i in m:
            r.m.unsafe_compute_mask_ptr(base + i * stride, stride)
        parts["ll_rows"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        before = sum(c.restricted_steps for c, _, _ in items)
        narrow_rows(bitmask, items)
        parts["narrow"] += time.perf_counter() - t0
        parts["narrowed"] += sum(c.restricted_steps for c, _, _ in items) - before
        assert torch.equal(bitmask, ref)
        batch.advance(ref, vocab.vocab_size)
    out = {k: (v / steps * 1e3 if isinstance(v, float) else v) for k, v in parts.items()}
    out["rows"] = rows
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    return out


def string_positions(tok, vocab, max_length: int = 60, repeats: int = 4) -> None:
    """One row's mask time inside a JSON string of maxLength `max_length`, by characters written
    (filled with "a", one character a token): where llguidance's slices stop covering the tokens
    that still fit, the trie walk over the longer ones is what a step waits for."""
    import llguidance

    from grammar.llguidance_backend import LIMITS

    a_id = tok.encode("a", add_special_tokens=False).ids[0]
    quote = tok.encode('"', add_special_tokens=False).ids[0]
    lark = 'start: %json {"type": "string", "maxLength": ' + str(max_length) + "}"
    proto = llguidance.LLMatcher(
        vocab.ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(lark), limits=LIMITS
    )
    row = torch.empty(vocab.mask_words, dtype=torch.int32)
    times = np.zeros((repeats, max_length))
    for r in range(repeats):
        m = proto.deep_copy()
        m.consume_tokens([quote])
        for k in range(max_length):
            times[r, k] = timed(m.unsafe_compute_mask_ptr, row.data_ptr(), row.numel() * 4)
            m.consume_tokens([a_id])
    for lo in range(0, max_length, 5):
        us = times[:, lo : lo + 5].mean() * 1e6
        print(f"string maxLength {max_length}, characters {lo:2d}-{lo + 4:2d} written: mask {us:6.0f} us")


def _on_executor(threads: int):
    """A fill_masks that computes a step's rows on llguidance's LLExecutor (its thread pool)."""
    import llguidance

    pool = llguidance.LLExecutor(num_threads=threads)

    def fill(bitmask: torch.Tensor, rows: list) -> None:
        base, stride = bitmask.data_ptr(), bitmask.shape[1] * 4
        pool.unsafe_compute_mask_ptr([(r.m, i) for r, i in rows], base, stride, bitmask.shape[0])

    return fill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--sampled", action="store_true", help="tokens drawn uniformly from each mask")
    ap.add_argument("--profile", action="store_true", help="cProfile the fill_bitmasks calls")
    ap.add_argument("--positions", action="store_true", help="one row's mask time along a bounded string")
    ap.add_argument("--pool", type=int, nargs="+", default=[0], help="LLExecutor sizes (0: row by row)")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    import grammar.llguidance_backend as backend
    from grammar.api import warmup
    from grammar.vocab import vocab_for
    from models.qwen_vocab import qwen_tokenizer_json

    tok = Tokenizer.from_file(str(qwen_tokenizer_json()))
    warmup(tok, MODEL_VOCAB)
    vocab = vocab_for(tok, MODEL_VOCAB)
    usable = len(os.sched_getaffinity(0))
    print(f"cores {os.cpu_count()} ({usable} usable), torch threads {torch.get_num_threads()}")
    if args.positions:
        string_positions(tok, vocab)
        return
    engine_fill = backend.LLGuidanceMatcher.fill_masks
    for pool, rows in [(p, r) for p in args.pool for r in args.rows]:
        backend.LLGuidanceMatcher.fill_masks = staticmethod(_on_executor(pool) if pool else engine_fill)
        run(tok, vocab, rows, 10, args.max_tokens, False, args.sampled)  # warm: llguidance's lexer caches
        r = run(tok, vocab, rows, args.steps, args.max_tokens, args.profile, args.sampled)
        print(
            f"{f'LLExecutor({pool})' if pool else 'row by row'} rows {rows:3d} max_tokens {args.max_tokens}: "
            f"fill_bitmasks {r['fill_bitmasks']:.3f} ms/step "
            f"({r['fill_bitmasks'] / rows * 1e3:.0f} us/row) | llguidance rows again {r['ll_rows']:.3f} ms "
            f"| narrow {r['narrow']:.3f} ms "
            f"({r['narrowed']} rows narrowed)"
        )


if __name__ == "__main__":
    main()
