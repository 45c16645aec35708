"""The copy bias: a logits processor that helps a small model copy argument values it has read.

Most string arguments of a tool call are spans of the conversation: a city, a team, a domain, a
tracking number. A 135M model picks the right span but spells it wrong: "Celtics" ends as "Celtic",
"pounds" as "pound", "Honolulu" becomes "Hulabal", "meticulous" "insuccence". The grammar makes the
call valid JSON for its schema; it cannot make a value the one the user wrote.

While the model writes an argument's string value (CallCursor says when), the bias adds to the
logits of the tokens that would continue a span of the source texts (the request's user, tool
and system messages):
- inside a word: when what the value spells so far ends in the middle of a source word (its last
  words match the source at a word start, and the source word goes on), the tokens that go on
  spelling that word get `word` (strong: a value rarely stops inside a word it copies);
- at a word start: when the value is empty, or ends between words, the tokens that start a source
  word (or go on with the phrase the value has copied so far) get `start` (mild: the value may be
  written rather than copied).
The closing quote is never biased, so the model still decides where a value ends, and tokens the
grammar forbids stay forbidden (the mask is applied after this). Matching is exact, bytes for
bytes, case included.
"""

from __future__ import annotations

import re

import torch

from grammar.call_cursor import CallCursor
from grammar.dialects import Dialect
from grammar.per_object import PerObjectCache
from grammar.vocab import FORBIDDEN, TokenVocab

SPAN = 24  # bytes of a source span looked at past the match (longer than any one token)
MAX_SOURCE = 8192  # bytes of source text kept, the most recent
MAX_SPANS = 48  # source positions a step biases at most (the last ones: recent text first)
_OPEN = (b'"', b' "')  # what opens a string value before its first byte
MEMO = 256  # continuation sets kept per request
READS = 32  # sequences of one request read at once (Settings.max_n is 16)
MIN_WORD = 3  # bytes of a word copied so far before its rest gets the strong bias


# a byte of a word: ASCII letters and digits, and every byte of a multi-byte UTF-8 character
_WORD_BYTE = rb"[0-9A-Za-z\x80-\xff]"
_WORD_START = re.compile(rb"(?<!" + _WORD_BYTE + rb")" + _WORD_BYTE)
_IS_WORD = [re.fullmatch(_WORD_BYTE, bytes([b])) is not None for b in range(256)]


def _word(b: int) -> bool:
    return _IS_WORD[b]


def _word_run(text: bytes) -> int:
    """The length of the word `text` ends in (0 when it ends between words)."""
    n = 0
    while n < len(text) and _word(text[-1 - n]):
        n += 1
    return n


def _token_table(vocab: TokenVocab) -> dict[bytes, list[int]]:
    table: dict[bytes, list[int]] = {}
    for tid, b in enumerate(vocab.token_bytes):
        if b and b != FORBIDDEN and tid not in vocab.special_ids:
            table.setdefault(b, []).append(tid)
    return table


_tables: PerObjectCache[dict[bytes, list[int]]] = PerObjectCache()


def token_table(vocab: TokenVocab) -> dict[bytes, list[int]]:
    """Ordinary tokens by their bytes (built once per vocabulary)."""
    return _tables.get(vocab, (), lambda: _token_table(vocab))


class _Reading:
    """One sequence's reading of its output: the token ids consumed and the cursor after them."""

    __slots__ = ("ids", "cursor")

    def __init__(self, dialect: Dialect) -> None:
        self.ids: list[int] = []
        self.cursor = CallCursor(dialect)


class CopyBias:
    """runner.sampling_params logits processor: f(output ids, logits (vocab,)) -> logits."""

    def __init__(
        self, vocab: TokenVocab, dialect: Dialect, sources: list[str], word: float = 24.0, start: float = 2.0
    ) -> None:
        self.vocab = vocab
        self.dialect = dialect
        self.table = token_table(vocab)
        text = "\n".join(s for s in sources if s).encode("utf-8", "replace")
        self.source = text[-MAX_SOURCE:]
        self.starts = [m.start() for m in _WORD_START.finditer(self.source)]  # ascending
        self.word = word
        self.start = start
        self._reads: list[_Reading] = []  # one per sequence of the request (n > 1 shares the processor)
        # (value so far, before its opening quote) -> (ids, biases): values recur across steps and rows
        self._memo: dict[tuple[bytes, bool], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        cursor = self._cursor(output_ids)
        if not cursor.in_call:
            return logits
        value = cursor.argument_string()
        if value is not None:
            key = (value, False)
        elif cursor.expects_argument_value():
            key = (b"", True)
        else:
            return logits
        rows = self._memo.get(key)
        if rows is None:
            bias = self._continuations(key[0], _OPEN if key[1] else (b"",))
            ids = torch.tensor(list(bias), dtype=torch.long)
            rows = self._memo[key] = (ids, torch.tensor(list(bias.values()), dtype=torch.float32))
            if len(self._memo) > MEMO:
                del self._memo[next(iter(self._memo))]
        ids, add = rows
        if ids.numel():
            dev = logits.device
            logits.index_add_(0, ids.to(dev, non_blocking=True), add.to(dev, logits.dtype, non_blocking=True))
        return logits

    # -- reading the output once ------------------------------------------------------------------
    def _cursor(self, output_ids: list[int]) -> CallCursor:
        """The cursor after output_ids, fed only the tokens it has not seen."""
        read = None
        for r in self._reads:
            n = len(r.ids)
            longer = read is None or n > len(read.ids)
            if longer and n <= len(output_ids) and output_ids[:n] == r.ids:
                read = r
        if read is None:
            read = _Reading(self.dialect)
            self._reads.append(read)
            del self._reads[:-READS]
        token_bytes = self.vocab.token_bytes
        for tid in output_ids[len(read.ids) :]:
            read.cursor.feed(token_bytes[tid] if tid < len(token_bytes) else b"")
            read.ids.append(tid)
        return read.cursor

    # -- the spans to continue ----------------------------------------------------------------------
    def _continuations(self, value: bytes, opens: tuple[bytes, ...]) -> dict[int, float]:
        """token id -> bias for the tokens that continue `value` along a source span."""
        if b"\\" in value:
            return {}
        positions, matched = self._matches(value)
        if not positions:
            return {}
        src = self.source
        out: dict[int, float] = {}
        for pos in positions[-MAX_SPANS:]:
            rest = src[pos : pos + SPAN]
            cut = min((i for i, b in enumerate(rest) if b in b'"\\' or b < 0x20), default=len(rest))
            rest = rest[:cut]
            if not rest:
                continue
            if matched and _word(matched[-1]) and not _word(rest[0]):
                continue  # a whole word copied: the model decides whether the value goes on
            bias = self.word if _word_run(matched) >= MIN_WORD else self.start
            for head in opens:
                full = head + rest
                for k in range(len(head) + 1, len(full) + 1):
                    for tid in self.table.get(full[:k], ()):
                        if out.get(tid, 0.0) < bias:
                            out[tid] = bias
        return out

    def _matches(self, value: bytes) -> tuple[list[int], bytes]:
        """The source positions right after the longest tail of `value` that starts at a word start
        of both the value and the source, and that tail. When no non-empty tail matches and the
        value is empty or ends between words, every source word start, with an empty tail."""
        src = self.source
        for i in range(len(value) + 1):
            if i and _word(value[i - 1]):
                continue  # the tail must start at a word start of the value
            tail = value[i:]
            if not tail:
                return list(self.starts), b""
            if not _word(tail[0]):
                continue
            found = []
            at = src.find(tail)
            while at >= 0:
                if at == 0 or not _word(src[at - 1]):
                    found.append(at + len(tail))
                at = src.find(tail, at + 1)
            if found:
                return found, tail
        return [], b""
