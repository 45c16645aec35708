"""build_constraint: None when nothing is constrained, clear ValueErrors, caching, async compile."""

from __future__ import annotations

import pytest

from grammar.api import build_constraint
from grammar.tools import grammar_spec
from tests.grammar.conftest import MODEL_VOCAB

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Calculator",
            "description": "math",
            "strict": None,
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "string"}},
                "required": ["input"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        },
    }
]


def test_nothing_to_constrain(tok):
    assert build_constraint(tok) is None
    assert build_constraint(tok, response_format={"type": "text"}) is None
    assert build_constraint(tok, tools=[], tool_choice=None) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "Nope"}}), "Nope"),
        (dict(tool_choice="required"), "needs at least one tool"),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice"),
        (dict(tools=TOOLS + TOOLS), "unique"),
        (dict(tools=TOOLS, tool_choice="required", max_tokens=3), "max_tokens"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "schema"),
        (dict(response_format={"type": "xml"}), "response_format"),
        (
            dict(
                tools=[
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {
                                "type": "object",
                                "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}},
                            },
                        },
                    }
                ],
                tool_choice="required",
            ),
            "empty integer range",
        ),
    ],
)
def test_errors_name_the_field(tok, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_constraint(tok, vocab_size=MODEL_VOCAB, **kwargs)


def test_cache_shares_one_compile(tok):
    a = build_constraint(tok, tools=TOOLS, tool_choice="required", vocab_size=MODEL_VOCAB)
    b = build_constraint(tok, tools=TOOLS, tool_choice="required", vocab_size=MODEL_VOCAB)
    assert a._grammar is b._grammar and a._budget is b._budget
    c = build_constraint(tok, tools=TOOLS, tool_choice="auto", vocab_size=MODEL_VOCAB)
    assert c._grammar is not a._grammar
    assert a.wait().ready()


def test_ready_is_false_while_compiling(tok, vocab):
    import threading

    from grammar.compiler import GrammarCompiler

    gate = threading.Event()
    compiler = GrammarCompiler(vocab)
    real = compiler.backend.compile

    class Slow:
        name = "slow"

        def compile(self, regex):
            gate.wait(5)
            return real(regex)

    compiler.backend = Slow()
    f = compiler.submit(grammar_spec(TOOLS, "required"))
    assert not f.ready()
    gate.set()
    f.wait(10)
    assert f.ready() and f.new() is not None


def test_modes_and_strict_and_schema_key_accepted():
    for choice in ("none", "auto", "required", {"type": "function", "name": "Calculator"}):
        spec = grammar_spec(TOOLS, choice, parallel_tool_calls=False)
        assert spec is not None
    assert grammar_spec(TOOLS, "none").mode == "none"  # free text that cannot open a call


def test_rollback_restores_masks(tok, vocab):
    import torch

    f = build_constraint(tok, tools=TOOLS, tool_choice="required", max_tokens=64, vocab_size=MODEL_VOCAB)
    f.wait()
    c = f.new()
    path = tok.encode(
        '<tool_call>\n{"name": "Calculator", "arguments": {"input":"1+1"}}\n</tool_call>',
        add_special_tokens=False,
    ).ids + [vocab.eos_id]

    def mask(remaining):
        m = torch.full((1, vocab.mask_words), -1, dtype=torch.int32)
        c.fill_bitmask(m, 0, remaining)
        return m.clone()

    before = mask(20)
    for t in path[:5]:
        assert c.accept_token(t)
    c.rollback(5)
    assert torch.equal(mask(20), before) and c.min_tokens_left == f.min_tokens
    for t in path:
        assert c.accept_token(t)
    assert c.is_terminated() and not c.accept_token(path[0])
    c.rollback(1)
    assert not c.is_terminated()


def test_without_vocab_size_a_wider_engine_bitmask_works(tok):
    # the app passes no vocab_size: our table has the tokenizer's 151,665 ids, the engine's bitmask
    # follows the model's 151,936 rows; the extra words must come back disallowed
    import json

    import jsonschema
    import torch

    from tests.grammar.driver import allowed_ids

    f = build_constraint(tok, tools=TOOLS, tool_choice="required", max_tokens=40)
    f.wait()
    c = f.new()
    words = (MODEL_VOCAB + 31) // 32
    ids = []
    for step in range(40):
        m = torch.full((2, words), -1, dtype=torch.int32)
        c.fill_bitmask(m, 1, 40 - step)
        allowed = allowed_ids(m[1], MODEL_VOCAB)
        assert allowed.max() < 151665 and bool((m[0] == -1).all())
        tok_id = int(allowed[step * 7919 % len(allowed)])
        assert c.accept_token(tok_id)
        ids.append(tok_id)
        if c.is_terminated():
            break
    text = tok.decode(ids, skip_special_tokens=False)
    body = text.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    jsonschema.validate(json.loads(body)["arguments"], TOOLS[0]["function"]["parameters"])
