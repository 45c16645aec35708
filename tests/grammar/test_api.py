"""build_constraint: None when nothing is constrained, clear ValueErrors, caching, async compile."""

from __future__ import annotations

import pytest

from grammar.api import build_constraint
from grammar.tools import grammar_spec
from tests.grammar.conftest import MODEL_VOCAB

TOOLS = [{"type": "function", "function": {"name": "Calculator", "description": "math", "strict": None,
          "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
                         "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}}}]


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
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}}}],
            tool_choice="required"), "empty integer range"),
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
