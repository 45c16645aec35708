"""n8n's Postgres Chat Memory table and the flat LangChain message JSON stored in it.

Shape (n8n creates it the same way):
    <name>(id SERIAL PRIMARY KEY, session_id VARCHAR(255) NOT NULL, message JSONB NOT NULL)
n8n reads `WHERE session_id = $1 ORDER BY id` and inserts `(session_id, message)`.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

# none_as_null: Python None is SQL NULL, not the JSON value null
JSONType = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
_n8n_metadata = sa.MetaData()


@cache
def history_table(name: str) -> sa.Table:
    """The table object for one configured name (kept outside the ORM metadata on purpose:
    its name is a setting, and n8n may own it)."""
    return sa.Table(
        name,
        _n8n_metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(255), nullable=False, index=True),
        sa.Column("message", JSONType, nullable=False),
    )


def _loads_args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return {"__raw__": arguments}
    return arguments if arguments is not None else {}


def to_langchain(
    role: str,
    content: str,
    tool_calls: list[dict] | None = None,
    tool_call_id: str | None = None,
    name: str | None = None,
) -> dict:
    """One chatloom message (OpenAI roles, OpenAI tool-call form) -> n8n's flat LangChain JSON."""
    base = {"content": content or "", "additional_kwargs": {}, "response_metadata": {}}
    if role == "user":
        return {"type": "human", **base}
    if role == "assistant":
        calls = [
            {
                "id": c.get("id"),
                "name": c["function"]["name"],
                "args": _loads_args(c["function"].get("arguments")),
                "type": "tool_call",
            }
            for c in tool_calls or []
        ]
        return {"type": "ai", **base, "tool_calls": calls, "invalid_tool_calls": []}
    if role == "tool":
        return {"type": "tool", **base, "tool_call_id": tool_call_id, "name": name}
    if role == "system":
        return {"type": "system", **base}
    raise ValueError(f"unknown message role {role!r}")


_TYPE_TO_ROLE = {
    "human": "user",
    "ai": "assistant",
    "tool": "tool",
    "system": "system",
    "generic": "user",
    "function": "tool",
}


def from_langchain(message: Any) -> dict:
    """n8n's JSON (flat, or LangChain's {"type", "data"} form) -> dict(role, content, tool_calls,
    tool_call_id, name) with tool calls in OpenAI form (arguments a JSON string)."""
    if isinstance(message, str):
        message = json.loads(message)
    kind = message.get("type", "human")
    data = message.get("data") if isinstance(message.get("data"), dict) else message
    role = _TYPE_TO_ROLE.get(kind, "user")
    content = data.get("content", "")
    if not isinstance(content, str):
        # multimodal content: keep the text parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = None
    if role == "assistant":
        raw = data.get("tool_calls") or data.get("additional_kwargs", {}).get("tool_calls") or []
        calls = []
        for i, c in enumerate(raw):
            if "function" in c:  # OpenAI form inside additional_kwargs
                fn = c["function"]
                args = fn.get("arguments")
                calls.append(
                    {
                        "id": c.get("id") or f"call_{i}",
                        "type": "function",
                        "function": {
                            "name": fn.get("name", ""),
                            "arguments": args if isinstance(args, str) else json.dumps(args),
                        },
                    }
                )
            else:
                fn = {"name": c.get("name", ""), "arguments": json.dumps(c.get("args", {}))}
                calls.append({"id": c.get("id") or f"call_{i}", "type": "function", "function": fn})
        calls = calls or None
    return {
        "role": role,
        "content": content or "",
        "tool_calls": calls,
        "tool_call_id": data.get("tool_call_id") if role == "tool" else None,
        "name": data.get("name") if role == "tool" else None,
    }
