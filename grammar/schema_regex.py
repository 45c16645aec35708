"""JSON schema -> byte-level regex, for the budget automaton (budget.py).

The grammar itself is llguidance's (exact); the budget only needs a regex of about the same
language, so schemas are widened where an exact regex would be huge or impossible
(budget_schema_regex): long bounded repeats, counted patterns and recursion. outlines_core converts
the schema (compact, as llguidance writes it); integer bounds become a sentinel const
first, replaced afterwards by an integer-range regex.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

from grammar.errors import GrammarInputError

# compact JSON, as llguidance writes it (tools.JSON_LAYOUT): no whitespace anywhere
WS = ""


def _layout(regex: str) -> str:
    # llguidance's JSON also writes 1E5, and U+007F..U+009F inside strings (JSON allows them)
    regex = regex.replace("[eE][+-][0-9]+", "[eE][+-]?[0-9]+")
    return regex.replace(r'[^"\\\x00-\x1F\x7F-\x9F]', r'[^"\\\x00-\x1F]')


_SENTINEL = "__chatloom_range_{}__"
_DROP_KEYS = ("$schema", "$id", "title", "description", "default", "examples", "strict")
# bounds above these are widened to unbounded in the budget's schema: nested bounded repeats multiply
# the byte DFA's states (maxItems 1000 of strings of maxLength 1000 would be a million states)
LENGTH_LIMIT = 32  # minLength / maxLength, counted repeats in patterns
ITEMS_LIMIT = 8  # minItems / maxItems / minProperties / maxProperties
MAX_BUDGET_REGEX = 200_000  # characters; a larger budget regex falls back to any JSON value


def escape(text: str) -> str:
    """Literal text as a regex every backend reads the same way (no `\\ `, no `\\-` outside classes)."""
    out = []
    for ch in text:
        if ch in r"\.^$|?*+()[]{}":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append(r"\n")
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _digits_range(a: str, b: str) -> list[str]:
    # same-length digit strings a <= b -> alternatives matching exactly the numbers between
    if a == b:
        return [a]
    n = len(a)
    if a == "0" * n and b == "9" * n:
        return ["[0-9]" if n == 1 else f"[0-9]{{{n}}}"]
    if n == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + p for p in _digits_range(a[1:], b[1:])]
    out = [a[0] + p for p in _digits_range(a[1:], "9" * (n - 1))]
    lo, hi = int(a[0]) + 1, int(b[0]) - 1
    if lo <= hi:
        first = str(lo) if lo == hi else f"[{lo}-{hi}]"
        out.append(first + ("[0-9]" if n == 2 else f"[0-9]{{{n - 1}}}"))
    out += [b[0] + p for p in _digits_range("0" * (n - 1), b[1:])]
    return out


def _nonneg(lo: int, hi: int | None) -> list[str]:
    # alternatives for lo <= x <= hi (hi None: unbounded), 0 <= lo, canonical decimal (no leading 0)
    out: list[str] = []
    while hi is None or lo <= hi:
        d = len(str(lo))
        top = 10**d - 1
        if hi is None or hi > top:
            out += _digits_range(str(lo), str(top))
            if hi is None:
                out.append(f"[1-9][0-9]{{{d},}}")
                return out
            lo = top + 1
        else:
            out += _digits_range(str(lo), str(hi))
            return out
    return out


def int_range_regex(lo: int | None, hi: int | None) -> str:
    """Regex of the canonical decimal integers in [lo, hi] (None = unbounded on that side)."""
    if lo is not None and hi is not None and lo > hi:
        raise GrammarInputError(f"empty integer range [{lo}, {hi}] in schema")
    alts: list[str] = []
    if lo is None or lo < 0:  # negative part: -(|x| in [max(1,-hi), -lo])
        neg_hi = None if lo is None else -lo
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        alts += ["-" + p for p in _nonneg(neg_lo, neg_hi)]
    if hi is None or hi >= 0:
        alts += _nonneg(max(lo or 0, 0), hi)
        if lo is None or lo <= 0:
            alts.append("-0")  # JSON's negative zero, which llguidance also writes: it equals 0
    return "(?:" + "|".join(alts) + ")"


def _bounds(node: dict) -> tuple[int | None, int | None]:
    lo = node.get("minimum")
    hi = node.get("maximum")
    xlo = node.get("exclusiveMinimum")
    xhi = node.get("exclusiveMaximum")
    ilo = None if lo is None else math.ceil(lo)
    ihi = None if hi is None else math.floor(hi)
    if isinstance(xlo, bool):  # draft 4: a flag on minimum
        if xlo and lo is not None and ilo == lo:
            ilo += 1
    elif xlo is not None:
        cand = math.floor(xlo) + 1
        ilo = cand if ilo is None else max(ilo, cand)
    if isinstance(xhi, bool):
        if xhi and hi is not None and ihi == hi:
            ihi -= 1
    elif xhi is not None:
        cand = math.ceil(xhi) - 1
        ihi = cand if ihi is None else min(ihi, cand)
    return ilo, ihi


def _prepare(node: Any, ranges: dict[str, str]) -> Any:
    # walk the schema: drop annotation keys, swap bounded numbers for sentinels
    if isinstance(node, list):
        return [_prepare(x, ranges) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in _DROP_KEYS and not isinstance(v, dict):
            continue
        if k in ("properties", "$defs", "definitions"):
            out[k] = {name: _prepare(sub, ranges) for name, sub in v.items()} if isinstance(v, dict) else v
        elif k in ("enum", "const"):
            out[k] = v
        else:
            out[k] = _prepare(v, ranges)
    kind = out.get("type")
    bounded = any(b in out for b in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
    if kind in ("integer", "number") and (bounded or kind == "integer"):
        if "enum" in out or "const" in out:
            return out
        lo, hi = _bounds(out)
        key = _SENTINEL.format(len(ranges))
        ranges[key] = int_range_regex(lo, hi)
        return {"const": key}
    return out


def json_schema_regex(schema: dict | bool) -> str:
    """The regex of JSON documents valid for the schema (whitespace bounded)."""
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    ranges: dict[str, str] = {}
    prepared = _prepare(copy.deepcopy(schema), ranges)
    try:
        regex = build_regex_from_schema(json.dumps(prepared), whitespace_pattern=WS)
    except Exception as e:  # outlines_core raises its own error types
        raise ValueError(f"unsupported JSON schema: {e}") from e
    for key, sub in ranges.items():
        quoted = build_regex_from_schema(json.dumps({"const": key}))
        regex = regex.replace(quoted, sub)
    return _layout(regex)


_COUNTED = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_LOCAL_REF = re.compile(r"^#(?:/(?:\$defs|definitions)/([^/]+))?$")


def _small_pattern(pattern: Any) -> bool:
    # a pattern the budget may keep: no counted repeat above the limit
    if not isinstance(pattern, str):
        return False
    return all(
        int(a) <= LENGTH_LIMIT and (not b or int(b) <= LENGTH_LIMIT) for a, b in _COUNTED.findall(pattern)
    )


def _widen(node: Any) -> Any:
    """The budget's schema (references already unrolled: unroll_refs): a superset where the exact
    regex would be huge (long bounded repeats, counted patterns); a reference left (not a local
    one) admits any value."""
    if isinstance(node, list):
        return [_widen(x) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return {}
    out = {}
    for k, v in node.items():
        if k in _DROP_KEYS and not isinstance(v, dict) or k in ("$defs", "definitions", "format"):
            continue
        if k in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
            limit = LENGTH_LIMIT if k.endswith("Length") else ITEMS_LIMIT
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= limit:
                out[k] = v
            continue
        if k == "pattern":
            if _small_pattern(v):
                out[k] = v
            continue
        if k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            # integers keep their range; numbers are any number (llguidance writes decimals in range)
            ok = isinstance(v, bool) or (isinstance(v, int | float) and math.isfinite(v) and abs(v) < 1e15)
            if ok and node.get("type") == "integer":
                out[k] = v
            continue
        if k == "properties" and isinstance(v, dict):
            out[k] = {name: _widen(sub) for name, sub in v.items()}
        elif k in ("enum", "const"):
            out[k] = v
        else:
            out[k] = _widen(v)
    return out


def _any_json_regex() -> str:
    return _layout(build_regex_from_schema("{}", whitespace_pattern=WS))


def budget_schema_regex(schema: Any) -> str:
    """A regex for the budget automaton of about the schema's language (see _widen); any JSON value
    where even the widened schema has no regex."""
    if schema is None:
        schema = {"type": "object", "properties": {}}
    if schema is True or not isinstance(schema, dict):
        return _any_json_regex()
    try:
        unrolled = _drop_false(unroll_refs(copy.deepcopy(schema)))
        regex = json_schema_regex(_widen(unrolled))
    except GrammarInputError:
        raise  # the schema admits no value at all
    except (ValueError, RecursionError, OverflowError):
        return _any_json_regex()
    return regex if len(regex) <= MAX_BUDGET_REGEX else _any_json_regex()


RECURSION_DEPTH = 6  # how deep a recursive $ref may nest in a request's grammar
MAX_UNROLLED = 100_000  # characters of unrolled schema; a schema that branches more nests less deep


def unroll_refs(schema: Any) -> Any:
    """unroll_to at the deepest nesting (up to RECURSION_DEPTH) whose schema stays small."""
    for depth in range(RECURSION_DEPTH, 0, -1):
        try:
            out = unroll_to(schema, depth)
        except _TooBig:
            continue
        if len(json.dumps(out)) <= MAX_UNROLLED:
            return out
    raise GrammarInputError("the schema's references expand to more than chatloom compiles")


class _TooBig(Exception):
    pass


def unroll_to(schema: Any, depth: int) -> Any:
    """The schema with its local `$ref`s inlined, each recursive one at most `depth` times on any
    path; deeper, the reference becomes `false` (no value), so a tree ends after `depth` levels.
    Both the grammar and the budget compile this one language (a subset of the schema's: every
    output still validates), which keeps the budget exact for recursive schemas too."""
    if not isinstance(schema, dict):
        return schema
    root = schema

    def target(ref: str) -> Any:
        m = _LOCAL_REF.match(ref)
        if m is None:
            return None
        if m.group(1) is None:
            return root
        return (root.get("$defs") or root.get("definitions") or {}).get(m.group(1))

    nodes = [0]

    def walk(node: Any, seen: dict[str, int]) -> Any:
        if isinstance(node, list):
            return [walk(x, seen) for x in node]
        if not isinstance(node, dict):
            return node
        nodes[0] += 1
        if nodes[0] > MAX_UNROLLED // 10:
            raise _TooBig
        ref = node.get("$ref")
        if isinstance(ref, str):
            found = target(ref)
            if not isinstance(found, dict):
                return node  # not ours to resolve: the grammar library reports it
            if seen.get(ref, 0) >= depth:
                return False
            merged = {k: v for k, v in found.items() if k not in ("$defs", "definitions")}
            merged.update({k: v for k, v in node.items() if k != "$ref"})
            return walk(merged, {**seen, ref: seen.get(ref, 0) + 1})
        out = {}
        for k, v in node.items():
            if k in ("$defs", "definitions"):
                continue
            if k in ("properties", "patternProperties") and isinstance(v, dict):
                out[k] = {name: walk(sub, seen) for name, sub in v.items()}
            elif k in ("enum", "const"):
                out[k] = v
            else:
                out[k] = walk(v, seen)
        return out

    return walk(schema, {})


def _drop_false(node: Any) -> Any:
    """outlines_core reads no `false` schemas: an array of them is empty, an alternative or an
    optional property that is `false` goes."""
    if isinstance(node, list):
        return [_drop_false(x) for x in node if x is not False]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "items" and v is False:
            out["maxItems"] = 0
        elif k == "properties" and isinstance(v, dict):
            out[k] = {name: _drop_false(sub) for name, sub in v.items() if sub is not False}
        elif k in ("enum", "const"):
            out[k] = v
        else:
            out[k] = _drop_false(v)
    if "required" in out and isinstance(out.get("properties"), dict):
        gone = {n for n, sub in node.get("properties", {}).items() if sub is False}
        if gone & set(out["required"]):
            raise GrammarInputError("the schema's recursion has no end (a required property recurses)")
    return out
