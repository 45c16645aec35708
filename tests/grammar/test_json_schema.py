"""response_format json_schema (≥ 200 random schemas, n8n-style) and json_object through the same
path: every output parses and validates, within max_tokens."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from grammar.api import build_constraint
from tests.grammar.conftest import MODEL_VOCAB
from tests.grammar.driver import RandomLogits, decode
from tests.grammar.schemas import DRAFT7, response_schema

N8N_SCHEMAS = [
    # what n8n's Structured Output Parser / tools send (zod-to-json-schema, draft-07)
    {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
        "additionalProperties": False,
        "$schema": DRAFT7,
    },
    {
        "type": "object",
        "properties": {"state": {"type": "string"}, "cities": {"type": "array", "items": {"type": "string"}}},
        "required": ["state", "cities"],
        "additionalProperties": False,
        "$schema": DRAFT7,
    },
    {"type": "object", "properties": {}, "additionalProperties": False, "$schema": DRAFT7},
]


def _run(tok, vocab, schema, max_tokens, logits, response_format=None):
    rf = response_format or {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    f = build_constraint(tok, response_format=rf, max_tokens=max_tokens, vocab_size=MODEL_VOCAB)
    f.wait()
    ids = decode(f, vocab, max_tokens, logits)
    assert ids[-1] == vocab.eos_id and len(ids) <= max_tokens
    doc = json.loads(tok.decode(ids[:-1]))
    jsonschema.validate(doc, schema)
    return doc


@pytest.mark.timeout(300)
def test_two_hundred_schemas_validate(tok, vocab):
    rng = random.Random(5)
    logits = RandomLogits(MODEL_VOCAB, seed=3)
    schemas = N8N_SCHEMAS + [response_schema(rng) for _ in range(200)]
    for schema in schemas:
        _run(tok, vocab, schema, rng.randint(64, 256), logits)
    assert len(schemas) >= 200


def test_json_object(tok, vocab):
    logits = RandomLogits(MODEL_VOCAB, seed=4)
    for max_tokens in (8, 16, 64, 128):
        doc = _run(tok, vocab, {"type": "object"}, max_tokens, logits, {"type": "json_object"})
        assert isinstance(doc, dict)


def test_responses_api_format_shape(tok, vocab):
    # the Responses API puts name/schema directly in text.format
    logits = RandomLogits(MODEL_VOCAB, seed=5)
    schema = N8N_SCHEMAS[1]
    _run(tok, vocab, schema, 96, logits, {"type": "json_schema", "name": "x", "schema": schema})
