"""The streaming tool-call parser on scripted model text, whole and split at every boundary."""

from __future__ import annotations

import itertools
import json

import pytest

from app.chat.chunks import deltas
from app.chat.tool_events import CallArgs, CallStart, Content, collect
from app.chat.tool_parser import ToolCallParser, parse_whole


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter):09d}"


def run_split(text: str, cuts: list[int], enabled: bool = True):
    parser = ToolCallParser(enabled, id_factory=ids())
    events = []
    prev = 0
    for cut in [*cuts, len(text)]:
        events += parser.feed(text[prev:cut])
        prev = cut
    events += parser.finish()
    return events, parser


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
TWO = (
    "Let me check.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris {x}", "q": "a\\"b</tool_call>"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": ["UTC", {"n": 1}]}}\n</tool_call>'
)
SCRIPTS = {
    "one call": CALL,
    "two calls after text": TWO,
    "plain text": "Hello, <b>world</b>! a < b and <tool but not a call.\n",
    "text after call": CALL + "\nDone: it is sunny.",
    "empty arguments": '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
    "keys swapped": '<tool_call>{"arguments": {"a": 1}, "name": "swap"}</tool_call>',
    "string arguments": '<tool_call>{"name": "enc", "arguments": "{\\"a\\": 1}"}</tool_call>',
    "unicode": '<tool_call>\n{"name": "say", "arguments": {"text": "héllo 🌍 \\u00e9"}}\n</tool_call>',
    "no end tag": '<tool_call>\n{"name": "cut", "arguments": {"a": [1, 2]}}',
    "parameters alias": '<tool_call>{"name": "p", "parameters": {"x": true}}</tool_call>',
}


def expected_calls(text: str) -> list[tuple[str, dict]]:
    """The calls the script contains, parsed independently with json."""
    out = []
    for chunk in text.split("<tool_call>")[1:]:
        obj, _ = json.JSONDecoder().raw_decode(chunk.lstrip())
        args = obj.get("arguments", obj.get("parameters"))
        if isinstance(args, str):
            args = json.loads(args)
        out.append((obj["name"], args))
    return out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_whole_text(name):
    text = SCRIPTS[name]
    content, calls = parse_whole(text, id_factory=ids())
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected_calls(text)
    assert "<tool_call>" not in (content or "") and "</tool_call>" not in (content or "").replace(
        'a\\"b</tool_call>', ""
    )
    if not calls:
        assert content == text


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_single_split_matches_whole(name):
    text = SCRIPTS[name]
    whole_content, whole_calls = parse_whole(text, id_factory=ids())
    for cut in range(len(text) + 1):
        events, _ = run_split(text, [cut])
        content, calls = collect(events)
        assert content == whole_content, cut
        assert [(c.id, c.name, c.arguments) for c in calls] == [
            (c.id, c.name, c.arguments) for c in whole_calls
        ]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_char_by_char_stream_invariants(name):
    """Every character its own delta: ids and names once, args join, indexes increase."""
    text = SCRIPTS[name]
    events, parser = run_split(text, list(range(1, len(text))))
    _, whole_calls = parse_whole(text, id_factory=ids())
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [s.index for s in starts] == list(range(len(whole_calls)))
    assert len({s.id for s in starts}) == len(starts)
    for s in starts:
        # every argument fragment of call i comes after its start and before the next call's start
        pos = events.index(s)
        nxt = events.index(starts[s.index + 1]) if s.index + 1 < len(starts) else len(events)
        frags = [e.fragment for e in events if isinstance(e, CallArgs) and e.index == s.index]
        assert all(events.index(e) > pos for e in events if isinstance(e, CallArgs) and e.index == s.index)
        assert all(not (isinstance(e, CallArgs) and e.index == s.index) for e in events[nxt:])
        assert json.loads("".join(frags)) == json.loads(whole_calls[s.index].arguments)
    assert all(e.text for e in events if isinstance(e, Content))
    assert parser.made_calls == bool(whole_calls)


def test_random_multi_splits():
    import random

    rng = random.Random(0)
    text = SCRIPTS["two calls after text"] + "\nok"
    whole = parse_whole(text, id_factory=ids())
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30)))
        content, calls = collect(run_split(text, cuts)[0])
        assert content == whole[0]
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole[1]]


def test_arguments_stream_incrementally():
    parser = ToolCallParser(id_factory=ids())
    ev = parser.feed('<tool_call>\n{"name": "f", "arguments": {"city": "Par')
    assert isinstance(ev[0], CallStart) and ev[0].name == "f"
    assert "".join(e.fragment for e in ev[1:]) == '{"city": "Par'
    ev = parser.feed('is"}}\n</tool_call>')
    assert "".join(e.fragment for e in ev) == 'is"}'


def test_content_before_call_and_held_back_tag():
    parser = ToolCallParser(id_factory=ids())
    assert collect(parser.feed("Sure <tool_"))[0] == "Sure"  # the partial tag and the space wait
    ev = parser.feed('call>{"name": "f", "arguments": {}}</tool_call>')
    assert not any(isinstance(e, Content) for e in ev)


def test_disabled_parser_passes_text_through():
    events, parser = run_split(CALL, [5, 20])
    assert parser.made_calls
    events, parser = run_split(CALL, [5, 20], enabled=False)
    assert collect(events) == (CALL, []) and not parser.made_calls


def test_malformed_call_is_returned_as_content_not_dropped():
    text = "<tool_call>not json at all</tool_call>"
    assert parse_whole(text) == (text, [])


def test_truncated_call_keeps_what_was_generated():
    content, calls = parse_whole('<tool_call>\n{"name": "f", "arguments": {"a": "unfinis', id_factory=ids())
    assert content is None and calls[0].name == "f" and calls[0].arguments == '{"a": "unfinis'


def test_deltas_follow_the_wire_shape():
    """First delta of a call: index, id, type, whole name, arguments ""; later: index + fragments."""
    events, _ = run_split(TWO, list(range(1, len(TWO), 3)))
    out = deltas(events)
    seen: set[int] = set()
    for d in out:
        if "content" in d:
            assert d["content"] != ""
            continue
        (call,) = d["tool_calls"]
        if call["index"] not in seen:
            seen.add(call["index"])
            assert call.keys() == {"index", "id", "type", "function"}
            assert call["function"]["arguments"] == "" and call["type"] == "function"
        else:
            assert call.keys() == {"index", "function"} and call["function"].keys() == {"arguments"}
    assert seen == {0, 1}
