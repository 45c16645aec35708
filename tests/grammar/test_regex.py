"""Regex building blocks: exact integer ranges, free text that cannot spell a call tag, escaping."""

from __future__ import annotations

import json
import re

import pytest

from grammar.schema_regex import escape, int_range_regex, json_schema_regex
from grammar.tools import grammar_spec

RANGES = [
    (1, 5),
    (0, None),
    (None, None),
    (-13, 7),
    (-100, -3),
    (None, 42),
    (5, None),
    (99, 1234),
    (0, 0),
    (-5, None),
    (None, -20),
    (10, 10),
    (7, 300),
]


@pytest.mark.parametrize(("lo", "hi"), RANGES)
def test_int_range_matches_brute_force(lo, hi):
    rx = re.compile(int_range_regex(lo, hi))
    for x in range(-2500, 2500):
        inside = (lo is None or x >= lo) and (hi is None or x <= hi)
        assert bool(rx.fullmatch(str(x))) == inside, (lo, hi, x)
    # "-0" is JSON's negative zero, which llguidance writes for an integer: it is 0
    zero_inside = (lo is None or lo <= 0) and (hi is None or hi >= 0)
    assert bool(rx.fullmatch("-0")) == zero_inside and not rx.fullmatch("01")


def test_empty_range_is_an_error():
    with pytest.raises(ValueError, match="empty integer range"):
        int_range_regex(3, 2)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("hello <b> x", True),
        ("a < b << c", True),
        ("</div>", True),
        ("<tool_call", True),
        ("<<tool_ca", True),
        ("<tool_call>", False),
        ("x<tool_call>y", False),
        ("to<tool_call>", False),
        ("a</tool_call>", False),
        ("tab\tnew\nline ünï 中文", True),
    ],
)
def test_free_text_cannot_spell_a_marker(tok, vocab, text, ok):
    # auto mode: the text before a call is free, but spelling a marker with ordinary tokens (which
    # the parser would take for a call) is outside the grammar
    import random

    from grammar.api import build_constraint
    from tests.grammar.schemas import tool_set

    f = build_constraint(
        tok, tools=tool_set(random.Random(0)), tool_choice="auto", vocab_size=vocab.vocab_size
    )
    c = f.wait().new()
    # spelled with ordinary tokens: "<tool_call" and ">" apart (the tokenizer would match the marker)
    ids = []
    for i, part in enumerate(text.split("<tool_call>")):
        if i:
            ids += tok.encode("<tool_call", add_special_tokens=False).ids + tok.encode(">").ids
        ids += tok.encode(part, add_special_tokens=False).ids if part else []
    assert vocab.markers["<tool_call>"] not in ids
    accepted = all(c.accept_token(t) for t in ids) and c.accept_token(vocab.eos_id)
    assert accepted == ok


def test_escape_round_trips_literals():
    lit = '{"name": "a.b(c)*", "arguments": [x|y]^$?+\\\n'
    assert re.fullmatch(escape(lit), lit)


def test_schema_patches_and_annotations():
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "description": "d",
        "properties": {
            "p": {"type": "integer", "minimum": 1, "maximum": 5, "title": "P"},
            "x": {"type": "number", "exclusiveMinimum": 0, "maximum": 9.5},
        },
        "required": ["p", "x"],
        "additionalProperties": False,
    }
    rx = re.compile(json_schema_regex(schema))
    compact = {"separators": (",", ":")}  # the layout llguidance writes
    assert rx.fullmatch(json.dumps({"p": 5, "x": 9}, **compact))
    assert not rx.fullmatch(json.dumps({"p": 6, "x": 9}, **compact))
    assert not rx.fullmatch(json.dumps({"p": 1, "x": 0}, **compact))


def test_call_regex_shape():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    # without a vocabulary the markers are text (as for a vocabulary without <tool_call> tokens)
    spec = grammar_spec(tools, "required", parallel_tool_calls=False)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    assert re.fullmatch(spec.budget_regex, call)
    assert not re.fullmatch(spec.budget_regex, call + "\n" + call)
    spec2 = grammar_spec(tools, "required", parallel_tool_calls=True)
    assert re.fullmatch(spec2.budget_regex, call + "\n" + call)
    auto = grammar_spec(tools, "auto")
    assert re.fullmatch(auto.budget_regex, "Let me check.\n" + call)
    assert re.fullmatch(auto.budget_regex, "just text")
