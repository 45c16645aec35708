"""The synthetic tool-use data: seeded, rendered through chatloom's renderer, calls written so the
server's own parser reads back the intended call, and no held-out name or domain in training."""

from __future__ import annotations

import json
import random

import pytest

from app.chat.template import PromptRenderer
from app.chat.tool_parser import parse_whole
from grammar.dialects import GENERIC
from train.generate import END, Generator, check_disjoint
from train.heldout import ABSTAIN, PLAIN, heldout_tools
from train.lookup_tools import lookup_tools
from train.pattern_tools import pattern_tools
from train.procedural import record_tools
from train.tool_bank import hand_tools
from train.values import PLAIN_QA


def _renderer(folder):
    from transformers import AutoTokenizer

    return PromptRenderer(AutoTokenizer.from_pretrained(folder))


def test_heldout_names_and_domains_never_occur_in_training(smollm2_dir):
    training = (
        hand_tools()
        + record_tools(random.Random(0))
        + lookup_tools(random.Random(1))
        + pattern_tools(random.Random(2))
    )
    assert {t.name for t in Generator(0).tools} == {t.name for t in training}
    held = heldout_tools()
    assert {t.name for t in held}.isdisjoint({t.name for t in training})
    assert {t.domain for t in held}.isdisjoint({t.domain for t in training})
    # nor anywhere in the rendered training text, nor the held-out questions
    text = "\n".join(
        seg for row in Generator(3).samples(_renderer(smollm2_dir), 150) for seg, _ in row["segments"]
    )
    for t in held:
        assert t.name not in text
    questions = {q for q, _ in PLAIN_QA}
    assert questions.isdisjoint(ABSTAIN) and questions.isdisjoint(q for q, _ in PLAIN)


def test_a_tool_set_that_overlaps_the_heldout_one_is_refused():
    with pytest.raises(ValueError, match="held-out"):
        check_disjoint(hand_tools() + heldout_tools()[:1])
    with pytest.raises(ValueError, match="held-out"):
        Generator(0, tools=heldout_tools()[:2])


def test_lookup_requests_state_every_argument_verbatim():
    """Every argument of a lookup request is in the user's text as is, and the grounded answer
    repeats every value the result adds."""
    rng = random.Random(4)
    tools = lookup_tools(random.Random(1))
    assert len({t.domain for t in tools}) >= 40
    for _ in range(300):
        tool = rng.choice(tools)
        text, args = tool.request(rng)
        for value in args.values():
            assert (value if isinstance(value, str) else str(value)) in text
        result = tool.result(args, rng)
        answer = tool.answer(rng, args, result)
        for k, v in result.items():
            if k not in args and not isinstance(v, bool):
                assert str(v) in answer, (tool.name, result, answer)


def test_past_calls_vary_their_layout_and_targets_stay_compact():
    gen = Generator(2)
    tool = gen.tools[0]
    args = {"city": "Paris", "unit": "celsius"}
    assert {gen._call(tool, args)["function"]["arguments"] for _ in range(20)} == {
        '{"city":"Paris","unit":"celsius"}'
    }
    seen = {gen._call(tool, args, history=True)["function"]["arguments"] for _ in range(40)}
    assert seen == {'{"city":"Paris","unit":"celsius"}', '{"city": "Paris", "unit": "celsius"}'}


def test_generation_is_seeded(smollm2_dir):
    renderer = _renderer(smollm2_dir)
    first = list(Generator(7).samples(renderer, 20))
    assert first == list(Generator(7).samples(renderer, 20))
    assert first != list(Generator(8).samples(renderer, 20))


def test_targets_are_what_the_server_parses_back(smollm2_dir):
    """Every target turn, read by the server's tool-call parser in the served dialect, gives calls of
    offered tools with JSON-object arguments (or plain text), and the prompt is the renderer's."""
    renderer = _renderer(smollm2_dir)
    assert renderer.dialect is GENERIC  # SmolLM2's template knows no tools
    rows = list(Generator(1).samples(renderer, 60))
    kinds = {row["kind"] for row in rows}
    assert {"conversation", "call"} <= kinds
    calls = texts = 0
    for row in rows:
        offered = {
            json.loads(line)["function"]["name"]
            for seg, target in row["segments"]
            if not target
            for line in seg.splitlines()
            if line.startswith('{"type": "function"')
        }
        for seg, target in row["segments"]:
            if not target:
                continue
            assert seg.endswith(END)
            content, parsed = parse_whole(seg.removesuffix(END), fmt=GENERIC)
            if parsed:
                calls += len(parsed)
                assert content is None
                for call in parsed:
                    assert call.name in offered
                    assert isinstance(json.loads(call.arguments), dict)
            else:
                texts += 1
                assert content and "<tool_call>" not in content
    assert calls > 30 and texts > 20


def test_a_call_example_renders_like_the_server(smollm2_dir):
    """The prompt of a single-call example is exactly PromptRenderer.render of its messages."""
    renderer = _renderer(smollm2_dir)
    gen = Generator(5)
    msgs, tools, target = gen.example("call")
    openai = [t.openai(gen.rng) for t in tools]
    prompt = renderer.render(msgs, openai)
    assert prompt.endswith("<|im_start|>assistant\n") and "<tools>" in prompt
    assert target.startswith("<tool_call>\n{") and target.endswith("}\n</tool_call>")
