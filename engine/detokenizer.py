"""Incremental detokenization, UTF-8 safe, with stop strings cut exactly.

Text is decoded from a sliding window of tokens; a window whose text ends in an incomplete UTF-8
sequence (U+FFFD) waits for more tokens. Text that could still become the start of a stop string is
held back until it is known not to be one. With a Rust tokenizer the window runs inside it
(tokenizers' DecodeStream: the same rule, one call per token instead of two decodes from python)."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer,
        prompt_ids: list[int],
        stop: list[str],
        skip_special_tokens: bool,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        # the Rust tokenizer directly (several times faster per call) unless decoding post-processes text
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self._fast_decode = backend.decode
        else:
            self._fast_decode = tokenizer.decode
            backend = None
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = list(prompt_ids[-6:])  # a little context: decoding may depend on it
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # all output text decoded so far (may include a stop string, cut below)
        self.emitted = 0  # characters of self.text already handed out
        self._backend = backend
        self._stream = None
        # DecodeStream takes the context's text as its first window only when it ends in a whole
        # character; otherwise the python rule (which always does) runs
        if backend is not None and not self._decode(self.ids).endswith("\ufffd"):
            try:
                self._stream = DecodeStream(ids=list(self.ids), skip_special_tokens=skip_special_tokens)
            except TypeError:  # a tokenizers release without context ids
                self._stream = None

    def _decode(self, ids: list[int]) -> str:
        return self._fast_decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        if self._stream is not None:
            try:
                piece = self._stream.step(self._backend, token_id)
            except Exception:  # the window's text no longer starts with its prefix: the python rule
                self._stream = None
            else:
                if piece is not None:
                    self.text += piece
                    self.prefix_offset = self.read_offset
                    self.read_offset = len(self.ids)
                return
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)

    def find_stop(self, new_chars: int) -> str | None:
        """Looks for a stop string in the text added by the last add() calls (new_chars long);
        on a hit cuts the text at it and returns it."""
        if not self.stop:
            return None
        start = max(0, len(self.text) - new_chars - self.hold)
        best = None
        for s in self.stop:
            pos = self.text.find(s, start)
            if pos != -1 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is None:
            return None
        pos, s = best
        self.text = self.text[: pos + len(s)] if self.include_stop else self.text[:pos]
        return s

    def delta(self, finished: bool) -> str:
        """Text not yet handed out; while running, keeps back what may begin a stop string."""
        end = len(self.text) if finished or not self.stop else max(self.emitted, len(self.text) - self.hold)
        out = self.text[self.emitted : end]
        self.emitted = end
        return out

    def flush(self) -> None:
        """At the end, decode any bytes still waiting for completion (as replacement chars)."""
        self._stream = None
        rest = self._decode(self.ids[self.prefix_offset :])
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        if len(rest) > len(prefix):
            self.text += rest[len(prefix) :]
            self.prefix_offset = self.read_offset = len(self.ids)
