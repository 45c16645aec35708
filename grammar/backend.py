"""GrammarBackend: compile a regex into a cacheable grammar; per request, a small matcher.

Every backend sees the same token table (vocab.py) and the same regex (tools.py), so they accept
the same language; they differ in compile time and mask time (docs/grammar.md).
"""

from __future__ import annotations

from typing import Protocol

import torch

from grammar.per_object import PerObjectCache
from grammar.vocab import TokenVocab


class GrammarMatcher(Protocol):
    """Per-request state: one position in the grammar."""

    def accept_token(self, token_id: int) -> bool: ...

    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the allowed next tokens into row ((words,) int32, contiguous, CPU; bit set = allowed)."""

    def rollback(self, num_tokens: int) -> None: ...


class CompiledGrammar(Protocol):
    """Immutable result of compiling one regex; shared by every request that uses it."""

    def matcher(self) -> GrammarMatcher: ...


class GrammarBackend(Protocol):
    name: str

    def compile(self, regex: str) -> CompiledGrammar: ...


BACKENDS = ("llguidance", "xgrammar", "outlines")
DEFAULT_BACKEND = "llguidance"  # chosen by measurement: docs/grammar.md

_instances: PerObjectCache[GrammarBackend] = PerObjectCache()


def get_backend(name: str, vocab: TokenVocab) -> GrammarBackend:
    """One backend instance per (name, vocabulary): tokenizer tables are built once."""
    return _instances.get(vocab, (name,), lambda: _new_backend(name, vocab))


def _new_backend(name: str, vocab: TokenVocab) -> GrammarBackend:
    if name == "llguidance":
        from grammar.llguidance_backend import LLGuidanceBackend as cls
    elif name == "xgrammar":
        from grammar.xgrammar_backend import XGrammarBackend as cls
    elif name == "outlines":
        from grammar.outlines_backend import OutlinesBackend as cls
    else:
        raise ValueError(f"unknown grammar backend {name!r}; known: {BACKENDS}")
    return cls(vocab)
