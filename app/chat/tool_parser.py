"""Streaming parser of the model's tool-call text into OpenAI tool-call deltas.

The model writes calls in its family's dialect (grammar/dialects.py), by default Hermes/Qwen:
    <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>
Mistral's `[TOOL_CALLS][{...}, {...}]` and Llama 3's bare `{"name": ..., "parameters": ...}` (the
whole reply, calls separated by ";") are read the same way.
Text deltas go in with feed(); out come events (app.chat.tool_events): Content (text outside calls),
CallStart (index, id, name: emitted once the name is complete) and CallArgs (fragments of the
arguments JSON, streamed as generated). Joined fragments equal what the same text fed whole produces.
Call markup never reaches Content: partial tags at the end of a delta are held back until they can be
decided.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from functools import partial

from app.chat.tool_events import CallArgs, CallStart, Content, Event, ParsedCall, collect
from grammar.dialects import HERMES, Dialect

_ID_CHARS = string.ascii_letters + string.digits


def new_call_id(length: int = 24) -> str:
    """An OpenAI-style call id; Mistral's dialect asks for 9 characters and no prefix."""
    body = "".join(secrets.choice(_ID_CHARS) for _ in range(length))
    return body if length < 24 else "call_" + body


class ToolCallFormat:
    """The markers the parser looks for, from a dialect."""

    def __init__(self, dialect: Dialect = HERMES):
        self.dialect = dialect
        self.start = dialect.open.strip()  # "" : a bare JSON call at the start of the reply
        self.end = dialect.close.strip()  # "" : nothing closes a call (list or separator form)
        self.list_form = dialect.list_form
        self.sep = dialect.sep.strip()  # between calls of the list / bare forms


# `{"name": "<name>", "arguments": ` (also "parameters"), the prefix every well-ordered call has
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_WS = " \t\r\n"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolCallParser:
    def __init__(
        self,
        enabled: bool = True,
        fmt: Dialect | ToolCallFormat = HERMES,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.enabled = enabled
        self.fmt = fmt if isinstance(fmt, ToolCallFormat) else ToolCallFormat(fmt)
        self.id_factory = id_factory or partial(new_call_id, self.fmt.dialect.call_id_length)
        self.num_calls = 0
        self.content_emitted = False
        self._buf = ""
        self._mode = "text"  # text | header | args | tail
        self._pending_ws = ""  # trailing whitespace of content, held until more text decides it
        # arguments scanner state
        self._started = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._string_value = False  # the arguments value is a JSON string (double-encoded)
        self._scalar = False
        self._raw_value = ""  # the value so far, for string values that are decoded at the end
        self._list_open = False  # list form: the "[" before the first call is still to be read
        self._text_only = False  # bare form: the reply began as text, so it holds no call
        self._obj_closed = False  # list and bare forms: the call object's "}" has been read

    @property
    def made_calls(self) -> bool:
        return self.num_calls > 0

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if not self.enabled:
            return [Content(text)]
        self._buf += text
        events: list[Event] = []
        progress = True
        while progress:
            progress = getattr(self, f"_step_{self._mode}")(events)
        return events

    def finish(self) -> list[Event]:
        """Flush at the end of generation: held-back text, an unterminated call."""
        if not self.enabled:
            return []
        events: list[Event] = []
        if self._mode == "text":
            self._content(self._buf, events)
            self._buf = ""
        elif self._mode == "header":
            # generation ended inside a call before its name was complete: salvage a whole object
            # (end tag cut by a stop), else give the text back as content rather than drop it
            if not self._salvage(self._buf, events):
                self._content(self.fmt.start + self._buf, events)
            self._buf = ""
        elif self._mode == "args":
            if self._string_value and self._raw_value:
                self._finish_string_value(events)
            self._buf = ""
        self._mode = "text"
        if self._pending_ws and not self.made_calls:
            events.append(Content(self._pending_ws))
            self.content_emitted = True
        self._pending_ws = ""
        return events

    # ---- content -----------------------------------------------------------------------------

    def _content(self, text: str, events: list[Event]) -> None:
        text = self._pending_ws + text
        self._pending_ws = ""
        if not text:
            return
        if self.made_calls and not self.content_emitted:
            text = text.lstrip(_WS)
        body = text.rstrip(_WS)
        self._pending_ws = text[len(body) :]
        if body:
            events.append(Content(body))
            self.content_emitted = True

    def _step_text(self, events: list[Event]) -> bool:
        if not self.fmt.start:
            return self._step_bare_text(events)
        start = self._buf.find(self.fmt.start)
        if start >= 0:
            self._content(self._buf[:start], events)
            self._buf = self._buf[start + len(self.fmt.start) :]
            self._mode = "header"
            self._list_open = self.fmt.list_form
            return True
        keep = _partial_suffix(self._buf, self.fmt.start)
        self._content(self._buf[: len(self._buf) - keep], events)
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _step_bare_text(self, events: list[Event]) -> bool:
        # a bare JSON call is the whole reply: "{" first decides, text first rules calls out
        if self._text_only or self.made_calls or self.content_emitted:
            self._content(self._buf, events)
            self._buf = ""
            return False
        head = self._buf.lstrip(_WS)
        if not head:
            return False  # only whitespace so far: undecided
        if head.startswith("{"):
            self._buf = head
            self._mode = "header"
            return True
        self._text_only = True
        self._content(self._buf, events)
        self._buf = ""
        return False

    # ---- a call ------------------------------------------------------------------------------

    def _step_header(self, events: list[Event]) -> bool:
        if self._list_open:
            head = self._buf.lstrip(_WS)
            if not head:
                return False
            if head.startswith("["):
                head = head[1:]
            self._buf = head
            self._list_open = False
        match = _HEADER.match(self._buf)
        if match:
            try:
                name = json.loads('"' + match.group(1) + '"')
            except json.JSONDecodeError:
                name = match.group(1)
            self._start_call(name, events)
            self._buf = self._buf[match.end() :]
            self._mode = "args"
            self._reset_scanner()
            return True
        end = self._buf.find(self.fmt.end) if self.fmt.end else -1
        if end >= 0:
            # not the well-ordered prefix (keys swapped, other spacing): parse the whole object
            body, self._buf = self._buf[:end], self._buf[end + len(self.fmt.end) :]
            if not self._salvage(body, events):
                self._content(self.fmt.start + body + self.fmt.end, events)
            self._mode = "text"
            return True
        return False

    def _salvage(self, body: str, events: list[Event]) -> bool:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return False
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return False
        args = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        self._start_call(obj["name"], events)
        if args:
            events.append(CallArgs(self.num_calls - 1, args))
        return True

    def _start_call(self, name: str, events: list[Event]) -> None:
        self._pending_ws = ""  # whitespace between content and a call is markup, not content
        events.append(CallStart(self.num_calls, self.id_factory(), name))
        self.num_calls += 1

    def _reset_scanner(self) -> None:
        self._started = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._string_value = False
        self._scalar = False
        self._raw_value = ""

    def _step_args(self, events: list[Event]) -> bool:
        """Consume the arguments value char by char, tracking JSON nesting to find where it ends."""
        buf = self._buf
        out: list[str] = []
        i = 0
        done = False
        while i < len(buf):
            c = buf[i]
            if not self._started:
                if c in _WS:
                    i += 1
                    continue
                self._started = True
                if c == '"':
                    self._string_value = self._in_string = True
                elif c in "{[":
                    self._depth = 1
                else:
                    self._scalar = True
                    if self._at_end_tag(buf, i):
                        break
                out.append(c)
                i += 1
                continue
            if self._in_string:
                out.append(c)
                i += 1
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
                    if self._depth == 0:
                        done = True
                        break
                continue
            if self._scalar and (c in _WS or c in ",}"):
                done = True
                break
            if c == "<" and self._at_end_tag(buf, i):
                break
            out.append(c)
            i += 1
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    done = True
                    break
        fragment = "".join(out)
        self._buf = buf[i:]
        if self._string_value:
            self._raw_value += fragment  # decoded whole once it closes: the arguments are its content
            if done:
                self._finish_string_value(events)
        elif fragment:
            events.append(CallArgs(self.num_calls - 1, fragment))
        if done:
            self._mode = "tail"
            return True
        if self.fmt.end and self._buf.startswith(self.fmt.end):
            # the call ended before its arguments value did (truncated or malformed)
            self._buf = self._buf[len(self.fmt.end) :]
            self._mode = "text"
            return True
        return False

    def _at_end_tag(self, buf: str, i: int) -> bool:
        if not self.fmt.end:
            return False
        rest = buf[i:]
        return rest.startswith(self.fmt.end) or self.fmt.end.startswith(rest)

    def _finish_string_value(self, events: list[Event]) -> None:
        try:
            value = json.loads(self._raw_value)
        except json.JSONDecodeError:
            value = self._raw_value
        if value:
            events.append(
                CallArgs(self.num_calls - 1, value if isinstance(value, str) else json.dumps(value))
            )
        self._raw_value = ""

    def _step_tail(self, events: list[Event]) -> bool:
        # after the arguments value: the object's closing brace, whitespace, then the end tag (or,
        # in the list and bare forms, the separator before the next call or the list's end)
        if not self.fmt.end:
            return self._step_joined_tail()
        end = self._buf.find(self.fmt.end)
        if end >= 0:
            self._buf = self._buf[end + len(self.fmt.end) :]
            self._mode = "text"
            return True
        start = self._buf.find(self.fmt.start)
        if start >= 0:
            # a new call without closing the previous one
            self._buf = self._buf[start:]
            self._mode = "text"
            return True
        return False

    def _step_joined_tail(self) -> bool:
        if not self._obj_closed:
            close = self._buf.find("}")
            if close < 0:
                return False
            self._buf = self._buf[close + 1 :]
            self._obj_closed = True
        rest = self._buf.lstrip(_WS)
        if not rest:
            self._buf = ""
            return False  # the separator or the end is still to come
        self._obj_closed = False
        if self.fmt.sep and rest.startswith(self.fmt.sep):
            self._buf = rest[len(self.fmt.sep) :]
            self._mode = "header"
            return True
        if self.fmt.list_form and rest.startswith("]"):
            rest = rest[1:]
        self._buf = rest
        self._mode = "text"
        self._text_only = True  # whatever follows the calls is text
        return True


def parse_whole(
    text: str,
    enabled: bool = True,
    fmt: Dialect | ToolCallFormat = HERMES,
    id_factory: Callable[[], str] | None = None,
) -> tuple[str | None, list[ParsedCall]]:
    """Non-streaming: (content or None, calls) of a finished text, through the same parser."""
    parser = ToolCallParser(enabled, fmt, id_factory)
    return collect(parser.feed(text) + parser.finish())
