"""xgrammar: regex -> EBNF -> pushdown automaton with a precomputed adaptive token mask cache.

Known bug (xgrammar 0.2.9, RAW and BYTE_LEVEL vocabularies alike): after `"key":` with optional
whitespace before a number, the mask allows the token " \xe0" (a space and the first byte of a
3-byte character) and accept_token then refuses it. Not the default backend; see docs/grammar.md.
"""

from __future__ import annotations

import torch
import xgrammar

from grammar.vocab import TokenVocab


class XGrammarMatcher:
    __slots__ = ("m",)

    def __init__(self, m: xgrammar.GrammarMatcher):
        self.m = m

    def accept_token(self, token_id: int) -> bool:
        return self.m.accept_token(token_id)

    def fill_mask(self, row: torch.Tensor) -> None:
        self.m.fill_next_token_bitmask(row.unsqueeze(0), 0)

    def rollback(self, num_tokens: int) -> None:
        self.m.rollback(num_tokens)


class XGrammarGrammar:
    def __init__(self, compiled: xgrammar.CompiledGrammar):
        self.compiled = compiled

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(xgrammar.GrammarMatcher(self.compiled))


class XGrammarBackend:
    name = "xgrammar"

    def __init__(self, vocab: TokenVocab):
        self.vocab = vocab
        tokens = list(vocab.token_bytes)
        tokens[vocab.eos_id] = b""  # the stop token: no text
        info = xgrammar.TokenizerInfo(
            tokens,
            xgrammar.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=[vocab.eos_id],
        )
        # our compiler caches by regex itself; one thread per compile (the pool gives parallelism)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, regex: str) -> XGrammarGrammar:
        try:
            return XGrammarGrammar(self.compiler.compile_regex(regex))
        except Exception as e:  # xgrammar raises RuntimeError on unsupported syntax
            raise ValueError(f"xgrammar cannot compile the grammar: {e}") from e
