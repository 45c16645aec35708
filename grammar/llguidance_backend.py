"""llguidance: the one grammar library. Lark grammars (tools.py) over the tokenizer as llguidance's
own adapter reads it (vocab.py); masks computed in Rust over the token trie.

Compiles are bounded by llguidance's limits (lexer states, grammar size, fuel per mask): a hostile
schema fails its own request with an error instead of growing without end."""

from __future__ import annotations

import logging

import llguidance
import torch

from grammar.budget import _bit
from grammar.vocab import TEXT_CHAR, TokenVocab

log = logging.getLogger("chatloom.grammar")
# fuel: lexer work per mask; a mask over a 150k vocabulary inside a long string must not run out
# mid-step (defaults 1M / 200k), while a pathological grammar still stops within ~a second
LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=20_000_000,
    step_lexer_fuel=5_000_000,
    max_lexer_states=250_000,
    max_grammar_size=2_000_000,
)

# llguidance's mask shortcut ("slices"): token sets precomputed per regex and added whole wherever
# the grammar allows any string of that regex. JSON string characters (llguidance's string class
# excludes controls and U+007F..U+009F) at several lengths (a bounded string fits a slice only up to
# what it has left), unbounded, and free text.
_STRING_CHAR = r'[^"\\\x00-\x1F\x7F-\x9F]'
SLICES = [f"{_STRING_CHAR}{{1,{n}}}" for n in (2, 5, 10, 20, 40)] + [f"{_STRING_CHAR}+", f"{TEXT_CHAR}+"]


class LLGuidanceMatcher:
    __slots__ = ("m", "eos_id")

    def __init__(self, m: llguidance.LLMatcher, eos_id: int):
        self.m = m
        self.eos_id = eos_id

    def accept_token(self, token_id: int) -> bool:
        """Take a token the grammar allows; False (and no change) for one it does not."""
        if token_id == self.eos_id:  # try_consume_tokens never takes EOS
            return self.m.is_accepting() and self.m.consume_token(token_id)
        return self.m.try_consume_tokens([token_id]) == 1

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar allows alone from here, in its canonical tokenization."""
        return self.m.compute_ff_tokens()

    def accept_tokens(self, token_ids: list[int]) -> bool:
        return self.m.consume_tokens(token_ids)

    def is_error(self) -> bool:
        return self.m.is_error()

    def fill_mask(self, row: torch.Tensor) -> None:
        self.m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if self.m.is_error():
            self._end(row)

    @staticmethod
    def fill_masks(bitmask: torch.Tensor, rows: list[tuple[LLGuidanceMatcher, int]]) -> None:
        """fill_mask for many rows of one contiguous (batch, words) int32 CPU bitmask, row by row (each
        call outside the GIL). Not on llguidance's LLExecutor: matchers deep-copied from one prototype
        computed one at a time there too (CPU time equal to wall time on 2 and 16 cores), and the pool's
        hand-offs cost more than they saved (docs/performance.md, 2026-12-07 session 10)."""
        assert bitmask.is_contiguous() and bitmask.dtype == torch.int32 and bitmask.device.type == "cpu"
        base, stride = bitmask.data_ptr(), bitmask.shape[1] * 4
        for r, i in rows:
            r.m.unsafe_compute_mask_ptr(base + i * stride, stride)
            if r.m.is_error():
                r._end(bitmask[i])

    def _end(self, row: torch.Tensor) -> None:
        # llguidance never raises on grammar trouble (e.g. a step over its fuel limit): end the
        # sequence with EOS rather than sample from an empty or stale row
        log.error("grammar matcher error, ending the sequence: %s", self.m.get_error())
        row.zero_()
        row[self.eos_id // 32] = _bit(self.eos_id % 32)

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)


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
        self.tokenizer = vocab.ll_tokenizer

    def compile(self, lark: str) -> LLGuidanceGrammar:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=LIMITS)
        if m.is_error():
            raise ValueError(f"llguidance cannot compile the grammar: {m.get_error()}")
        return LLGuidanceGrammar(m, self.vocab.eos_id)
