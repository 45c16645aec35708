"""Where a reply stands inside its tool calls, read byte by byte as the model writes it.

The copy bias (copying.py) needs one fact per step: is the next token part of an argument's string
value, and what has that value spelled so far? CallCursor answers it without parsing the reply
again each step: it is fed each new token's bytes once and keeps a small JSON position (a stack
of open objects and arrays, the current key of each object, and the string being written).

It follows the dialects of dialects.py: a call starts after the dialect's opening marker (as text,
or as the marker's single special token) or, for a dialect without one, at a `{` the reply opens
with; it ends when its outermost JSON value closes. It trusts the grammar for validity and only
tracks position: on bytes JSON would not allow it stays conservative (no string, no argument).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grammar.dialects import Dialect
from grammar.vocab import MARKER_BYTES

_SPACE = b" \t\r\n"


@dataclass
class _Frame:
    is_object: bool
    key: bytes | None = None  # an object's current key (None before its first one)
    want_key: bool = True  # an object expecting a key (after `{` or `,`) rather than a value
    filled: bool = False  # the current entry's value is written (until the next `,`)


@dataclass
class CallCursor:
    dialect: Dialect
    in_call: bool = False
    stack: list[_Frame] = field(default_factory=list)
    string: bytearray | None = None  # the string being written (None: not inside one)
    string_is_key: bool = False
    escaped: bool = False
    in_scalar: bool = False  # inside a number, true, false or null
    _tail: bytes = b""  # the last bytes outside calls (to see an opening marker split over tokens)
    _text_seen: bool = False  # something other than space was written outside calls

    def __post_init__(self) -> None:
        opener = self.dialect.open.strip()
        self._openers = [o for o in (opener.encode(), MARKER_BYTES.get(opener, b"")) if o]
        self._keep = max((len(o) for o in self._openers), default=1)

    # -- what copying.py asks ---------------------------------------------------------------------
    def in_arguments(self) -> bool:
        """Whether the value being written belongs to a call's arguments (some enclosing object's
        current key is the dialect's arguments key)."""
        key = self.dialect.args_key.encode()
        return self.in_call and any(f.is_object and f.key == key for f in self.stack[:-1])

    def argument_string(self) -> bytes | None:
        """The bytes of the argument string being written, or None when the next token does not
        continue one."""
        if self.string is None or self.string_is_key or not self.in_arguments():
            return None
        return bytes(self.string)

    def expects_argument_value(self) -> bool:
        """Whether the next token may open an argument's value (after `:` in an arguments object, or
        in an array inside one)."""
        if not self.in_call or self.string is not None or self.in_scalar or not self.stack:
            return False
        top = self.stack[-1]
        ready = not top.filled and (not top.is_object or (not top.want_key and top.key is not None))
        return ready and self.in_arguments()

    # -- feeding ----------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        for b in data:
            self._byte(b)

    def _byte(self, b: int) -> None:
        if not self.in_call:
            self._outside(b)
            return
        if self.string is not None:
            self._in_string(b)
            return
        if self.in_scalar:
            if bytes([b]) in b",]}" or bytes([b]) in _SPACE:
                self.in_scalar = False
                self._after_value(is_key=False)
                self._structural(b)
            return
        self._structural(b)

    def _outside(self, b: int) -> None:
        if self._openers:
            self._tail = (self._tail + bytes([b]))[-self._keep :]
            if any(self._tail.endswith(o) for o in self._openers):
                self.in_call, self.stack, self._tail = True, [], b""
            return
        # a dialect without a marker: a call is a reply that opens with `{` (or follows a separator)
        if b == ord("{") and not self._text_seen:
            self.in_call, self.stack = True, []
            self._structural(b)
        elif bytes([b]) not in _SPACE and b != ord(";"):
            self._text_seen = True

    def _in_string(self, b: int) -> None:
        if self.escaped:
            self.escaped = False
        elif b == ord("\\"):
            self.escaped = True
        elif b == ord('"'):
            done, self.string = bytes(self.string), None
            if self.string_is_key and self.stack:
                self.stack[-1].key = done
            self._after_value(is_key=self.string_is_key)
            return
        self.string.append(b)

    def _structural(self, b: int) -> None:
        c = bytes([b])
        top = self.stack[-1] if self.stack else None
        if c in _SPACE:
            return
        if c == b'"':
            self.string, self.escaped = bytearray(), False
            self.string_is_key = top is not None and top.is_object and top.want_key
        elif c in b"{[":
            self.stack.append(_Frame(is_object=c == b"{"))
        elif c in b"}]":
            if self.stack:
                self.stack.pop()
            self._after_value(is_key=False)
        elif c == b":":
            if top is not None and top.is_object:
                top.want_key = False
        elif c == b",":
            if top is not None:
                top.filled = False
                top.want_key = top.is_object
        else:
            self.in_scalar = True

    def _after_value(self, is_key: bool) -> None:
        if self.stack and not is_key:
            self.stack[-1].filled = True
        if not self.stack and not is_key:
            # the call's outermost value closed: wait for the next opening marker
            self.in_call, self._text_seen = False, False
