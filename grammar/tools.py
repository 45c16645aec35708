"""OpenAI `tools` + `tool_choice` + `parallel_tool_calls` (+ `response_format`) -> the grammar of one
request, in the model's own tool-call dialect (dialects.py), twice:

- `lark`: what llguidance compiles, exact: JSON schemas through its own `%json` compiler (recursion,
  bounds, patterns and formats as the schema says), markers as special tokens (`<[id]>`) where the
  vocabulary has them, else as text; free text cannot spell a marker.
- `budget_regex`: what the budget automaton compiles (budget.py): a byte-level regex over the same
  structure, markers as control bytes (vocab.MARKER_BYTES), free text as any text, and schemas
  widened where an exact regex would be huge or impossible (schema_regex.budget_schema_regex).

Modes: none = free text only; auto = free text (or the JSON document of a response_format) or calls;
required = one or more calls, nothing else; named = exactly one call of that function.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from grammar.dialects import HERMES, Dialect
from grammar.errors import GrammarInputError
from grammar.schema_regex import budget_schema_regex, escape, unroll_refs
from grammar.vocab import MARKER_BYTES, TEXT_CHAR, TokenVocab

# free text for the budget: any text without reserved control bytes (markers, forbidden tokens);
# the grammar's free text excludes them too, so both see the same text
TEXT_SUPERSET = TEXT_CHAR + "*"
# how llguidance lays out JSON: compact, no optional whitespace (the budget's regex is then exact)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


@dataclass(frozen=True)
class GrammarSpec:
    lark: str  # what llguidance compiles
    budget_regex: str  # what the budget automaton compiles (a byte regex of about the same language)
    mode: str  # none | auto | required | named:<fn> | json_object | json_schema

    @property
    def key(self) -> str:
        return hashlib.sha256(self.lark.encode()).hexdigest()[:32]


def _function(tool: Any) -> dict:
    # chat completions: {"type": "function", "function": {...}}; responses: the function fields flat
    if not isinstance(tool, dict):
        tool = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
    if tool.get("type", "function") != "function":
        raise GrammarInputError(f"tools: unsupported tool type {tool.get('type')!r}")
    fn = tool.get("function", tool)
    if not isinstance(fn, dict):
        fn = fn.model_dump() if hasattr(fn, "model_dump") else dict(fn)
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise GrammarInputError("tools: every function needs a name")
    return fn


def _choice_name(tool_choice: Any) -> str | None:
    # {"type": "function", "function": {"name": ...}} (chat) or {"type": "function", "name": ...}
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") or {}
        name = fn.get("name") if isinstance(fn, dict) else None
        name = name or tool_choice.get("name")
        if not isinstance(name, str):
            raise GrammarInputError("tool_choice: a named choice needs function.name")
        return name
    return None


def response_format_schema(response_format: Any) -> dict | bool | None:
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
            raise GrammarInputError("response_format: json_schema needs a schema")
        return schema
    raise GrammarInputError(f"response_format: unsupported type {kind!r}")


_ANNOTATIONS = ("$schema", "$id", "title", "description", "default", "examples", "strict", "$comment")


def strict_schema(schema: Any, field: str) -> dict:
    """The schema as llguidance compiles it: annotations dropped, objects closed where the schema
    leaves `additionalProperties` open (a call carries the declared arguments only), our layout."""
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarInputError(f"{field}: a JSON schema must be an object")

    def walk(node: Any, in_all_of: bool = False) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k in _ANNOTATIONS and not isinstance(v, dict):
                continue
            if k in ("properties", "$defs", "definitions", "patternProperties"):
                out[k] = {name: walk(sub) for name, sub in v.items()} if isinstance(v, dict) else v
            elif k in ("enum", "const"):
                out[k] = v
            elif k == "allOf" and isinstance(v, list):
                out[k] = [walk(x, True) for x in v]
            else:
                out[k] = walk(v)
        composed = any(k in out for k in ("allOf", "anyOf", "oneOf", "$ref"))
        if "properties" in out and "additionalProperties" not in out and not composed and not in_all_of:
            out["additionalProperties"] = False
        return out

    out = walk(unroll_refs(schema))
    if out is False or not isinstance(out, dict):
        raise GrammarInputError(f"{field}: the schema admits no value")
    out["x-guidance"] = dict(JSON_LAYOUT)
    return out


def _check_schema(schema: dict, field: str) -> None:
    # llguidance's own validation: the message names what it cannot compile
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        first = error.strip().splitlines()
        raise GrammarInputError(
            f"{field}: unsupported JSON schema: {' '.join(s.strip() for s in first)[:500]}"
        )


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _Writer:
    """Lark and budget-regex pieces for one vocabulary and dialect."""

    def __init__(self, vocab: TokenVocab | None, dialect: Dialect):
        self.vocab = vocab
        self.dialect = dialect
        self.rules: list[str] = []
        self._n = 0

    def spell(self, text: str) -> tuple[str, str]:
        """(lark, regex) of literal text whose markers are single special tokens where the vocabulary
        has them."""
        lark: list[str] = []
        regex: list[str] = []
        rest = text
        while rest:
            hit = None
            for marker in MARKER_BYTES:
                at = rest.find(marker)
                special = self.vocab is not None and marker in self.vocab.markers
                if at >= 0 and special and (hit is None or at < hit[0]):
                    hit = (at, marker)
            if hit is None:
                lark.append(_lark_string(rest))
                regex.append(escape(rest))
                break
            at, marker = hit
            if at:
                lark.append(_lark_string(rest[:at]))
                regex.append(escape(rest[:at]))
            lark.append(f"<[{self.vocab.markers[marker]}]>")
            regex.append(f"\\x{MARKER_BYTES[marker][0]:02x}")
            rest = rest[at + len(marker) :]
        return " ".join(lark) or '""', "".join(regex)

    def text_markers(self) -> list[str]:
        """The marker texts free text must never spell (the parser would take them for calls)."""
        d = self.dialect
        return [m for m in MARKER_BYTES if m in d.open or m in d.close]

    def rule(self, body: str) -> str:
        self._n += 1
        name = f"r{self._n}"
        self.rules.append(f"{name}: {body}")
        return name

    def json(self, schema: Any, field: str) -> tuple[str, str]:
        strict = strict_schema(schema, field)
        _check_schema(strict, field)
        lark = self.rule(f"%json {json.dumps(strict, ensure_ascii=False)}")
        try:
            return lark, budget_schema_regex(schema)
        except GrammarInputError as e:
            raise GrammarInputError(f"{field}: {e}") from e

    def call(self, fn: dict) -> tuple[str, str]:
        name = fn["name"]
        args_lark, args_regex = self.json(fn.get("parameters"), f"tools: function {name!r}: parameters")
        head = '{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{self.dialect.args_key}": '
        lark = f"{_lark_string(head)} {args_lark} {_lark_string('}')}"
        return self.rule(lark), escape(head) + args_regex + r"\}"

    def calls(
        self, bodies: list[tuple[str, str]], parallel: bool, skip_open: bool = False
    ) -> tuple[str, str]:
        """(lark, regex) of one call (parallel False) or one or more, with the dialect's markers;
        skip_open: the first opening marker was already read (by the text before it)."""
        d = self.dialect
        body_l = self.rule(" | ".join(b[0] for b in bodies))
        body_r = "(?:" + "|".join(b[1] for b in bodies) + ")"
        open_l, open_r = self.spell(d.open) if d.open else ('""', "")
        close_l, close_r = self.spell(d.close) if d.close else ('""', "")
        sep_l, sep_r = self.spell(d.sep)
        first_open_l, first_open_r = ('""', "") if skip_open else (open_l, open_r)
        if d.list_form:
            one_l = f'{first_open_l} "[" {body_l}'
            one_r = f"{first_open_r}\\[{body_r}"
            more_l, more_r = f"({sep_l} {body_l})*", f"(?:{sep_r}{body_r})*"
            end_l, end_r = '"]"', r"\]"
        else:
            one_l = f"{first_open_l} {body_l} {close_l}"
            one_r = f"{first_open_r}{body_r}{close_r}"
            more_l = f"({sep_l} {open_l} {body_l} {close_l})*"
            more_r = f"(?:{sep_r}{open_r}{body_r}{close_r})*"
            end_l, end_r = '""', ""
        if not parallel:
            more_l, more_r = '""', ""
        return self.rule(f"{one_l} {more_l} {end_l}"), f"{one_r}{more_r}{end_r}"

    def lark(self, start: str) -> str:
        return "\n".join([f"start: {start}", *self.rules]) + "\n"


def grammar_spec(
    tools: list | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = True,
    response_format: Any = None,
    dialect: Dialect = HERMES,
    vocab: TokenVocab | None = None,
) -> GrammarSpec | None:
    """The grammar for a request, or None when nothing is constrained. Raises GrammarInputError
    (message starting with the field's name) for what the request asks wrongly."""
    w = _Writer(vocab, dialect)
    schema = response_format_schema(response_format)
    fns = [_function(t) for t in tools or []]
    names = [f["name"] for f in fns]
    if len(set(names)) != len(names):
        raise GrammarInputError("tools: function names must be unique")
    named = _choice_name(tool_choice)
    choice = "named" if named else (tool_choice or ("auto" if fns else "none"))
    if choice not in ("none", "auto", "required", "named"):
        raise GrammarInputError(
            f"tool_choice: expected none, auto, required or a function, got {tool_choice!r}"
        )
    if choice != "none" and not fns:
        raise GrammarInputError(f"tool_choice: {choice!r} needs at least one tool")
    if choice == "named" and named not in names:
        raise GrammarInputError(
            f"tool_choice: names function {named!r}, which is not among the tools {names}"
        )

    # free text that spells no marker (a call can only start where the grammar says)
    spelled = w.text_markers()
    if spelled:
        avoid = "|".join(escape(m).replace("/", "\\/") for m in spelled)  # "/" ends a Lark regex
        w.rules.append(f"TEXT0: /{TEXT_CHAR}*/ & ~/(?s:.*(?:{avoid}).*)/")
    else:
        w.rules.append(f"TEXT0: /{TEXT_CHAR}*/")
    if schema is not None:
        doc_l, doc_r = w.json(schema, "response_format")
        content_mode = "json_object" if schema == {"type": "object"} else "json_schema"
    else:
        doc_l, doc_r, content_mode = "TEXT0", TEXT_SUPERSET, "none"

    if choice == "none":
        if content_mode == "none" and not fns:
            return None
        return GrammarSpec(w.lark(doc_l), doc_r, content_mode)
    if choice == "named":
        fn = fns[names.index(named)]
        calls_l, calls_r = w.calls([w.call(fn)], parallel=False)
        return GrammarSpec(w.lark(calls_l), calls_r, f"named:{named}")
    bodies = [w.call(f) for f in fns]
    parallel = parallel_tool_calls is not False
    calls_l, calls_r = w.calls(bodies, parallel)
    if choice == "required":
        return GrammarSpec(w.lark(calls_l), calls_r, "required")
    # auto
    if content_mode != "none":
        return GrammarSpec(w.lark(f"{doc_l} | {calls_l}"), f"(?:{doc_r}|{calls_r})", "auto")
    d = dialect
    if not d.open:  # a bare JSON call is the whole reply: text may not start like one
        w.rules.append(f"TEXT_NB: /[^{{\\x00-\\x05]{TEXT_CHAR}*/")
        return GrammarSpec(w.lark(f"TEXT_NB? | {calls_l}"), f"(?:{TEXT_SUPERSET}|{calls_r})", "auto")
    open_l, open_r = w.spell(d.open)
    if open_l.startswith("<["):  # the call opens with a special token: text before it is a lexeme
        return GrammarSpec(w.lark(f"TEXT0 {calls_l}?"), f"{TEXT_SUPERSET}(?:{calls_r})?", "auto")
    # the opening marker is text: one lexeme reads the text and the marker (llguidance's lexer
    # is greedy, so free text that may end where a marker begins must be one lexeme with it)
    w.rules.append(f"TEXT_OPEN: TEXT0 {open_l}")
    rest_l, _ = w.calls(bodies, parallel, skip_open=True)
    return GrammarSpec(w.lark(f"TEXT0 | TEXT_OPEN {rest_l}"), f"{TEXT_SUPERSET}(?:{calls_r})?", "auto")
