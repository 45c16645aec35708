"""Per-message settings a chat client may send with sendMessage (`options`): the web chat's settings
panel. They change this one turn, never the stored assistant:
    {"temperature": 0..2, "max_tokens": 1..32768, "system_prompt": "..."}
Anonymous webhook callers may not send them (a public assistant's prompt and budget are its own)."""

from __future__ import annotations

import dataclasses
from typing import Any

from app.agent.turn import AssistantSpec
from app.errors import APIError
from app.principal import Principal

MAX_TOKENS = 32768  # the engine still caps a turn at its context length
MAX_SYSTEM_PROMPT = 20000  # characters


def _number(value: Any, name: str, low: float, high: float, integer: bool = False) -> float | int:
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise APIError(f"options.{name} must be {kind} from {low} to {high}.", param=f"options.{name}")
    return value


def apply_options(spec: AssistantSpec, options: Any, caller: Principal) -> AssistantSpec:
    """The assistant as this turn runs it; `options` is the request's field (None: unchanged)."""
    if options is None or options == {}:
        return spec
    if not isinstance(options, dict):
        raise APIError("options must be an object.", param="options")
    if caller.anonymous:
        raise APIError(
            "Anonymous callers may not change an assistant's settings; authenticate, or leave out options.",
            403,
            param="options",
            code="anonymous_options_refused",
        )
    sampling = dict(spec.sampling)
    system_prompt = spec.system_prompt
    for key, value in options.items():
        if value is None:
            continue  # unset in the panel: the assistant's own
        if key == "temperature":
            sampling["temperature"] = float(_number(value, key, 0.0, 2.0))
        elif key == "max_tokens":
            sampling["max_tokens"] = int(_number(value, key, 1, MAX_TOKENS, integer=True))
        elif key == "system_prompt":
            if not isinstance(value, str) or len(value) > MAX_SYSTEM_PROMPT or "\x00" in value:
                raise APIError(
                    f"options.system_prompt must be text of at most {MAX_SYSTEM_PROMPT} characters.",
                    param="options.system_prompt",
                )
            system_prompt = value
        else:
            raise APIError(
                f"Unknown option {key!r}: expected temperature, max_tokens or system_prompt.",
                param=f"options.{key}",
            )
    return dataclasses.replace(spec, sampling=sampling, system_prompt=system_prompt)
