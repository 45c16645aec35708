"""Procedural training tools: an action (create, get, update, delete, search) on a record type of a
business system (CRM, helpdesk, billing, projects, HR, shop, devops), with varied field types
(strings, enums, numbers, booleans, arrays, nested objects) and name styles (snake, camel, dotted)."""

from __future__ import annotations

import random
from typing import Any

from train import values as V
from train.toolspec import Param, Tool, array, boolean, enum, integer, number, string

STATUS = ["open", "pending", "closed", "active", "archived"]
PRIORITY = ["low", "medium", "high", "critical"]


def _field(kind: str, name: str) -> tuple[dict[str, Any], Any, Any]:
    """(schema, value generator, text spelling or None) of one field kind."""
    label = name.replace("_", " ")
    if kind == "person":
        return string(f"The {label}"), V.person_any, None
    if kind == "email":
        return string(f"The {label} address", format="email"), V.email_any, None
    if kind == "date":
        return string(f"The {label}, YYYY-MM-DD"), V.date, None
    if kind == "status":
        return enum(f"The {label}", STATUS), lambda r: r.choice(STATUS), None
    if kind == "priority":
        return enum(f"The {label}", PRIORITY), lambda r: r.choice(PRIORITY), None
    if kind == "amount":
        return number(f"The {label}"), V.amount, None
    if kind == "count":
        return integer(f"The {label}"), lambda r: r.randint(1, 500), None
    if kind == "flag":
        return boolean(f"Whether it is {label}"), lambda r: True, None
    if kind == "topic":
        return string(f"The {label}"), lambda r: V.topic(r), None
    if kind == "city":
        return string(f"The {label}"), lambda r: r.choice(V.CITIES), None
    if kind == "tags":
        return (
            array(f"The {label}", {"type": "string"}),
            lambda r: r.sample(V.WORDS, r.randint(1, 3)),
            lambda v: " and ".join(v),
        )
    if kind == "address":
        schema = {
            "type": "object",
            "description": f"The {label}",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
        }
        countries = ["France", "Germany", "Spain", "Canada", "Kenya", "Japan", "Brazil", "India"]
        return (
            schema,
            lambda r: {"city": r.choice(V.CITIES), "country": r.choice(countries)},
            (lambda v: f"{v['city']}, {v['country']}"),
        )
    raise ValueError(kind)


# record type -> (system, id prefix, fields (name, kind)); the first fields are the likely required ones
RECORDS: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "contact": (
        "CRM",
        "CON",
        [("name", "person"), ("email", "email"), ("company", "topic"), ("address", "address")],
    ),
    "lead": (
        "CRM",
        "LEAD",
        [("name", "person"), ("source", "topic"), ("score", "count"), ("qualified", "flag")],
    ),
    "deal": (
        "CRM",
        "DEAL",
        [("title", "topic"), ("value", "amount"), ("stage", "status"), ("owner", "person")],
    ),
    "ticket": (
        "helpdesk",
        "TCK",
        [("subject", "topic"), ("priority", "priority"), ("requester", "email"), ("tags", "tags")],
    ),
    "invoice": (
        "billing system",
        "INV",
        [("customer", "person"), ("amount", "amount"), ("due_date", "date"), ("paid", "flag")],
    ),
    "order": (
        "shop",
        "ORD",
        [("customer_email", "email"), ("quantity", "count"), ("status", "status"), ("ship_to", "address")],
    ),
    "task": (
        "project tracker",
        "TSK",
        [("title", "topic"), ("assignee", "person"), ("due_date", "date"), ("priority", "priority")],
    ),
    "project": (
        "project tracker",
        "PRJ",
        [("name", "topic"), ("owner", "person"), ("budget", "amount"), ("labels", "tags")],
    ),
    "note": ("notes app", "NOTE", [("title", "topic"), ("body", "topic"), ("pinned", "flag")]),
    "employee": (
        "HR system",
        "EMP",
        [("full_name", "person"), ("work_email", "email"), ("office", "city"), ("start_date", "date")],
    ),
    "product": (
        "catalog",
        "SKU",
        [("title", "topic"), ("price", "amount"), ("stock", "count"), ("active", "flag")],
    ),
    "subscription": (
        "billing system",
        "SUB",
        [("customer_email", "email"), ("seats", "count"), ("status", "status")],
    ),
    "campaign": (
        "marketing tool",
        "CMP",
        [("name", "topic"), ("budget", "amount"), ("start_date", "date"), ("channels", "tags")],
    ),
    "issue": (
        "code host",
        "ISS",
        [("title", "topic"), ("assignee", "person"), ("labels", "tags"), ("priority", "priority")],
    ),
    "deployment": (
        "devops platform",
        "DEP",
        [("service", "topic"), ("region", "city"), ("replicas", "count"), ("canary", "flag")],
    ),
    "expense": (
        "expense tracker",
        "EXP",
        [("description", "topic"), ("amount", "amount"), ("date", "date"), ("reimbursable", "flag")],
    ),
}

CLAUSE = ["with {label} {v}", "{label}: {v}", "where the {label} is {v}", "and {label} {v}"]


def _name(rng: random.Random, verb: str, noun: str) -> str:
    style = rng.randrange(4)
    if style == 0:
        return f"{verb}_{noun}"
    if style == 1:
        return verb + "".join(w.title() for w in noun.split("_"))
    if style == 2:
        return f"{noun}.{verb}"
    return f"{noun}_{verb}"


def _clause(rng: random.Random, name: str, placeholder: str) -> str:
    return rng.choice(CLAUSE[:3]).format(label=name.replace("_", " "), v="{" + placeholder + "}")


def record_tools(rng: random.Random) -> list[Tool]:
    """Five tools per record type, names and descriptions drawn from rng."""
    tools: list[Tool] = []
    for noun, (system, prefix, fields) in RECORDS.items():
        made = {name: _field(kind, name) for name, kind in fields}
        ident = Param(
            f"{noun}_id", string(f"The {noun} id, like {prefix}-123"), lambda r, p=prefix: V.code(r, p)
        )
        tools.append(_create(rng, noun, system, prefix, fields, made))
        tools.append(
            Tool(
                _name(rng, rng.choice(["get", "fetch", "lookup"]), noun),
                f"Get one {noun} from the {system} by its id.",
                [ident],
                [
                    f"Look up {noun} {{{noun}_id}}.",
                    f"Show me {noun} {{{noun}_id}}.",
                    f"What's in {noun} {{{noun}_id}}?",
                    f"Fetch the {noun} with id {{{noun}_id}}.",
                ],
                lambda a, r, n=noun, f=fields, m=made: {f[0][0]: m[f[0][0]][1](r), f[1][0]: m[f[1][0]][1](r)},
                [
                    f"{noun.title()} {{{noun}_id}}: {fields[0][0].replace('_', ' ')} {{{fields[0][0]}}}, "
                    f"{fields[1][0].replace('_', ' ')} {{{fields[1][0]}}}.",
                    f"The {noun} {{{noun}_id}} has {fields[0][0].replace('_', ' ')} {{{fields[0][0]}}} and "
                    f"{fields[1][0].replace('_', ' ')} {{{fields[1][0]}}}.",
                ],
                system,
            )
        )
        fname, _ = rng.choice(fields[:3])
        schema, gen, text = made[fname]
        value = Param(fname, schema, gen, text=text)
        label = fname.replace("_", " ")
        tools.append(
            Tool(
                _name(rng, rng.choice(["update", "edit", "set"]), noun),
                f"Change the {label} of a {noun} in the {system}.",
                [ident, value],
                [
                    f"Set the {label} of {noun} {{{noun}_id}} to {{{fname}}}.",
                    f"Change {noun} {{{noun}_id}} so its {label} is {{{fname}}}.",
                    f"Update {noun} {{{noun}_id}}: {label} {{{fname}}}.",
                ],
                lambda a, r: {"updated": True},
                [
                    f"Updated {noun} {{{noun}_id}}: the {label} is now {{{fname}}}.",
                    f"Done. {noun.title()} {{{noun}_id}} now has {label} {{{fname}}}.",
                ],
                system,
            )
        )
        tools.append(
            Tool(
                _name(rng, rng.choice(["delete", "remove", "archive"]), noun),
                f"Delete a {noun} from the {system}.",
                [ident],
                [
                    f"Delete {noun} {{{noun}_id}}.",
                    f"Remove the {noun} {{{noun}_id}}, please.",
                    f"Get rid of {noun} {{{noun}_id}}.",
                ],
                lambda a, r: {"deleted": True},
                [f"{noun.title()} {{{noun}_id}} was deleted.", f"Removed {noun} {{{noun}_id}}."],
                system,
            )
        )
        fname, _ = rng.choice(fields[:3])
        schema, gen, text = made[fname]
        label = fname.replace("_", " ")
        tools.append(
            Tool(
                _name(rng, rng.choice(["search", "list", "find"]), noun + "s"),
                f"Search the {system} for {noun}s matching a {label}.",
                [
                    Param(fname, schema, gen, text=text),
                    Param(
                        "limit",
                        integer("Maximum results"),
                        lambda r: r.randint(1, 50),
                        ["Return at most {v}.", "Only the first {v}."],
                        required=False,
                    ),
                ],
                [
                    f"Find {noun}s with {label} {{{fname}}}.",
                    f"List all {noun}s where the {label} is {{{fname}}}.",
                    f"Which {noun}s have {label} {{{fname}}}?",
                ],
                lambda a, r, p=prefix: {"count": r.randint(0, 40), "first_id": V.code(r, p)},
                [
                    f"I found {{count}} {noun}s; the first is {{first_id}}.",
                    f"There are {{count}} matching {noun}s (first: {{first_id}}).",
                ],
                system,
            )
        )
    return tools


def _create(rng, noun, system, prefix, fields, made) -> Tool:
    n_req = rng.choice([1, 2, 2, 3])
    params = []
    for i, (name, _kind) in enumerate(fields):
        schema, gen, text = made[name]
        label = name.replace("_", " ")
        say = [f"Set the {label} to {{v}}.", f"The {label} is {{v}}.", f"Use {{v}} as the {label}."]
        params.append(Param(name, schema, gen, say, required=i < n_req, text=text))
    req = [p.name for p in params if p.required]
    asks = []
    for head in (
        f"Create a {noun}",
        f"Add a new {noun}",
        f"Please make a {noun} in the {system}",
        f"New {noun}",
    ):
        asks.append(head + " " + ", ".join(_clause(rng, n, n) for n in req) + ".")
    return Tool(
        _name(rng, rng.choice(["create", "add", "new"]), noun),
        f"Create a {noun} in the {system}.",
        params,
        asks,
        lambda a, r, p=prefix: {"id": V.code(r, p), "created": True},
        [
            f"Created {noun} {{id}}.",
            f"The new {noun} has id {{id}}.",
            f"Done, {noun} {{id}} is in the {system}.",
        ],
        system,
    )
