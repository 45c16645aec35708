"""The engine-facing objects: a ConstraintFactory per request, a TokenConstraint per sequence.

A TokenConstraint pairs the backend's matcher (what the grammar allows) with a budget cursor (what
still fits in the remaining tokens); the row of the batch bitmask is their AND.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from grammar.backend import CompiledGrammar, GrammarMatcher
from grammar.budget import BudgetAutomaton, BudgetCursor
from grammar.vocab import TokenVocab


class GrammarConstraint:
    """engine.sampling_params.TokenConstraint over one grammar."""

    __slots__ = ("matcher", "cursor", "vocab", "words", "done", "restricted_steps", "fallbacks")

    def __init__(self, matcher: GrammarMatcher, cursor: BudgetCursor, vocab: TokenVocab):
        self.matcher = matcher
        self.cursor = cursor
        self.vocab = vocab
        self.words = vocab.mask_words
        self.done = False
        self.restricted_steps = 0  # steps where the budget narrowed the mask (for tests and stats)
        self.fallbacks = 0  # steps where budget and grammar masks did not intersect (see fill_bitmask)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, remaining_tokens: int) -> None:
        # bitmask: (batch, >= words) int32 on the CPU; words past our vocabulary stay disallowed
        line = bitmask[row]
        own = line[: self.words]
        if line.shape[0] > self.words:
            line[self.words :] = 0
        self.matcher.fill_mask(own)
        if self.cursor.unrestricted(remaining_tokens):
            return
        grammar_row = own.clone()
        if self.cursor.restrict(own, remaining_tokens):
            self.restricted_steps += 1
            if not bool(own.any()):
                # the backend allows only tokenizations the budget's shortest paths do not use
                # (llguidance keeps forced text canonical) or remaining < D: stay inside the grammar,
                # preferring the tokens that leave the least to do; never hit in tests
                self.fallbacks += 1
                own.copy_(grammar_row)
                self.cursor.restrict(own, 1 << 30, nearest=True)

    def accept_token(self, token_id: int) -> bool:
        if self.done or not self.matcher.accept_token(token_id):
            return False
        self.cursor.advance(token_id)
        if token_id == self.vocab.eos_id:
            self.done = True
        return True

    def is_terminated(self) -> bool:
        return self.done

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        self.matcher.rollback(num_tokens)
        self.cursor.rollback(num_tokens)
        self.done = False

    @property
    def min_tokens_left(self) -> int:
        """Tokens the shortest completion from here needs (EOS included)."""
        return self.cursor.dist


class GrammarConstraintFactory:
    """engine.sampling_params.ConstraintFactory: ready() once both compiles finished."""

    def __init__(self, budget: Future, grammar: Future, vocab: TokenVocab, mode: str):
        self._budget = budget  # Future[BudgetAutomaton]
        self._grammar = grammar  # Future[CompiledGrammar]
        self.vocab = vocab
        self.mode = mode

    def ready(self) -> bool:
        return self._budget.done() and self._grammar.done()

    def wait(self, timeout: float | None = None) -> GrammarConstraintFactory:
        self._budget.result(timeout)
        self._grammar.result(timeout)
        return self

    @property
    def min_tokens(self) -> int:
        """Tokens of the shortest valid output (EOS included); blocks until the budget is compiled."""
        return self.budget.min_tokens

    @property
    def budget(self) -> BudgetAutomaton:
        return self._budget.result()

    @property
    def grammar(self) -> CompiledGrammar:
        return self._grammar.result()

    def new(self) -> GrammarConstraint:
        # raises the compile error, if any, to the engine (the request fails, others go on)
        return GrammarConstraint(self.grammar.matcher(), self.budget.cursor(), self.vocab)
