"""A tool as the generators see it: its OpenAI definition plus how users ask for it, what it returns
and how an answer quotes the result. Shared by the training bank and the held-out sets."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from train.values import number_text

SCHEMA_URI = "http://json-schema.org/draft-07/schema#"


@dataclass
class Param:
    name: str
    schema: dict[str, Any]
    gen: Callable[[random.Random], Any]
    say: list[str] = field(default_factory=list)  # sentences adding an optional value: "Use {v} units."
    required: bool = True
    text: Callable[[Any], str] | None = None  # how the request spells the value (default: str)

    def spell(self, value: Any) -> str:
        if self.text is not None:
            return self.text(value)
        if isinstance(value, float | int) and not isinstance(value, bool):
            return number_text(value)
        return str(value)


@dataclass
class Tool:
    name: str
    description: str
    params: list[Param]
    asks: list[str]  # request templates over the required params: "What's the weather in {city}?"
    result: Callable[[dict[str, Any], random.Random], dict[str, Any]]
    answers: list[str]  # final answers over {**args, **result} (spelled), grounded in the result
    domain: str = ""
    # required values drawn together (two different values of one pool, a number in its base); by
    # default each parameter draws its own
    draw: Callable[[random.Random], dict[str, Any]] | None = None
    # tools of one kin take look-alike values (ids of one shape, text to encode): offered together,
    # so that the request's words pick the tool, not the value's shape
    kin: str = ""

    def openai(self, rng: random.Random) -> dict[str, Any]:
        """The OpenAI tool definition; some in n8n's shape ($schema, additionalProperties false)."""
        props = {}
        for p in self.params:
            props[p.name] = dict(p.schema)
        schema: dict[str, Any] = {"type": "object", "properties": props}
        required = [p.name for p in self.params if p.required]
        if required:
            schema["required"] = required
        if rng.random() < 0.5:
            schema["additionalProperties"] = False
            schema["$schema"] = SCHEMA_URI
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": schema},
        }

    def request(self, rng: random.Random, optional_p: float = 0.35) -> tuple[str, dict[str, Any]]:
        """(user text, the exact arguments it asks for), arguments in schema order."""
        if self.draw is not None:
            values = self.draw(rng)
        else:
            values = {p.name: p.gen(rng) for p in self.params if p.required}
        extra = [p for p in self.params if not p.required and p.say and rng.random() < optional_p]
        for p in extra:
            values[p.name] = p.gen(rng)
        spelled = {p.name: p.spell(values[p.name]) for p in self.params if p.name in values}
        text = rng.choice(self.asks).format(**spelled)
        for p in extra:
            text = text.rstrip() + " " + rng.choice(p.say).format(v=spelled[p.name])
        args = {p.name: values[p.name] for p in self.params if p.name in values}
        return text, args

    def answer(self, rng: random.Random, args: dict[str, Any], result: dict[str, Any]) -> str:
        spelled = {k: _spell(v) for k, v in {**args, **result}.items()}
        return rng.choice(self.answers).format(**spelled)


def _spell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float | int):
        return number_text(value)
    if isinstance(value, list):
        return ", ".join(_spell(v) for v in value)
    return str(value)


def string(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **extra}


def enum(desc: str, values: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": values, "description": desc}


def integer(desc: str) -> dict[str, Any]:
    return {"type": "integer", "description": desc}


def number(desc: str) -> dict[str, Any]:
    return {"type": "number", "description": desc}


def boolean(desc: str) -> dict[str, Any]:
    return {"type": "boolean", "description": desc}


def array(desc: str, items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items, "description": desc}
