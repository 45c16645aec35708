"""JSON schema -> byte-level regex, the one language all backends and the budget automaton compile.

outlines_core converts the schema (whitespace bounded by WS). What it does not enforce we patch in
before it runs: integer/number bounds become a sentinel const, replaced afterwards by an exact
integer-range regex (bounded numbers are generated as integers in range: valid, if narrower).
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

WS = "[ ]?"  # at most one space wherever JSON allows whitespace: no loops on whitespace
_SENTINEL = "__chatloom_range_{}__"
_DROP_KEYS = ("$schema", "$id", "title", "description", "default", "examples", "strict")
# free text: no reserved control bytes (\x00 forbidden tokens, \x02/\x03 call tags)
TEXT_CHAR = r"[^\x00-\x03<]"


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
        raise ValueError(f"empty integer range [{lo}, {hi}] in schema")
    alts: list[str] = []
    if lo is None or lo < 0:  # negative part: -(|x| in [max(1,-hi), -lo])
        neg_hi = None if lo is None else -lo
        neg_lo = 1 if hi is None or hi >= 0 else -hi
        alts += ["-" + p for p in _nonneg(neg_lo, neg_hi)]
    if hi is None or hi >= 0:
        alts += _nonneg(max(lo or 0, 0), hi)
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
    return regex


def _avoid(word: str) -> str:
    # after a "<": text that deviates from `word` before finishing it (never "<" itself at a deviation)
    if not word:
        raise ValueError("empty word")
    head, rest = escape(word[0]), word[1:]
    deviate = f"[^\\x00-\\x03<{head}]"
    if not rest:
        return deviate
    return f"(?:{deviate}|{head}{_avoid(rest)})"


def _prefix(word: str) -> str:
    # a proper prefix of `word` (possibly empty), at the end of the text
    if len(word) <= 1:
        return ""
    return f"(?:{escape(word[0])}{_prefix(word[1:])})?"


def free_text_regex() -> str:
    """Any text without call tags, spelled with ordinary tokens or not ("<tool_call>", "</tool_call>").

    After a run of "<" the text must deviate from both tags (with any char but "<") or end; so
    "<tool_c<" is refused: a harmless narrowing that keeps the regex a plain nesting.
    """
    after_lt = f"(?:[^\\x00-\\x03<t/]|t{_avoid('ool_call>')}|/{_avoid('tool_call>')})"
    tail = f"(?:<+(?:t{_prefix('ool_call>')}|/{_prefix('tool_call>')})?)?"
    return f"(?:{TEXT_CHAR}|<+{after_lt})*{tail}"
