"""Procedural lookup tools over many domains (train/lookup_domains.py): a verb on a subject (a value
of one of many shapes that the call must copy verbatim, plus qualifiers), a result holding a key
value, and answers that state every value of the result in varied phrasings. None of the held-out
domains or names (heldout.py) occurs here; tests/train checks it."""

from __future__ import annotations

import random
from typing import Any

from train.lookup_domains import DOMAINS, SHAPES
from train.toolspec import Param, Tool, integer, number, string

VERBS = {"get": ["get", "fetch", "read", "query"], "check": ["check", "verify", "inspect"],
         "list": ["list", "show", "describe"], "find": ["find", "search", "locate"],
         "set": ["set", "apply", "change"], "lookup": ["lookup", "resolve", "find"]}  # fmt: skip

# requests over the subject {s} (its label {L}) and the key result's label {K}; qualifiers follow {q}
ASKS = [
    "What's the {K} of {L} {s}{q}?", "Can you check the {K} for {s}{q}?", "I need the {K} for {L} {s}{q}.",
    "{s}{q}: what is the {K}?", "Please look up {s}{q}.", "Look up {L} {s}{q} in the {system}.",
    'What is the {K} of "{s}"{q}?', "Hey, quick one: {K} for {s}{q}?",
    "Could you find out the {K} of {s}{q}?",
    "{K} for {s}{q}, please.", "I'm asking about {L} {s}{q}. What's the {K}?", "Tell me the {K} of {s}{q}.",
    "Check {s}{q} for me.", "Do you know the {K} for {L} {s}{q}?", "Get me the {K}: {s}{q}",
    "what's the {K} for {s}{q}", "Give me the {K} of {L} '{s}'{q}.", "Need {K} info on {s}{q} asap.",
]  # fmt: skip
SET_ASKS = ["Set {L} {s} to {c}{q}.", "Change the {K} of {s} to {c}{q}.", "Make {s} {c}{q}, please.",
            "Switch {L} {s}{q} to {c}."]  # fmt: skip

# answers over the key value {v}, the subject {s}, its labels; {more} lists the other values
ANSWERS = [
    "The {K} of {s} is {v}{more}.", "{s}: {K} {v}{more}.", "It's {v}{more}.", "The {K} is {v}{more}.",
    "I checked {s}: the {K} is {v}{more}.", "According to the {system}, the {K} is {v}{more}.",
    "{v} is the {K} for {s}{more}.", "Sure! The {K} for {s} is {v}{more}.", "Here you go: {K} {v}{more}.",
    "Result for {s}: {v}{more}.", "Good news, the {K} is {v}{more}.", "The {system} says {v}{more}.",
]  # fmt: skip
MORE = [", and the {k} is {x}", " ({k}: {x})", "; {k} {x}", ", with {k} {x}"]


def _schema(rng: random.Random, shape: str, hint: str, gen) -> dict[str, Any]:
    """The parameter's schema; a string's description sometimes shows an example value, which a
    call must not copy in place of the one asked for."""
    if shape == "number":
        return number(hint)
    if shape == "integer":
        return integer(hint)
    if rng.random() < 0.4:
        hint = f"{hint}, e.g. {gen(rng)}"
    return string(hint)


def _tool_name(rng: random.Random, verb: str, noun: str) -> str:
    v = rng.choice(VERBS[verb])
    style = rng.randrange(5)
    if style == 0:
        return f"{v}_{noun}"
    if style == 1:
        return v + "".join(w.title() for w in noun.split("_"))
    if style == 2:
        return f"{noun}.{v}"
    if style == 3:
        return f"{v}-{noun.replace('_', '-')}"
    return f"{noun}_{v}"


def _lookup(rng, domain, system, subject, quals, op) -> Tool:
    verb, noun, desc, fields = op
    sname, slabel, shape = subject
    hint, sgen = SHAPES[shape]
    params = [Param(sname, _schema(rng, shape, f"{hint} of the {slabel}", sgen), sgen)]
    q = ""
    for qname, qshape, qphrase in quals:  # a qualifier is a required argument of some tools
        if rng.random() < 0.6:
            qhint, qgen = SHAPES[qshape]
            params.append(Param(qname, _schema(rng, qshape, qhint, qgen), qgen))
            q += " " + qphrase.replace("{v}", "{" + qname + "}")
    key, klabel, _ = fields[0]
    if verb == "set":
        cname, clabel, cgen = fields[0]
        params.insert(1, Param(cname, string(clabel), cgen))
        asks = [a.replace("{c}", "{" + cname + "}") for a in SET_ASKS]
    else:
        asks = list(ASKS)
    asks = [a.replace("{s}", "{" + sname + "}").replace("{L}", slabel).replace("{K}", klabel)
            .replace("{system}", system).replace("{q}", q) for a in asks]  # fmt: skip
    if rng.random() < 0.3:
        params.append(
            Param(
                "limit", integer("Maximum results"), lambda r: r.randint(1, 20), ["Only {v} results."], False
            )
        )

    def result(args: dict[str, Any], r: random.Random) -> dict[str, Any]:
        out = {k: g(r) for k, _, g in fields}
        if verb == "set":
            out = {"ok": True, key: args[key]}
        if r.random() < 0.4:
            out[sname] = args[sname]
        items = list(out.items())
        r.shuffle(items)
        return dict(items)

    answers = []
    for a in ANSWERS:
        more = "".join(
            rng.choice(MORE).format(k=lab, x="{" + k + "}") for k, lab, _ in fields[1:] if verb != "set"
        )
        answers.append(a.format(K=klabel, s="{" + sname + "}", v="{" + key + "}", more=more, system=system))
    return Tool(_tool_name(rng, verb, noun), desc, params, asks, result, answers, domain)


def lookup_tools(rng: random.Random) -> list[Tool]:
    """One tool per operation of every domain, names drawn from rng."""
    tools = []
    for domain, (system, subjects, quals, ops) in DOMAINS.items():
        for op in ops:
            tools.append(_lookup(rng, domain, system, rng.choice(subjects), quals, op))
    return tools
