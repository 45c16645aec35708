"""Incremental detokenization, UTF-8 safe, with stop strings cut exactly.

The text handed out, delta by delta, is exactly tokenizer.decode(output ids) for every vocabulary
kind (byte-level BPE, tiktoken-style, SentencePiece with byte fallback). Text is decoded from a
sliding window of output tokens; a window whose text ends in an incomplete UTF-8 sequence (U+FFFD)
waits for more tokens. The prompt is no context: SentencePiece's decoder drops the leading space of
the first piece ("▁It" -> "It"), as decode(output ids) does, and a character the prompt left
incomplete stays U+FFFD as it does there. SentencePiece byte fallback decodes a run of `<0xNN>`
tokens all or nothing (any invalid byte turns the whole run into U+FFFDs), so a run's text waits
until a token that is not a byte ends it. Text that could still become the start of a stop string
is held back until it is known not to be one. With a Rust byte-level tokenizer the window runs
inside it (tokenizers' DecodeStream: the same rule, one call per token instead of two decodes).
Not exact: a tokenizer with clean_up_tokenization_spaces (decode rewrites " ." as "." afterwards)
is decoded window by window through tokenizer.decode, so such a rewrite across two windows is missed."""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

# id(backend) -> (backend, ids of the <0xNN> byte tokens, ids of special added tokens), for
# tokenizers whose decoder has ByteFallback; the backend is kept so that an id is never reused
_BYTE_FALLBACK: dict[int, tuple[object, frozenset[int], frozenset[int]]] = {}


def _byte_fallback_ids(backend) -> tuple[frozenset[int], frozenset[int]] | None:
    """(byte token ids, special token ids) when the decoder joins <0xNN> runs (ByteFallback)."""
    if backend is None or "ByteFallback" not in str(backend.decoder):
        return None
    cached = _BYTE_FALLBACK.get(id(backend))
    if cached is None or cached[0] is not backend:
        byte_ids = {backend.token_to_id(f"<0x{b:02X}>") for b in range(256)} - {None}
        special = {i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
        cached = _BYTE_FALLBACK[id(backend)] = (backend, frozenset(byte_ids), frozenset(special))
    return cached[1], cached[2]


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
        del prompt_ids  # no context: the output's text is decode(output ids) (see the module doc)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all output text decoded so far (may include a stop string, cut below)
        self.emitted = 0  # characters of self.text already handed out
        self._backend = backend
        fallback = _byte_fallback_ids(getattr(tokenizer, "backend_tokenizer", None))
        self._byte_ids, self._special_ids = fallback or (frozenset(), frozenset())
        self._run_open = False  # the last token that decodes to anything is a <0xNN> byte token
        # DecodeStream's window would hand out a byte run before it is known to be valid
        self._stream = (
            DecodeStream(skip_special_tokens=skip_special_tokens)
            if backend is not None and not fallback
            else None
        )

    def _decode(self, ids: list[int]) -> str:
        return self._fast_decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> None:
        self.ids.append(token_id)
        if self._byte_ids:
            if token_id in self._byte_ids:
                self._run_open = True
            elif not (self.skip_special_tokens and token_id in self._special_ids):
                self._run_open = False  # a skipped special token neither ends nor extends a run
            if self._run_open:
                return
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
