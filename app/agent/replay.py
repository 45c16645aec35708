"""Replay: the stored history -> the prompt's token ids, so consecutive turns share a prefix.

Two rules keep turn N+1's prompt an extension of turn N's prompt + reply, token for token:
1. Assistant messages the engine generated are replayed from their stored token ids, not
   re-tokenized from text (a sampled token sequence is often not the tokenizer's own encoding of
   that text). The chat template renders a sentinel in their place; the text around the sentinels
   is tokenized piece by piece. Chat-template pieces begin and end at special tokens
   (<|im_start|>, <|im_end|>), where tokenization restarts anyway, so the pieces tokenize exactly
   as the whole text would.
2. The memory window's start moves in strides (half the window), not one turn at a time, so most
   turns still extend the previous prompt instead of dropping its oldest turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from app.chat.template import ChatMessage, PromptRenderer

_SENTINEL = "\x1fchatloom-replay-{}\x1f"
_SENTINEL_RE = re.compile("\x1fchatloom-replay-(\\d+)\x1f")


def group_turns(messages: Sequence[dict]) -> list[list[dict]]:
    """Split at user messages: a turn is a user message and everything after it up to the next
    one (assistant replies, tool calls and their results stay together). Messages before the
    first user message form a turn of their own."""
    groups: list[list[dict]] = []
    for m in messages:
        if m["role"] == "user" or not groups:
            groups.append([])
        groups[-1].append(m)
    return groups


def window_start(num_turns: int, max_turns: int, stride: int | None = None) -> int:
    """Index of the first kept turn: 0 while the history fits; then it advances by `stride`
    turns at a time, keeping between max_turns - stride + 1 and max_turns turns."""
    if max_turns <= 0:
        return num_turns
    if num_turns <= max_turns:
        return 0
    stride = stride or max(1, max_turns // 2)
    return -(-(num_turns - max_turns) // stride) * stride


def drop_orphans(messages: list[dict]) -> list[dict]:
    """Tool results whose call is not in the list (and calls without results at the end are
    kept: the model may see its own pending call). Imported n8n rows can produce these."""
    known: set[str] = set()
    out = []
    for m in messages:
        if m["role"] == "assistant":
            known.update(c.get("id") for c in m.get("tool_calls") or [])
        if m["role"] == "tool" and m.get("tool_call_id") not in known:
            continue
        out.append(m)
    return out


def trim(messages: Sequence[dict], max_turns: int | None) -> list[dict]:
    if not max_turns:
        return list(messages)
    groups = group_turns(messages)
    start = window_start(len(groups), max_turns)
    return drop_orphans([m for g in groups[start:] for m in g])


def _tokenize(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def render_ids(
    tokenizer,
    messages: Sequence[dict],
    *,
    system_prompt: str | None = None,
    tools: list[dict] | None = None,
) -> list[int]:
    """messages: OpenAI-style dicts; an assistant message may carry "token_ids" (its generated
    ids, stop token excluded) which are spliced in verbatim. Rendered with the API's renderer
    (the checkpoint's template, its fallbacks), generation prompt included."""
    chat: list[ChatMessage] = []
    spliced: list[list[int]] = []
    if system_prompt:
        chat.append(ChatMessage("system", system_prompt))
    for m in messages:
        if m["role"] == "assistant" and m.get("token_ids"):
            chat.append(ChatMessage("assistant", _SENTINEL.format(len(spliced))))
            spliced.append(list(m["token_ids"]))
            continue
        chat.append(
            ChatMessage(
                m["role"],
                m.get("content") or "",
                m.get("tool_calls") or None,
                m.get("tool_call_id"),
                m.get("name"),
            )
        )
    text = PromptRenderer(tokenizer).render(chat, tools or None)
    ids: list[int] = []
    pos = 0
    for match in _SENTINEL_RE.finditer(text):
        ids += _tokenize(tokenizer, text[pos : match.start()])
        ids += spliced[int(match.group(1))]
        pos = match.end()
    ids += _tokenize(tokenizer, text[pos:])
    return ids


def _approx_tokens(tokenizer, m: dict) -> int:
    """A message's size without rendering (ids when stored, else its text): deterministic, so the
    cut computed from it lands on the same turn every time."""
    if m.get("token_ids"):
        return len(m["token_ids"]) + 4
    n = len(_tokenize(tokenizer, m.get("content") or ""))
    for call in m.get("tool_calls") or []:
        n += len(_tokenize(tokenizer, json.dumps(call.get("function", {})))) + 6
    return n + 4  # role header and end markers


def fit_tokens(
    tokenizer,
    messages: list[dict],
    max_tokens: int,
    **render_kwargs,
) -> tuple[list[dict], list[int]]:
    """Drop whole turns from the front until the rendered prompt has at most max_tokens ids (the
    last turn is always kept). The amount dropped is rounded up to a stride of max_tokens / 4, so
    the cut stays on the same turn while the conversation grows by up to a stride: those turns
    still extend the previous prompt. Returns the kept messages and their ids."""
    ids = render_ids(tokenizer, messages, **render_kwargs)
    if len(ids) <= max_tokens:
        return list(messages), ids
    groups = group_turns(messages)
    sizes = [sum(_approx_tokens(tokenizer, m) for m in g) for g in groups]
    stride = max(1, max_tokens // 4)
    target = -(-(len(ids) - max_tokens) // stride) * stride
    start, dropped = 0, 0
    while start < len(groups) - 1 and dropped < target:
        dropped += sizes[start]
        start += 1
    while True:
        kept = drop_orphans([m for g in groups[start:] for m in g])
        ids = render_ids(tokenizer, kept, **render_kwargs)
        if len(ids) <= max_tokens or start >= len(groups) - 1:
            return kept, ids
        start += 1
