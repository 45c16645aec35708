"""llguidance's matcher, driven by random logits over the real 150k vocabulary, with the budget:
every output validates and ends within max_tokens."""

from __future__ import annotations

import random

import jsonschema
import torch

from grammar.api import build_constraint
from tests.grammar.conftest import MODEL_VOCAB
from tests.grammar.driver import RandomLogits, allowed_ids, decode, split_output

SMALL = [
    {
        "type": "function",
        "function": {
            "name": "Calculator",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {
                    "input": {"type": "string", "maxLength": 12},
                    "mode": {"type": "string", "enum": ["exact", "fast"]},
                },
                "required": ["input"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        },
    }
]
NUMERIC = [
    {
        "type": "function",
        "function": {
            "name": "pick",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    }
]


def _drive(tok, vocab, tools, choice, n, seed, bias=0.0):
    f = build_constraint(tok, tools=tools, tool_choice=choice, max_tokens=64, vocab_size=MODEL_VOCAB)
    f.wait()
    logits = RandomLogits(MODEL_VOCAB, seed)
    rng = random.Random(seed)
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    called = 0
    for _ in range(n):
        max_tokens = rng.randint(f.min_tokens, 64)
        ids = decode(f, vocab, max_tokens, logits, open_bias=bias)
        assert ids[-1] == vocab.eos_id and len(ids) <= max_tokens
        _, calls = split_output(tok.decode(ids, skip_special_tokens=False))
        for call in calls:
            jsonschema.validate(call["arguments"], schema[call["name"]])
        called += bool(calls)
    return called


def test_small_tool_set(tok, vocab):
    assert _drive(tok, vocab, SMALL, "required", 12, seed=1) == 12


def test_numeric_bounds(tok, vocab):
    assert _drive(tok, vocab, NUMERIC, "required", 24, seed=3) == 24


def test_error_state_ends_with_eos(tok, vocab):
    from grammar.llguidance_backend import LLGuidanceBackend
    from grammar.tools import grammar_spec

    g = LLGuidanceBackend(vocab).compile(grammar_spec(SMALL, "required", vocab=vocab).lark)
    m = g.matcher()
    m.m.consume_token(9707)  # "Hello" where only <tool_call> may come: the matcher is now in error
    row = torch.full((vocab.mask_words,), -1, dtype=torch.int32)
    m.fill_mask(row)
    assert allowed_ids(row, MODEL_VOCAB).tolist() == [vocab.eos_id]
