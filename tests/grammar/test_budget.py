"""Calls complete within max_tokens: max_tokens at (and just above) the shortest valid call, the
invariant D(state) <= remaining at every step, and only shortest-path tokens once remaining == D."""

from __future__ import annotations

import random

import jsonschema
import numpy as np
import pytest

from bench.grammar import g1_tools
from grammar.api import build_constraint
from grammar.budget import MARGIN, BudgetCursor
from tests.grammar.conftest import MODEL_VOCAB
from tests.grammar.driver import RandomLogits, allowed_ids, decode, split_output
from tests.grammar.schemas import tool_set

V = MODEL_VOCAB


def _checker(max_tokens: int, stats: dict):
    # called after the mask is filled, before accept: what is left always fits (the margin may be
    # spent where llguidance's canonical tokens of forced text differ from the budget's path)
    steps = {"n": 0}

    def check(c, bitmask, tok):
        remaining = max_tokens - steps["n"]
        steps["n"] += 1
        d = c.cursor.dist
        assert not c.cursor.lost and d <= remaining, f"budget broken: need {d}, have {remaining}"
        if d + MARGIN >= remaining:
            stats["tight_steps"] = stats.get("tight_steps", 0) + 1
            probe = BudgetCursor(c.cursor.auto)
            probe.state = c.cursor.state
            probe.advance(tok)
            assert not probe.lost and probe.dist <= remaining - 1, f"token {tok} breaks the budget"

    return check


def _validate(tok, tools, ids, max_tokens, eos):
    assert len(ids) <= max_tokens and ids[-1] == eos
    _, calls = split_output(tok.decode(ids, skip_special_tokens=False))
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        jsonschema.validate(call["arguments"], schemas[call["name"]])
    return calls


def test_g1_below_minimum_is_an_error(tok, vocab):
    tools = g1_tools()
    f = build_constraint(tok, tools=tools, tool_choice="required", max_tokens=512, vocab_size=V)
    need = f.min_tokens
    assert 10 < need < 40
    with pytest.raises(ValueError, match="max_tokens"):
        build_constraint(tok, tools=tools, tool_choice="required", max_tokens=need - 1, vocab_size=V)
    assert build_constraint(tok, tools=tools, tool_choice="required", max_tokens=need, vocab_size=V)


def test_g1_at_the_minimum_and_just_above(tok, vocab):
    tools = g1_tools()
    f = build_constraint(tok, tools=tools, tool_choice="required", max_tokens=512, vocab_size=V)
    f.wait()
    logits = RandomLogits(MODEL_VOCAB, seed=11)
    stats: dict = {}
    for extra in range(0, 8):
        for _ in range(6):
            max_tokens = f.min_tokens + extra
            ids = decode(f, vocab, max_tokens, logits, check=_checker(max_tokens, stats))
            calls = _validate(tok, tools, ids, max_tokens, vocab.eos_id)
            assert len(calls) >= 1
    assert stats["tight_steps"] > 50


def test_random_tool_sets_tight_budgets(tok, vocab):
    rng = random.Random(99)
    logits = RandomLogits(MODEL_VOCAB, seed=12)
    stats: dict = {}
    n = 0
    for _ in range(12):
        tools = tool_set(rng, rng.randint(1, 4))
        name = rng.choice(tools)["function"]["name"]
        for choice in ("required", {"type": "function", "function": {"name": name}}):
            f = build_constraint(tok, tools=tools, tool_choice=choice, max_tokens=4096, vocab_size=V)
            f.wait()
            for extra in (0, 0, 1, 2, 5, 9):
                max_tokens = f.min_tokens + extra
                ids = decode(f, vocab, max_tokens, logits, check=_checker(max_tokens, stats))
                assert _validate(tok, tools, ids, max_tokens, vocab.eos_id)
                n += 1
    assert n == 144


def test_budget_leaves_the_mask_alone_far_from_the_limit(tok, vocab):
    f = build_constraint(tok, tools=g1_tools(), tool_choice="required", max_tokens=512, vocab_size=V)
    f.wait()
    c = f.new()
    import torch

    full = torch.full((1, vocab.mask_words), -1, dtype=torch.int32)
    c.fill_bitmask(full, 0, 512)
    assert c.restricted_steps == 0
    tight = torch.full((1, vocab.mask_words), -1, dtype=torch.int32)
    c.fill_bitmask(tight, 0, f.min_tokens)
    assert c.restricted_steps == 1
    a, b = allowed_ids(full[0], MODEL_VOCAB), allowed_ids(tight[0], MODEL_VOCAB)
    assert set(b) <= set(a) and len(b) >= 1
    assert not np.any(a >= vocab.n_tokens)  # embedding rows past the tokenizer are never allowed
