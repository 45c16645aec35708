"""OpenAI `tools` + `tool_choice` + `parallel_tool_calls` (+ `response_format`) -> one regex over the
model's own output format (Hermes/Qwen):

    <tool_call>\\n{"name": "<fn>", "arguments": {...}}\\n</tool_call>

In the regex the tags are the single bytes TAG_OPEN / TAG_CLOSE (see vocab.py): only the tag tokens
carry them, JSON strings and free text cannot contain them, and free text cannot spell the tags
with ordinary tokens either. Parallel calls are separated by "\\n".

Modes: none = free text only; auto = free text then optionally calls (or the JSON document when a
response_format asks for one); required = one or more calls, nothing else; named = exactly one call
of that function.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from grammar.schema_regex import escape, free_text_regex, json_schema_regex

OPEN = r"\x02"
CLOSE = r"\x03"


# free text for the budget automaton: a superset without the spelled-tag exclusions (which cost the
# DFA construction a lot). Every text state of either language finishes with EOS (after at most the
# rest of a UTF-8 character), so both give the same distances; the backends enforce the exact text.
TEXT_SUPERSET = r"[^\x00-\x03]*"


@dataclass(frozen=True)
class GrammarSpec:
    regex: str  # what the backends compile
    budget_regex: str  # what the budget automaton compiles: same language, up to free text
    mode: str  # none | auto | required | named:<fn> | json_object | json_schema

    @property
    def key(self) -> str:
        return hashlib.sha256(self.regex.encode()).hexdigest()[:32]


def _function(tool: Any) -> dict:
    # chat completions: {"type": "function", "function": {...}}; responses: the function fields flat
    if not isinstance(tool, dict):
        tool = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
    if tool.get("type", "function") != "function":
        raise ValueError(f"tools: unsupported tool type {tool.get('type')!r}")
    fn = tool.get("function", tool)
    if not isinstance(fn, dict):
        fn = fn.model_dump() if hasattr(fn, "model_dump") else dict(fn)
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError("tools: every function needs a name")
    return fn


def _call_regex(name: str, parameters: Any) -> str:
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    try:
        args = json_schema_regex(parameters)
    except ValueError as e:
        raise ValueError(f"tools: function {name!r}: {e}") from e
    head = escape('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return f"{OPEN}\\n{head}{args}\\}}\\n{CLOSE}"


def _choice_name(tool_choice: Any) -> str | None:
    # {"type": "function", "function": {"name": ...}} (chat) or {"type": "function", "name": ...}
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") or {}
        name = fn.get("name") if isinstance(fn, dict) else None
        name = name or tool_choice.get("name")
        if not isinstance(name, str):
            raise ValueError("tool_choice: a named choice needs function.name")
        return name
    return None


def response_format_schema(response_format: Any) -> dict | None:
    """The JSON schema a response_format asks for (None: free text)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        dump = getattr(response_format, "model_dump", None)
        response_format = dump(by_alias=True) if dump else {}
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        js = response_format.get("json_schema", response_format)  # chat form nests it, responses not
        schema = js.get("schema") if isinstance(js, dict) else None
        if schema is None:
            schema = js.get("schema_") if isinstance(js, dict) else None
        if schema is None:
            raise ValueError("response_format: json_schema needs a schema")
        return schema
    raise ValueError(f"response_format: unsupported type {kind!r}")


def grammar_spec(
    tools: list | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = True,
    response_format: Any = None,
) -> GrammarSpec | None:
    """The grammar for a request, or None when nothing is constrained."""
    schema = response_format_schema(response_format)
    if schema is not None:
        try:
            content = json_schema_regex(schema)
        except ValueError as e:
            raise ValueError(f"response_format: {e}") from e
        content_mode = "json_object" if schema == {"type": "object"} else "json_schema"
        budget_content = content
    else:
        content, content_mode, budget_content = free_text_regex(), "none", TEXT_SUPERSET
    fns = [_function(t) for t in tools or []]
    names = [f["name"] for f in fns]
    if len(set(names)) != len(names):
        raise ValueError("tools: function names must be unique")
    named = _choice_name(tool_choice)
    choice = "named" if named else (tool_choice or ("auto" if fns else "none"))
    if choice not in ("none", "auto", "required", "named"):
        raise ValueError(f"tool_choice: expected none, auto, required or a function, got {tool_choice!r}")
    if choice != "none" and not fns:
        raise ValueError(f"tool_choice {choice!r} needs at least one tool")
    if choice == "none":
        if content_mode == "none" and not fns:
            return None
        return GrammarSpec(content, budget_content, content_mode)
    if choice == "named":
        if named not in names:
            raise ValueError(f"tool_choice names function {named!r}, which is not among the tools {names}")
        fn = fns[names.index(named)]
        call = _call_regex(named, fn.get("parameters"))
        return GrammarSpec(call, call, f"named:{named}")
    one = "|".join(_call_regex(f["name"], f.get("parameters")) for f in fns)
    one = f"(?:{one})"
    calls = one if parallel_tool_calls is False else f"{one}(?:\\n{one})*"
    if choice == "required":
        return GrammarSpec(calls, calls, "required")
    if content_mode == "none":
        return GrammarSpec(f"{content}(?:{calls})?", f"{budget_content}(?:{calls})?", "auto")
    return GrammarSpec(f"(?:{content}|{calls})", f"(?:{content}|{calls})", "auto")
