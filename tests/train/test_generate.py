"""The synthetic tool-use data: seeded, rendered through chatloom's renderer, calls written so the
server's own parser reads back the intended call, and no held-out name or domain in training."""

from __future__ import annotations

import json
import random

from app.chat.template import PromptRenderer
from app.chat.tool_parser import parse_whole
from grammar.dialects import GENERIC
from train.generate import END, Generator
from train.heldout import ABSTAIN, PLAIN, heldout_tools
from train.procedural import record_tools
from train.tool_bank import hand_tools
from train.values import PLAIN_QA


def _renderer(folder):
    from transformers import AutoTokenizer

    return PromptRenderer(AutoTokenizer.from_pretrained(folder))


def test_heldout_names_and_domains_never_occur_in_training(smollm2_dir):
    training = hand_tools() + record_tools(random.Random(0))
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
