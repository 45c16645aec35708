"""The copy bias on the real embedded model (tuned SmolLM2-135M, float32 on the CPU) through the
OpenAI API, tool_choice auto, grammar on: arguments spelled as the user wrote them. Without the
bias this model writes "serendipous", "The Warriors" and "meter" for these three requests (tools
and requests made up here, in no training or held-out set)."""

from __future__ import annotations

import json

import pytest

from train import eval_tools


def _tool(name: str, desc: str, props: dict[str, str]) -> dict:
    params = {k: {"type": "string", "description": v} for k, v in props.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": params, "required": list(props)},
        },
    }


TOOLS = [
    _tool("team_record", "Win/loss record of a sports team", {"team": "the team's name"}),
    _tool(
        "convert_length",
        "Convert a length between units",
        {"amount": "the number", "from_unit": "unit to convert from", "to_unit": "unit to convert to"},
    ),
    _tool("word_lookup", "Look a word up in the dictionary", {"word": "the word"}),
]
CASES = [
    ("Look up the word serendipitous.", "word_lookup", {"word": "serendipitous"}),
    ("How are the Warriors doing this season?", "team_record", {"team": "Warriors"}),
    ("How many feet are in 500 meters?", "convert_length", {"from_unit": "meters", "to_unit": "feet"}),
]


@pytest.mark.slow
def test_arguments_are_spelled_as_the_user_wrote_them(smollm2_dir, monkeypatch):
    monkeypatch.delenv("CHATLOOM_COPY_BIAS", raising=False)
    monkeypatch.delenv("CHATLOOM_QUANTIZATION", raising=False)
    with eval_tools.served(eval_tools.model_dir("tuned")) as post:
        for text, name, want in CASES:
            messages = [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": text},
            ]
            body = {"model": "chatloom", "messages": messages, "tools": TOOLS, "tool_choice": "auto"}
            reply = post(body | {"temperature": 0, "max_tokens": 96})
            calls = reply["choices"][0]["message"]["tool_calls"]
            assert calls and calls[0]["function"]["name"] == name, reply
            args = json.loads(calls[0]["function"]["arguments"])
            assert {k: args.get(k) for k in want} == want, (text, args)
