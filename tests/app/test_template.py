"""Prompt rendering: the checkpoint's template with tools, and both fallbacks."""

from __future__ import annotations

import json

import pytest

from app.chat.template import ChatMessage, PromptRenderer
from app.chat.tool_parser import parse_whole
from app.errors import APIError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
HISTORY = [
    ChatMessage("system", "Be nice."),
    ChatMessage("user", "Weather?"),
    ChatMessage("assistant", "", tool_calls=[CALL]),
    ChatMessage("tool", "Sunny", tool_call_id="call_1"),
]
CHATML_NO_TOOLS = (
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class Swapped:
    """The real tokenizer with another chat_template."""

    def __init__(self, tok, template):
        self._tok = tok
        self.chat_template = template

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_checkpoint_template_renders_tools_and_history(qwen_tokenizer):
    r = PromptRenderer(qwen_tokenizer)
    assert r.has_template and r.supports_tools
    text = r.render(HISTORY, TOOLS)
    assert text.startswith("<|im_start|>system\nBe nice.\n\n# Tools")
    assert '"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nSunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    # what the model is shown is what the parser reads back
    _, calls = parse_whole(text.split("<|im_start|>assistant\n")[1])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_arguments_that_are_not_json_are_kept(qwen_tokenizer):
    call = {**CALL, "function": {"name": "get_weather", "arguments": "not json"}}
    text = PromptRenderer(qwen_tokenizer).render([ChatMessage("assistant", "", tool_calls=[call])], None)
    assert '"arguments": not json}' in text


def test_no_template_falls_back_to_chatml(qwen_tokenizer):
    r = PromptRenderer(Swapped(qwen_tokenizer, None))
    assert not r.has_template and r.supports_tools
    text = r.render(HISTORY, TOOLS)
    assert text.startswith("<|im_start|>system\nBe nice.\n\n# Tools")
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nSunny\n</tool_response>" in text
    assert (
        r.render([ChatMessage("user", "hi")], None)
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_without_tool_support_gets_tools_as_text(qwen_tokenizer):
    r = PromptRenderer(Swapped(qwen_tokenizer, CHATML_NO_TOOLS))
    assert r.has_template and not r.supports_tools
    text = r.render(HISTORY, TOOLS)
    assert "<|im_start|>system\nBe nice.\n\n# Tools" in text and "get_weather" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    )
    assert "<|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>" in text


def test_template_errors_are_400(qwen_tokenizer):
    raising = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(APIError) as info:
        PromptRenderer(Swapped(qwen_tokenizer, raising)).render([ChatMessage("user", "hi")], None)
    assert info.value.status_code == 400 and "alternate" in info.value.message


def test_tool_history_without_tools_on_a_template_without_tool_support(qwen_tokenizer):
    r = PromptRenderer(Swapped(qwen_tokenizer, CHATML_NO_TOOLS))
    text = r.render(HISTORY, None)
    assert "# Tools" not in text
    assert text.startswith("<|im_start|>system\nBe nice.<|im_end|>")
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>" in text
