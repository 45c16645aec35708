"""Round-4 pattern tools (table in train/pattern_domains.py): the request shapes the round-3 adapter
got wrong on held-out tools, taught on domains that are not held out.

- pair: two values of one pool whose roles the words give, in either order of mention ("Subtract 7
  from 30", "How many PixelCoins is 400 Cafe Stars?": the second-mentioned value fills the first
  parameter; a conversion's source is the value written by the amount);
- venue: a title followed by "in <city>" or "at <place>", the place its own parameter ("Tide");
- named: a group spoken with "the" ("the Rivertown Rovers"), its name argument without the article;
- ident: ids shaped like carriers' tracking numbers (1Z..., JD..., LX...CN) on orders, tickets,
  serials and claims, offered with tools of the same kin, so that the words pick the tool;
- encode: "say X in Morse code"-like requests, which call the tool rather than answer in text.

No value has leading or trailing spaces; none of heldout.py's names or domains occurs here."""

from __future__ import annotations

import random
from typing import Any

from train.pattern_domains import ENCODES, IDENTS, NAMED, PAIRS, VENUES, carrier_id, play_title
from train.toolspec import Param, Tool, string

DOTTED = ("get", "check", "find", "copy", "convert", "merge", "transfer", "reserve")  # noun.verb reads


def _styled(rng: random.Random, name: str) -> str:
    """The name in snake, camel, dotted or dashed style: copy_file, copyFile, file.copy, copy-file."""
    head, _, rest = name.partition("_")
    style = rng.randrange(5)
    if style == 1:
        return head + "".join(w.title() for w in rest.split("_"))
    if style == 2 and head in DOTTED:
        return f"{rest}.{head}"
    if style == 3:
        return name.replace("_", "-")
    return name


def _distinct(params: list[Param], a: str, b: str):
    """A draw of every required value, a and b (one pool) different from each other."""

    def draw(rng: random.Random) -> dict[str, Any]:
        values = {p.name: p.gen(rng) for p in params if p.required}
        gen = next(p.gen for p in params if p.name == b)
        while values[b] == values[a]:
            values[b] = gen(rng)
        return values

    return draw


def _pair(rng: random.Random, domain: str, spec: tuple) -> Tool:
    name, desc, fields, pair, asks, result, answers = spec
    params = [Param(n, schema, gen) for n, schema, gen in fields]
    draw = _distinct(params, *pair) if isinstance(pair, tuple) else pair
    return Tool(_styled(rng, name), desc, params, asks, result, answers, domain, draw=draw)


def _venue(rng: random.Random, domain: str, spec: tuple) -> Tool:
    name, desc, (tname, tschema), (pname, pschema, pgen), asks, result, answers = spec
    params = [Param(tname, tschema, play_title), Param(pname, pschema, pgen)]
    return Tool(_styled(rng, name), desc, params, asks, result, answers, domain)


def _named(rng: random.Random, domain: str, spec: tuple) -> Tool:
    name, desc, (gname, gschema, pool), extra, asks, result, answers = spec
    params = [Param(gname, gschema, lambda r, p=pool: r.choice(p))]
    params += [Param(n, schema, gen) for n, schema, gen in extra]
    return Tool(_styled(rng, name), desc, params, asks, result, answers, domain)


def _ident(rng: random.Random, domain: str, spec: tuple) -> Tool:
    name, desc, pname, hint, asks, result, answers = spec
    params = [Param(pname, string(hint), carrier_id)]
    return Tool(_styled(rng, name), desc, params, asks, result, answers, domain, kin="ident")


def _encode(rng: random.Random, domain: str, spec: tuple) -> Tool:
    name, desc, fields, asks, result, answers = spec
    params = [Param(n, schema, gen, text=text) for n, schema, gen, text in fields]
    return Tool(_styled(rng, name), desc, params, asks, result, answers, domain, kin="encode")


BUILDERS = [(PAIRS, _pair), (VENUES, _venue), (NAMED, _named), (IDENTS, _ident), (ENCODES, _encode)]


def pattern_tools(rng: random.Random) -> list[Tool]:
    """One tool per table entry of every pattern, name styles drawn from rng."""
    return [build(rng, domain, spec) for table, build in BUILDERS for domain, spec in table.items()]
