"""The one place the app asks grammar/ for a decoding constraint (tool calls, response_format)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from app.errors import APIError
from grammar import api
from grammar.dialects import Dialect
from grammar.errors import GrammarInputError

log = logging.getLogger("chatloom.constraints")

_PARAMS = ("max_tokens", "tool_choice", "tools", "response_format", "parallel_tool_calls")


def copy_processors(
    tokenizer: Any,
    calls_constrained: bool,
    *,
    sources: list[Any],
    dialect: Dialect,
    vocab_size: int | None,
    strength: float,
) -> list:
    """The copy bias (grammar/copying.py) for a request whose tool calls are constrained: [] when
    they are not (no grammar, or tool_choice "none"), without text to copy from, or with strength 0.
    sources: the request's messages (ChatMessage objects or stored dicts); the user, tool and system
    texts are copied from."""
    if not calls_constrained or strength <= 0:
        return []
    texts = []
    for m in sources:
        role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if role in ("user", "tool", "system") and isinstance(content, str) and content:
            texts.append(content)
    if not texts:
        return []
    from grammar.copying import CopyBias
    from grammar.vocab import vocab_for

    return [CopyBias(vocab_for(tokenizer, vocab_size), dialect, texts, word=strength, start=strength / 12)]


def warmup(tokenizer: Any, vocab_size: int | None) -> None:
    """Build the grammar token tables at start-up (seconds) rather than in the first tool request."""
    try:
        api.warmup(tokenizer, vocab_size)
    except Exception:
        log.exception("grammar warm-up failed; grammars will be built on first use")


async def build_constraint(
    tokenizer: Any,
    *,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    response_format: dict[str, Any] | None,
    max_tokens: int,
    vocab_size: int | None = None,
    dialect: Dialect | None = None,
    timeout_s: float = 30.0,
) -> Any | None:
    """A ConstraintFactory for SamplingParams.constraint, or None (nothing to constrain).
    vocab_size: the model's logits width, which can exceed the tokenizer's (padded embedding rows
    must be masked too); dialect: the model's tool-call dialect (None: from its chat template).

    The request's own mistakes (GrammarInputError) are a 400 naming the field; any other failure
    while building the grammar is ours and propagates as a 500. A grammar that takes longer than
    timeout_s to build does not hold the request: with tools in auto/none mode decoding goes on
    unconstrained (the parser still extracts calls); when the client demanded structure (required,
    a named function, a JSON response_format) it is a 400."""
    wants_format = response_format is not None and response_format.get("type") != "text"
    if not tools and not wants_format:
        return None
    kwargs: dict[str, Any] = dict(
        tools=tools or None,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=parallel_tool_calls,
        response_format=response_format if wants_format else None,
        max_tokens=max_tokens,
        vocab_size=vocab_size,
        dialect=dialect,
    )
    try:
        # a new grammar's tables take tens to hundreds of ms: keep them off the event loop
        return await asyncio.wait_for(asyncio.to_thread(api.build_constraint, tokenizer, **kwargs), timeout_s)
    except TimeoutError:
        demanded = wants_format or tool_choice == "required" or isinstance(tool_choice, dict)
        what = "response_format" if wants_format else "tools"
        log.error("grammar for %s not built within %.1fs (demanded=%s)", what, timeout_s, demanded)
        if demanded:
            raise APIError(
                f"The grammar for '{what}' could not be built within {timeout_s:g} s; "
                "simplify its JSON schema.",
                param=what,
                code="grammar_timeout",
            ) from None
        return None
    except GrammarInputError as exc:
        message = str(exc)
        param = next((p for p in _PARAMS if message.startswith(p)), None)
        raise APIError(message, param=param) from exc
