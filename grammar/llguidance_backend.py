"""llguidance: regex grammars through its lazy lexer; masks in Rust over the token trie."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

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

# An LLMatcher and its deep copies share one lexer (with its lazily built DFA) behind one lock, so
# masks of copies of one prototype are computed one at a time, whatever the threads: llguidance's
# LLExecutor over them was slower than a plain loop on the H200 host (16 cores: 23 vs 16 ms per step
# of 64 rows). With CHATLOOM_GRAMMAR_THREADS=n > 1 a grammar keeps n prototypes, each with its own
# lexer, spreads its requests over them, and a batch fills each lexer's rows in its own thread (the
# GIL is released while llguidance walks the vocabulary); each lexer then warms up on its own. Off
# by default until measured on a many-core host (on 2 cores it is slower: 6.1 vs 3.8 ms per step).
THREADS = max(1, int(os.environ.get("CHATLOOM_GRAMMAR_THREADS") or 1))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _fill_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(THREADS, thread_name_prefix="chatloom-mask")
        return _pool


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
    __slots__ = ("m", "eos_id", "lexer")

    def __init__(self, m: llguidance.LLMatcher, eos_id: int, lexer: object = None):
        self.m = m
        self.eos_id = eos_id
        self.lexer = lexer  # the prototype whose lexer this matcher shares

    def accept_token(self, token_id: int) -> bool:
        return self.m.consume_token(token_id)

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
        """fill_mask for many rows of one contiguous (batch, words) int32 CPU bitmask: the rows of
        each lexer in one thread, the lexers in parallel."""
        assert bitmask.is_contiguous() and bitmask.dtype == torch.int32 and bitmask.device.type == "cpu"
        base, stride = bitmask.data_ptr(), bitmask.shape[1] * 4
        by_lexer: dict[int, list] = {}
        for r, i in rows:
            by_lexer.setdefault(id(r.lexer), []).append((r.m, base + i * stride))

        def fill(group: list) -> None:
            for m, ptr in group:
                m.unsafe_compute_mask_ptr(ptr, stride)

        groups = list(by_lexer.values())
        if len(groups) > 1 and THREADS > 1:
            list(_fill_pool().map(fill, groups))
        else:
            for group in groups:
                fill(group)
        for r, i in rows:
            if r.m.is_error():
                r._end(bitmask[i])

    def _end(self, row: torch.Tensor) -> None:
        # llguidance never raises on grammar trouble (e.g. a step over its fuel limit): end the
        # sequence with EOS rather than sample from an empty or stale row
        log.error("llguidance matcher error, ending the sequence: %s", self.m.get_error())
        row.zero_()
        row[self.eos_id // 32] = _bit(self.eos_id % 32)

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)


class LLGuidanceGrammar:
    def __init__(self, first: llguidance.LLMatcher, make: object, eos_id: int):
        self._make = make  # () -> a fresh LLMatcher with its own lexer, never advanced
        self.prototypes = [first]  # up to THREADS; each request gets a deep copy of one
        self.eos_id = eos_id
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def matcher(self) -> LLGuidanceMatcher:
        i = next(self._turn) % THREADS
        with self._lock:
            while len(self.prototypes) <= i:
                self.prototypes.append(self._make())  # a few ms: the grammar is compiled again
            proto = self.prototypes[i]
        return LLGuidanceMatcher(proto.deep_copy(), self.eos_id, proto)


class LLGuidanceBackend:
    name = "llguidance"

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        wrapper = llguidance.TokenizerWrapper(_TokenTable(vocab))
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=vocab.vocab_size, slices=SLICES)

    def compile(self, regex: str) -> LLGuidanceGrammar:
        grammar = llguidance.LLMatcher.grammar_from_regex(regex)

        def make() -> llguidance.LLMatcher:
            return llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=_LIMITS)

        m = make()
        if m.is_error():
            raise ValueError(f"llguidance cannot compile the grammar: {m.get_error()}")
        return LLGuidanceGrammar(m, make, self.vocab.eos_id)
