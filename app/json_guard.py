"""Checks on a JSON request body before any route parses it: hostile shapes that Python's json
reads without complaint but that break later (in the grammar compiler, the tokenizer, the
database) are a 400 here, naming where they sit.

- nesting deeper than MAX_DEPTH (json itself would raise RecursionError near 1,000 levels);
- numbers that are not finite: `1e309` reads as inf, `NaN` / `Infinity` are accepted by Python;
- strings with lone UTF-16 surrogates (`"\\ud800"`): they cannot be encoded as UTF-8, so the
  tokenizer, the JSON answer and the database would all fail on them;
- NUL characters (`"\\u0000"`): PostgreSQL refuses them in text and JSONB while SQLite stores
  them, so both backends refuse them alike, at the door. (What the model generates is stored
  with NUL removed: see app.memory.db.)

Bodies that are not JSON (forms, multipart) and bodies json cannot parse pass through unchanged:
the route reports those with its own message."""

from __future__ import annotations

import json
import math
from typing import Any

from app.errors import APIError

MAX_DEPTH = 64  # arrays and objects inside each other; a tool schema of ~30 levels fits


def _path(parts: tuple[Any, ...]) -> str | None:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def _bad_text(text: str) -> str | None:
    if text.isascii():
        return "contains a NUL character (\\u0000)" if "\x00" in text else None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate, which is not valid Unicode"
    return "contains a NUL character (\\u0000)" if "\x00" in text else None


def check_value(value: Any) -> APIError | None:
    """The first problem in a parsed body (depth, non-finite numbers, bad text), or None."""
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(value, (), 0)]
    while stack:
        item, parts, depth = stack.pop()
        if isinstance(item, str):
            problem = _bad_text(item)
            if problem:
                param = _path(parts)
                return APIError(f"Invalid value for '{param or 'body'}': the text {problem}.", param=param)
        elif isinstance(item, float):
            if not math.isfinite(item):
                param = _path(parts)
                return APIError(
                    f"Invalid value for '{param or 'body'}': numbers must be finite "
                    "(out of range for a double, or NaN/Infinity).",
                    param=param,
                )
        elif isinstance(item, dict | list):
            if depth >= MAX_DEPTH:
                param = _path(parts[:1])  # the top-level field: the full path is as deep as the bomb
                return APIError(
                    f"The request body is nested too deeply (more than {MAX_DEPTH} levels of arrays "
                    f"and objects, in '{param or 'body'}').",
                    param=param,
                    code="nesting_too_deep",
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = _bad_text(key)
                    if problem:
                        param = _path(parts)
                        where = param or "body"
                        return APIError(f"Invalid key in '{where}': the key {problem}.", param=param)
                    stack.append((child, (*parts, key), depth + 1))
            elif not all(type(child) is int for child in item):  # token-id lists: nothing to check
                stack.extend((child, (*parts, i), depth + 1) for i, child in enumerate(item))
    return None


def check_body(body: bytes) -> APIError | None:
    """A 400 for a JSON body the app must not see, or None (not JSON, or nothing wrong)."""
    start = body.lstrip()[:1]
    if start not in (b"{", b"["):
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        return APIError(
            f"The request body is nested too deeply (more than {MAX_DEPTH} levels of arrays and objects).",
            code="nesting_too_deep",
        )
    except json.JSONDecodeError:
        return None  # the route's own parser words this one
    except (ValueError, UnicodeDecodeError) as exc:
        # e.g. an integer literal longer than Python's 4,300-digit limit
        return APIError(f"The request body is not valid JSON: {exc}.")
    return check_value(value)
