"""Random n8n-style tool sets and JSON schemas (seeded): strings with/without maxLength, enums,
bounded integers, numbers, booleans, optional fields, nested objects, arrays of strings and of
objects, `$schema` keys and `additionalProperties: false` as n8n (zod-to-json-schema) sends them."""

from __future__ import annotations

import random

DRAFT7 = "http://json-schema.org/draft-07/schema#"
WORDS = [
    "city",
    "query",
    "title",
    "priority",
    "tags",
    "email",
    "name",
    "count",
    "limit",
    "since",
    "status",
    "unit",
    "input",
    "url",
    "body",
    "user_id",
    "amount",
    "items",
    "address",
    "phone",
    "note",
    "flag",
]
TOOL_NAMES = [
    "Calculator",
    "get_weather",
    "create_ticket",
    "send_email",
    "query_orders",
    "add_contact",
    "search_docs",
    "http_request",
    "Wikipedia",
    "update_row",
    "lookup_user",
    "schedule_meeting",
]


def _leaf(rng: random.Random) -> dict:
    kind = rng.choice(["str", "str_max", "str_max", "enum", "int_range", "int_min", "int", "num", "bool"])
    if kind == "str":
        return {"type": "string", "description": "free text"}
    if kind == "str_max":
        s = {"type": "string", "maxLength": rng.choice([1, 5, 12, 20, 32])}
        if rng.random() < 0.2:
            s["minLength"] = 1
        return s
    if kind == "enum":
        values = ["open", "closed", "celsius", "fahrenheit", "low", "high", "a b", 'x"y', "ünï"]
        return {"type": "string", "enum": rng.sample(values, rng.randint(1, 4))}
    if kind == "int_range":
        lo = rng.choice([-50, -1, 0, 1, 7, 100])
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.choice([0, 4, 99, 12345])}
    if kind == "int_min":
        return {"type": "integer", "minimum": rng.choice([0, 1, 18])}
    if kind == "int":
        return {"type": "integer"}
    if kind == "num":
        if rng.random() < 0.5:
            return {"type": "number", "minimum": 0, "maximum": 1000}
        return {"type": "number"}
    return {"type": "boolean"}


def object_schema(rng: random.Random, depth: int = 0, max_props: int = 4) -> dict:
    n = rng.randint(0 if depth else 1, max_props)
    keys = rng.sample(WORDS, n)
    props = {}
    for k in keys:
        r = rng.random()
        if depth < 2 and r < 0.12:
            props[k] = object_schema(rng, depth + 1, 3)
        elif depth < 2 and r < 0.22:
            items = object_schema(rng, depth + 1, 2)
            props[k] = {"type": "array", "items": items, "maxItems": rng.choice([2, 3])}
        elif r < 0.32:
            arr = {"type": "array", "items": {"type": "string", "maxLength": 10}}
            if rng.random() < 0.5:
                arr["minItems"], arr["maxItems"] = 1, 3
            props[k] = arr
        else:
            props[k] = _leaf(rng)
    required = [k for k in keys if rng.random() < 0.5]
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def tool_set(rng: random.Random, n_tools: int | None = None) -> list[dict]:
    n = n_tools or rng.randint(1, 8)
    names = rng.sample(TOOL_NAMES, n)
    tools = []
    for name in names:
        params = object_schema(rng)
        if rng.random() < 0.7:
            params["$schema"] = DRAFT7
        fn = {"name": name, "description": f"{name} tool", "parameters": params}
        if rng.random() < 0.5:
            fn["strict"] = rng.choice([True, False, None])
        tools.append({"type": "function", "function": fn})
    return tools


def response_schema(rng: random.Random) -> dict:
    r = rng.random()
    if r < 0.7:
        s = object_schema(rng)
    elif r < 0.85:
        s = {"type": "array", "items": object_schema(rng, 1, 2), "maxItems": 3}
    else:
        s = {"anyOf": [_leaf(rng), object_schema(rng, 1, 2)]}
    if rng.random() < 0.5:
        s["$schema"] = DRAFT7
    return s
