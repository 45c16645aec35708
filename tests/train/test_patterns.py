"""The round-4 pattern rows (train/pattern_tools.py): roles of two same-pool values follow the words
whatever their order, titles leave the place out, names drop "the", look-alike ids come with tools
of their kin, "say X in Morse code" calls the tool, no value has surrounding spaces, and nothing of
the held-out set appears."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

from app.chat.template import PromptRenderer
from app.chat.tool_parser import parse_whole
from grammar.dialects import GENERIC
from train import heldout
from train.generate import END, Generator, joined
from train.pattern_domains import ENCODES, IDENTS, NAMED, PAIRS, VENUES, morse, nato, pig_latin, roman
from train.pattern_tools import pattern_tools

TOOLS = pattern_tools(random.Random(2))
BY_DOMAIN = {t.domain: t for t in TOOLS}
CONVERSIONS = {"loyalty points": "amount", "number bases": "number"}  # domain -> the amount's parameter
FROM_ROLE = ("from_", "source", "origin", "start", "old_")  # a parameter name's start -> its role
TO_ROLE = ("to_", "target", "destination", "end_", "new_")
FROM_CUES = ("from ", "of ", "since ", "than ", "out of ")  # words that put a value in a role
TO_CUES = ("to ", "into ", "until ", "as ")
GENERIC_WORDS = {"the", "and", "its", "for", "status", "whether", "number", "look", "progress"}


def _requests(domains, n: int = 120, seed: int = 0):
    rng = random.Random(seed)
    for domain in domains:
        tool = BY_DOMAIN[domain]
        for _ in range(n):
            yield tool, *tool.request(rng)


def _roles(tool) -> tuple[str, str]:
    names = [p.name for p in tool.params]
    return next(n for n in names if n.startswith(FROM_ROLE)), next(n for n in names if n.startswith(TO_ROLE))


def _second_first(text: str, first, second) -> bool:
    """Whether `second` is mentioned before `first` (a value inside the other, "Tuesday" in "next
    Tuesday", is found outside it)."""
    spans: dict[str, tuple[int, int]] = {}
    for v in sorted({str(first), str(second)}, key=len, reverse=True):
        for m in re.finditer(rf"(?<![\w/.]){re.escape(v)}(?![\d/])", text):
            if not any(s <= m.start() < e for s, e in spans.values()):
                spans[v] = m.span()
                break
    return spans[str(second)][0] < spans[str(first)][0]


def test_pattern_tools_stay_off_the_heldout_set():
    held = heldout.heldout_tools()
    assert {t.name for t in TOOLS}.isdisjoint(t.name for t in held)
    assert {t.domain for t in TOOLS}.isdisjoint(t.domain for t in held)
    assert len(TOOLS) == sum(map(len, (PAIRS, VENUES, NAMED, IDENTS, ENCODES)))
    # none of the held-out values or their domains' words in a request, a description or an answer
    values = heldout.PHRASES + heldout.TEAMS + heldout.MOVIES + heldout.CITIES + heldout.LANGS
    words = ("parcel", "package", "tracking", "shipment", "deliver", "translat", "unit of measure")
    rng = random.Random(1)
    for tool in TOOLS:
        assert not any(w in tool.description.lower() for w in words), tool.name
        for _ in range(40):
            text, args = tool.request(rng)
            answer = tool.answer(rng, args, tool.result(args, rng))
            for v in values:
                assert not re.search(rf"\b{re.escape(v)}\b", text + " " + answer), (v, text)
            assert not any(w in text.lower() for w in words), text


def test_tool_names_stay_unique_across_families():
    """A pattern tool's drawn name style never gives another family's name (claim_status.get)."""
    for seed in range(25):
        names = [t.name for t in Generator(seed).tools]
        assert len(names) == len(set(names)), seed


def test_conversions_take_the_source_by_the_amount():
    """As in "Convert 394 liters to gallons" and "How many gallons is 394 liters?": the source is the
    value written next to the amount, whichever is mentioned first; both orders occur."""
    target_first = 0
    for tool, text, args in _requests(CONVERSIONS, n=200):
        n = re.escape(str(args[CONVERSIONS[tool.domain]]))
        src, dst = (re.escape(str(args[k])) for k in _roles(tool))
        assert src != dst
        assert re.search(rf"\b{n} (from )?{src}\b|\b{src} {n}\b", text), text
        assert not re.search(rf"\b{n} (from )?{dst}\b|\b{dst} {n}\b", text), text
        target_first += _second_first(text, *(args[k] for k in _roles(tool)))
    assert 0.2 < target_first / 400 < 0.7


def test_pair_roles_follow_the_words_in_either_order():
    """Each value sits after a word of its own role ("from A", "to B", "instead of A"), never after
    one of the other's, and about a third or more of the requests name the second parameter first."""
    roled = [
        d
        for d in PAIRS
        if d not in CONVERSIONS and any(p.name.startswith(FROM_ROLE) for p in BY_DOMAIN[d].params)
    ]
    assert len(roled) >= 8
    for tool, text, args in _requests(roled):
        src, dst = (str(args[k]) for k in _roles(tool))
        assert src != dst
        assert not any(f"{c}{src}" in text for c in TO_CUES if f"{c}{src}" not in f"{c}{dst}"), text
        assert not any(f"{c}{dst}" in text for c in FROM_CUES if f"{c}{dst}" not in f"{c}{src}"), text
        assert any(f"{c}{src}" in text for c in FROM_CUES) or any(f"{c}{dst}" in text for c in TO_CUES), text
    flipped = Counter()
    for tool, text, args in _requests(PAIRS):
        first, second = (
            _roles(tool) if tool.domain in roled + list(CONVERSIONS) else [p.name for p in tool.params[:2]]
        )
        flipped[tool.domain] += _second_first(text, args[first], args[second])
    assert all(v > 0 for v in flipped.values()), flipped
    assert sum(flipped.values()) / (120 * len(PAIRS)) > 0.3


def test_arithmetic_pairs_compute_from_the_roles():
    for tool, _, args in _requests(["subtraction", "division"], n=50):
        result = tool.result(args, random.Random(0))
        if tool.domain == "subtraction":
            assert result["difference"] == args["minuend"] - args["subtrahend"] > 0
        else:
            assert abs(result["quotient"] - args["dividend"] / args["divisor"]) < 1e-3


def test_venue_titles_leave_the_place_out():
    """For "When is Tide on in Oslo tonight?" the title is "Tide" and the city its own argument; a
    title may hold a place of its own ("Silent Garden of Redwater")."""
    joined_in_text = 0
    for tool, text, args in _requests(VENUES):
        title, place = (args[p.name] for p in tool.params)
        assert (
            " in " not in title
            and " at " not in title
            and not title.endswith((f" in {place}", f" at {place}"))
        )
        joined_in_text += bool(re.search(rf"{re.escape(title)} (in|at|at the) {re.escape(place)}\b", text))
    assert joined_in_text / (120 * len(VENUES)) > 0.4
    short = sum(len(args[tool.params[0].name].split()) == 1 for tool, _, args in _requests(VENUES))
    assert short > 0.3 * 120 * len(VENUES)


def test_names_spoken_with_the_drop_the_article():
    spoken = 0
    for tool, text, args in _requests(NAMED):
        name = args[tool.params[0].name]
        assert not name.lower().startswith("the "), name
        spoken += f"the {name}" in text
    assert spoken / (120 * len(NAMED)) > 0.7


def test_lookalike_ids_come_with_their_kin_and_words_that_pick_the_tool():
    """Carrier-shaped ids (1Z..., JD..., LX...CN) on orders, tickets, serials, claims: the request
    names the record, and the tools offered with one are mostly others taking such ids."""
    carrier = re.compile(r"1Z[0-9A-Z]{16}|JD\d{18}|[A-Z]{2}\d{9}[A-Z]{2}|TBA\d{12}|\d{12,22}")
    shaped = 0
    for tool, text, args in _requests(IDENTS, n=80):
        (value,) = args.values()
        shaped += bool(carrier.fullmatch(value))
        words = {w.lower() for w in re.findall(r"[A-Za-z]{3,}", tool.description)} - GENERIC_WORDS
        assert words & {w.lower() for w in re.findall(r"[A-Za-z]{3,}", text)}, (tool.description, text)
    assert shaped > 0.5 * 80 * len(IDENTS)
    gen = Generator(0)
    ident = [t for t in gen.tools if t.kin == "ident"]
    kin = sum(any(o.kin == "ident" for o in gen._toolset([t]) if o is not t) for t in ident * 20)
    assert kin > 0.5 * 20 * len(ident)


def test_say_it_in_morse_calls_the_tool():
    """An encode request is a call (not a text answer), with results that are right."""
    assert morse("sos") == "... --- ..." and morse("hi there").count(" / ") == 1
    assert nato("Bob") == "Bravo Oscar Bravo" and roman(1994) == "MCMXCIV" and pig_latin("help") == "elphay"
    gen = Generator(3)
    encoders = [t for t in gen.tools if t.kin == "encode"]
    assert len(encoders) == len(ENCODES)
    said_in = kin = 0
    for i in range(40):
        tool = encoders[i % len(encoders)]
        gen._pick = lambda t=tool: t
        msgs, offered, target = gen.example("call")
        said_in += bool(
            re.search(r" in(to)? (Morse|the NATO|NATO|Braille|binary|Roman|Pig)", msgs[-1].content)
        )
        kin += sum(t.kin == "encode" for t in offered) > 1
        _, calls = parse_whole(target, fmt=GENERIC)
        assert calls and calls[0].name == tool.name and json.loads(calls[0].arguments)
    assert said_in > 30 and kin > 20


def test_values_have_no_surrounding_spaces_and_answers_state_the_result():
    rng = random.Random(5)

    def strings(v):
        if isinstance(v, dict):
            return [s for x in v.values() for s in strings(x)]
        if isinstance(v, list):
            return [s for x in v for s in strings(x)]
        return [v] if isinstance(v, str) else []

    for tool in Generator(0).tools:
        for _ in range(30):
            text, args = tool.request(rng)
            assert text == text.strip() and "  " not in text, text
            for s in strings(args):
                assert s and s == s.strip(), (tool.name, args)
    for tool in TOOLS:
        for _ in range(20):
            text, args = tool.request(rng)
            result = tool.result(args, rng)
            answer = tool.answer(rng, args, result)
            for k, v in result.items():
                if k not in args and not isinstance(v, bool):
                    assert str(v) in answer, (tool.name, result, answer)


def test_a_value_that_begins_a_joined_request_keeps_its_case():
    assert joined("Do A.", " Also, ", "What's B?", {"x": "B"}) == "Do A. Also, what's B?"
    assert joined("Do A.", " And ", "Saturday works better.", {"day": "Saturday"}) == (
        "Do A. And Saturday works better."
    )


def test_the_mixture_keeps_its_shares(smollm2_dir):
    """Pattern tools are a fifth or so of the calls; plain-text targets keep their place."""
    from transformers import AutoTokenizer

    renderer = PromptRenderer(AutoTokenizer.from_pretrained(smollm2_dir))
    gen = Generator(4)
    family = {t.name: f for f, ts in gen.families.items() for t in ts}
    calls, texts = Counter(), 0
    for row in gen.samples(renderer, 400):
        for seg, target in row["segments"]:
            if target:
                _, parsed = parse_whole(seg.removesuffix(END), fmt=GENERIC)
                texts += not parsed
                calls.update(family[c.name] for c in parsed or [])
                for c in parsed or []:
                    assert all(s == s.strip() for s in json.loads(c.arguments).values() if isinstance(s, str))
    share = calls["pattern"] / sum(calls.values())
    assert 0.12 < share < 0.35, calls
    assert texts > 0.45 * (texts + sum(calls.values()))


def test_the_second_pass_takes_rows_by_the_tools_their_targets_call():
    from train.pass2 import select

    def row(name: str) -> str:
        call = f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call>{END}'
        return json.dumps({"kind": "call", "segments": [["prompt", False], [call, True]]}) + "\n"

    lines = [row("text_to_morse")] * 3 + [row("get_weather")] * 5
    chosen = select(lines, {"text_to_morse"}, pattern=2, other=1, seed=0)
    assert sorted(chosen) == sorted([row("text_to_morse")] * 2 + [row("get_weather")])
