"""Streaming and not: constrained outputs fed to the API's own tool-call parser
(app/chat/tool_parser.py), token by token through the engine's incremental detokenizer and whole;
the joined argument fragments parse and validate, and both ways agree."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from grammar.api import build_constraint
from tests.grammar.conftest import MODEL_VOCAB
from tests.grammar.driver import RandomLogits, decode
from tests.grammar.schemas import tool_set

parser_mod = pytest.importorskip("app.chat.tool_parser")
detok_mod = pytest.importorskip("engine.detokenizer")


def _parse(deltas: list[str]) -> list[tuple[str, str]]:
    p = parser_mod.ToolCallParser(id_factory=lambda: "call_x")
    events = []
    for d in deltas:
        events += p.feed(d)
    events += p.finish()
    calls: dict[int, list] = {}
    for e in events:
        if isinstance(e, parser_mod.CallStart):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, parser_mod.CallArgs):
            calls[e.index][1] += e.fragment
    return [(name, args) for name, args in (calls[i] for i in sorted(calls))]


def test_api_parser_streaming_and_whole(tok, vocab):
    rng = random.Random(77)
    logits = RandomLogits(MODEL_VOCAB, seed=21)
    n_calls = 0
    for _ in range(8):
        tools = tool_set(rng)
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        for choice, bias in (("required", 0.0), ("auto", 10.0)):
            f = build_constraint(tok, tools=tools, tool_choice=choice, max_tokens=200, vocab_size=MODEL_VOCAB)
            f.wait()
            for _ in range(6):
                ids = decode(f, vocab, rng.randint(max(64, f.min_tokens), 200), logits, open_bias=bias)
                body = ids[:-1] if ids[-1] == vocab.eos_id else ids
                det = detok_mod.IncrementalDetokenizer(tok, [], [], skip_special_tokens=False)  # as the app
                deltas = []
                for t in body:
                    det.add(t)
                    deltas.append(det.delta(False))
                det.flush()
                deltas.append(det.delta(True))
                streamed = _parse(deltas)
                whole = _parse(["".join(deltas)])
                assert streamed == whole
                for name, args in streamed:
                    jsonschema.validate(json.loads(args), schemas[name])
                n_calls += len(streamed)
    assert n_calls > 50
