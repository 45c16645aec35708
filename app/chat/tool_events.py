"""What app.chat.tool_parser emits: Content (text outside calls), CallStart (index, id, name) and
CallArgs (a fragment of a call's arguments JSON); and a finished reply's events collected into its
content and ParsedCalls."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    index: int
    fragment: str


Event = Content | CallStart | CallArgs


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str


def collect(events: list[Event]) -> tuple[str | None, list[ParsedCall]]:
    content: list[str] = []
    calls: list[ParsedCall] = []
    for ev in events:
        if isinstance(ev, Content):
            content.append(ev.text)
        elif isinstance(ev, CallStart):
            calls.append(ParsedCall(ev.id, ev.name, ""))
        else:
            calls[ev.index].arguments += ev.fragment
    text = "".join(content)
    return (text if text else None), calls
