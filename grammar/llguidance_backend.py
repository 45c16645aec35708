"""llguidance: regex grammars through its lazy lexer; masks in Rust over the token trie."""

from __future__ import annotations

import logging

import llguidance
import torch

from grammar.budget import _bit
from grammar.schema_regex import TEXT_CHAR
from grammar.vocab import FORBIDDEN, RESERVED, TAG_CLOSE, TAG_OPEN, TokenVocab

log = logging.getLogger("chatloom.grammar")
# the whole call is one lexeme (a big regex): give the lexer room (defaults: 1M / 200k fuel) so a
# mask over a 150k vocabulary inside a long string never runs out mid-step
_LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=20_000_000, step_lexer_fuel=5_000_000, max_lexer_states=1_000_000
)

# llguidance's mask shortcut ("slices"): token sets precomputed per regex and added whole wherever
# the grammar allows any string of that regex. Its default slices (JSON string characters) include
# U+007F..U+009F, which the JSON string class of our regexes (outlines') excludes: they never fit, and
# every step inside a string walked the whole vocabulary (G1 on the CPU: mean 745 -> ~190 us per
# mask). Ours: that class at several lengths (a bounded string fits a slice only up to what it has
# left), unbounded, and free text.
_STRING_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'
SLICES = [f"{_STRING_CHAR}{{1,{n}}}" for n in (2, 5, 10, 20, 40)] + [f"{_STRING_CHAR}+", f"{TEXT_CHAR}+"]


class _TokenTable:
    # what llguidance.TokenizerWrapper reads: token bytes, eos, an encoder
    def __init__(self, vocab: TokenVocab):
        # a 0xff prefix marks a special token, which no regex grammar ever allows
        tokens = [b"\xff[forbidden]" if b == FORBIDDEN else b for b in vocab.token_bytes]
        tokens[vocab.eos_id] = b"\xff<|im_end|>"
        tokens += [b"\xff[pad]"] * (vocab.vocab_size - len(tokens))  # embedding rows past the tokenizer
        self.tokens = tokens
        self.eos_token_id = vocab.eos_id
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(tokens) if b.startswith(b"\xff")]
        self._encode = vocab.encode
        self._tags = {tag[0]: vocab.token_bytes.index(tag) for tag in (TAG_OPEN, TAG_CLOSE)}

    def __call__(self, text: bytes | str) -> list[int]:
        # llguidance learns which token spells each byte from this: the tag bytes must map to the tag
        # tokens, not to the real (forbidden) control-byte tokens
        if isinstance(text, str):
            text = text.encode()
        out: list[int] = []
        piece = bytearray()
        for b in text:
            if b in (TAG_OPEN[0], TAG_CLOSE[0]):
                out += self._encode(piece.decode("utf-8", errors="replace")) if piece else []
                piece.clear()
                out.append(self._tags[b])
            elif b not in RESERVED:
                piece.append(b)
        out += self._encode(piece.decode("utf-8", errors="replace")) if piece else []
        return out


class LLGuidanceMatcher:
    __slots__ = ("m", "eos_id")

    def __init__(self, m: llguidance.LLMatcher, eos_id: int):
        self.m = m
        self.eos_id = eos_id

    def accept_token(self, token_id: int) -> bool:
        return self.m.consume_token(token_id)

    def fill_mask(self, row: torch.Tensor) -> None:
        self.m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if self.m.is_error():
            # llguidance never raises on grammar trouble (e.g. a step over its fuel limit): end the
            # sequence with EOS rather than sample from an empty or stale row
            log.error("llguidance matcher error, ending the sequence: %s", self.m.get_error())
            row.zero_()
            row[self.eos_id // 32] = _bit(self.eos_id % 32)

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)

    def is_finished(self) -> bool:
        return self.m.is_stopped()


class LLGuidanceGrammar:
    def __init__(self, prototype: llguidance.LLMatcher, eos_id: int):
        self.prototype = prototype  # never advanced; each request gets a deep copy
        self.eos_id = eos_id

    def matcher(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self.prototype.deep_copy(), self.eos_id)


class LLGuidanceBackend:
    name = "llguidance"

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        wrapper = llguidance.TokenizerWrapper(_TokenTable(vocab))
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=vocab.vocab_size, slices=SLICES)

    def compile(self, regex: str) -> LLGuidanceGrammar:
        grammar = llguidance.LLMatcher.grammar_from_regex(regex)
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=_LIMITS)
        if m.is_error():
            raise ValueError(f"llguidance cannot compile the grammar: {m.get_error()}")
        return LLGuidanceGrammar(m, self.vocab.eos_id)
