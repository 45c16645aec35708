"""Prompt rendering with the checkpoint's own chat template (transformers' apply_chat_template),
tools included, in the model family's tool-call dialect (grammar/dialects.py). Fallbacks: a
checkpoint without a template gets our ChatML template; a template that ignores `tools` (the generic
dialect) gets the tools, calls and results written into the messages as text, in the form the
grammar constrains and the tool-call parser reads back."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import APIError
from grammar.dialects import MISTRAL, Dialect, resolve, template_source

log = logging.getLogger("chatloom.template")

FALLBACK_TEMPLATE = (Path(__file__).with_name("fallback_template.jinja")).read_text()

_TOOLS_INTRO = (
    "# Tools\n\nYou may call functions. Their signatures are inside <tools></tools>:\n<tools>\n{tools}\n"
    "</tools>\n\nTo call a function, reply with a JSON object with its name and arguments, "
    "exactly like this:\n{example}"
)


@dataclass
class ChatMessage:
    """One message in the plain form templates take: role, text content, tool calls, tool call id."""

    role: str
    content: str
    tool_calls: list[dict[str, Any]] | None = None  # [{"id", "type", "function": {"name", "arguments"}}]
    tool_call_id: str | None = None
    name: str | None = None

    def to_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": _args_value(c["function"]["arguments"]),
                    },
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def _args_value(arguments: str) -> Any:
    # templates expect an object (HF convention) and many `tojson` it; keep text that is not JSON
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments
    return value if isinstance(value, dict) else arguments


class PromptRenderer:
    """tool_call_format: a dialect name (`--tool-call-format`), or None/"auto": the template's own."""

    def __init__(self, tokenizer: Any, tool_call_format: str | None = None) -> None:
        self.tokenizer = tokenizer
        source = template_source(tokenizer)
        self.has_template = source is not None
        self.template = source if source is not None else FALLBACK_TEMPLATE
        name = tool_call_format or getattr(tokenizer, "tool_call_format", None)
        self.dialect: Dialect = resolve(name, self.template)
        self.tool_format = self.dialect  # what the tool-call parser reads
        # the template renders tools and calls itself, unless it knows none or the dialect is ours
        self.supports_tools = "tools" in self.template and not self.dialect.in_prompt
        if not self.has_template:
            log.warning("the checkpoint has no chat template; using chatloom's ChatML fallback")
        elif not self.supports_tools:
            log.warning("the chat template ignores tools; tools are written into the system message")
        log.info("tool calls in the %s dialect", self.dialect.name)

    def render(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None) -> str:
        has_tool_turns = any(m.tool_calls or m.role == "tool" for m in messages)
        if not self.supports_tools and (tools or has_tool_turns):
            convo = _tools_as_text(messages, tools or [], self.dialect)
            tools = None
        else:
            convo = [m.to_template() for m in messages]
            if self.dialect is MISTRAL:
                _short_call_ids(convo)
        try:
            text = self.tokenizer.apply_chat_template(
                convo,
                tools=tools or None,
                chat_template=self.template,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # jinja errors and the template's raise_exception(): the input's fault
            import jinja2

            if isinstance(exc, jinja2.TemplateError):
                raise APIError(f"The chat template rejected the messages: {exc}", param="messages") from exc
            raise
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _short_call_ids(convo: list[dict[str, Any]]) -> None:
    """Mistral's templates demand call ids of 9 letters and digits: map every id to one, the same
    for a call and its result."""

    def short(call_id: str) -> str:
        if len(call_id) == 9 and call_id.isalnum():
            return call_id
        return hashlib.sha256(call_id.encode()).hexdigest()[:9]

    for m in convo:
        for c in m.get("tool_calls") or []:
            c["id"] = short(c["id"])
        if m.get("tool_call_id") is not None:
            m["tool_call_id"] = short(m["tool_call_id"])


def _calls_text(dialect: Dialect, calls: list[dict[str, Any]]) -> str:
    """Calls written the way the dialect's grammar makes the model write them."""
    bodies = [
        f'{{"name": {json.dumps(c["function"]["name"])}, "{dialect.args_key}": '
        f"{c['function']['arguments'] or '{}'}}}"
        for c in calls
    ]
    if dialect.list_form:
        return f"{dialect.open}[{dialect.sep.join(bodies)}]"
    return dialect.sep.join(f"{dialect.open}{b}{dialect.close}" for b in bodies)


def _tools_as_text(
    messages: list[ChatMessage], tools: list[dict[str, Any]], dialect: Dialect
) -> list[dict[str, Any]]:
    """For templates without tool support: every tool concept becomes plain message text."""
    out: list[dict[str, Any]] = []
    rest = messages
    if tools:
        example = _calls_text(
            dialect, [{"function": {"name": "<function-name>", "arguments": "<args-json-object>"}}]
        )
        intro = _TOOLS_INTRO.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools), example=example
        )
        if messages and messages[0].role == "system":
            out.append({"role": "system", "content": messages[0].content + "\n\n" + intro})
            rest = messages[1:]
        else:
            out.append({"role": "system", "content": intro})
    for m in rest:
        if m.role == "assistant" and m.tool_calls:
            calls = _calls_text(dialect, m.tool_calls)
            out.append(
                {"role": "assistant", "content": "\n".join(([m.content] if m.content else []) + [calls])}
            )
        elif m.role == "tool":
            text = f"<tool_response>\n{m.content}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text, "_tool": True})
        else:
            out.append({"role": m.role, "content": m.content})
    for m in out:
        m.pop("_tool", None)
    return out
