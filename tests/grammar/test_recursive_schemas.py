"""Recursive and deeply nested schemas (a tree through `$ref: "#"`, objects six deep, arrays of
arrays), as tool parameters and as response_format: 100 requests sampled at temperature 1 (random
logits over the real 150k vocabulary) all end inside max_tokens with JSON that validates. The
grammar is llguidance's exact one; the budget's regex unrolls the recursion (schema_regex)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar.api import build_constraint
from tests.grammar.conftest import MODEL_VOCAB
from tests.grammar.driver import RandomLogits, decode, split_output

TREE = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "maxLength": 8},
        "children": {"type": "array", "items": {"$ref": "#"}},
    },
    "required": ["label", "children"],
}
DEFS_TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]},
            },
            "required": ["v", "next"],
        }
    },
    "$ref": "#/$defs/node",
}


def _deep(depth: int) -> dict:
    node: dict = {"type": "object", "properties": {"leaf": {"type": "boolean"}}, "required": ["leaf"]}
    for i in range(depth - 1):
        node = {
            "type": "object",
            "properties": {f"k{i}": node, "n": {"type": "number"}},
            "required": [f"k{i}"],
        }
    return node


ARRAYS = {
    "type": "object",
    "properties": {
        "grid": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        }
    },
    "required": ["grid"],
}
SCHEMAS = {"tree": TREE, "defs_tree": DEFS_TREE, "deep6": _deep(6), "arrays": ARRAYS}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_recursive_and_deep_schemas_always_validate(tok, vocab, name):
    schema = SCHEMAS[name]
    logits = RandomLogits(MODEL_VOCAB, seed=len(name))
    tool = [{"type": "function", "function": {"name": "build", "parameters": schema}}]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    for i in range(25):  # 4 schemas x 25 = 100 requests
        max_tokens = 96 + 32 * (i % 4)
        if i % 2:
            f = build_constraint(
                tok, tools=tool, tool_choice="required", max_tokens=max_tokens, vocab_size=MODEL_VOCAB
            )
        else:
            f = build_constraint(tok, response_format=fmt, max_tokens=max_tokens, vocab_size=MODEL_VOCAB)
        ids = decode(f.wait(), vocab, max_tokens, logits)
        assert ids[-1] == vocab.eos_id and len(ids) <= max_tokens, f"{name} #{i}: not finished"
        text = tok.decode(ids, skip_special_tokens=False)
        if i % 2:
            _, calls = split_output(text)
            assert len(calls) >= 1
            for call in calls:
                jsonschema.validate(call["arguments"], schema)
        else:
            jsonschema.validate(json.loads(text.removesuffix("<|im_end|>")), schema)


def test_a_schema_branching_into_itself_stays_bounded(tok):
    # 12 recursive references a node: unrolled six deep it would be 12**6 nodes; it nests less deep
    wide = {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(12)}}
    f = build_constraint(
        tok, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": wide}}
    )
    assert f.wait().min_tokens >= 2
