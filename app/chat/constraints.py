"""The one place the app asks grammar/ for a decoding constraint (tool calls, response_format)."""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from app.errors import APIError

log = logging.getLogger("chatloom.constraints")


def _grammar_api() -> Any | None:
    try:
        return importlib.import_module("grammar.api")
    except ModuleNotFoundError as exc:
        if exc.name not in ("grammar.api", "grammar"):
            raise  # grammar.api exists but a dependency of it is missing: a real error
        return None


async def build_constraint(
    tokenizer: Any,
    *,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    response_format: dict[str, Any] | None,
    max_tokens: int,
) -> Any | None:
    """A ConstraintFactory for SamplingParams.constraint, or None (nothing to constrain, or no
    grammar backend yet: then decoding is unconstrained)."""
    wants_tools = bool(tools) and tool_choice != "none"
    wants_format = response_format is not None and response_format.get("type") != "text"
    if not (wants_tools or wants_format):
        return None
    api = _grammar_api()
    if api is None:
        return None
    try:
        # compiling a grammar may take a while the first time: keep it off the event loop
        return await asyncio.to_thread(
            api.build_constraint,
            tokenizer,
            tools=tools if wants_tools else None,
            tool_choice=tool_choice if wants_tools else "none",
            parallel_tool_calls=parallel_tool_calls,
            response_format=response_format if wants_format else None,
            max_tokens=max_tokens,
        )
    except ValueError as exc:
        raise APIError(str(exc), param="max_tokens" if "max_tokens" in str(exc) else None) from exc
