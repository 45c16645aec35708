"""The engine-facing objects: a ConstraintFactory per request, a TokenConstraint per sequence."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import torch

from grammar.budget import MARGIN, BudgetAutomaton, BudgetCursor
from grammar.llguidance_backend import LLGuidanceGrammar, LLGuidanceMatcher
from grammar.vocab import TokenVocab


class GrammarConstraint:
    """runner.sampling_params.TokenConstraint over one grammar: llguidance's matcher says what the
    grammar allows, the budget cursor what still fits in the remaining tokens; a row is their AND."""

    __slots__ = ("matcher", "cursor", "vocab", "words", "done", "restricted_steps")

    def __init__(self, matcher: LLGuidanceMatcher, cursor: BudgetCursor, vocab: TokenVocab):
        self.matcher = matcher
        self.cursor = cursor
        self.vocab = vocab
        self.words = vocab.mask_words
        self.done = False
        self.restricted_steps = 0  # steps where the budget narrowed the mask (for tests and stats)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, remaining_tokens: int) -> None:
        # bitmask: (batch, >= words) int32 on the CPU; words past our vocabulary stay disallowed
        line = bitmask[row]
        if line.shape[0] > self.words:
            line[self.words :] = 0
        own = line[: self.words]
        self.matcher.fill_mask(own)
        self._narrow(own, remaining_tokens)

    def mask_key(self, remaining_tokens: int) -> None:
        """Rows are each request's own (llguidance's state is not shared between requests)."""
        return None

    @staticmethod
    def fill_bitmasks(bitmask: torch.Tensor, rows: list[tuple[GrammarConstraint, int, int]]) -> None:
        """fill_bitmask for many rows of one (batch, words) bitmask: the matchers fill their rows in
        one call, then the budget narrows the rows that are near their limit."""
        width = bitmask.shape[1]
        full = []
        for item in rows:
            if item[0].words == width:
                full.append(item)
            else:
                item[0].fill_bitmask(bitmask, item[1], item[2])
        if not full:
            return
        LLGuidanceMatcher.fill_masks(bitmask, [(c.matcher, row) for c, row, _ in full])
        GrammarConstraint.narrow_rows(bitmask, full)

    @staticmethod
    def narrow_rows(bitmask: torch.Tensor, rows: list[tuple[GrammarConstraint, int, int]]) -> None:
        """AND the budget into the grammar rows of a (batch, words) int32 CPU bitmask, as _narrow
        does row by row: rows far from their limit are not touched; the others take their budget
        rows (cached per budget state) in one numpy AND."""
        tight = []  # (constraint, row, budget row)
        for c, row, remaining in rows:
            slack = c.cursor.slack(remaining)
            if slack is not None:
                tight.append((c, row, c.cursor.auto.allowed(c.cursor.state, slack)))
        if not tight:
            return
        words = bitmask.numpy().view(np.uint32)  # (batch, words), the tensor's memory
        idx = np.fromiter((row for _, row, _ in tight), dtype=np.int64, count=len(tight))
        grammar_rows = words[idx]  # (tight, words) copy
        narrowed = grammar_rows & np.stack([allowed[: words.shape[1]] for _, _, allowed in tight])
        words[idx] = narrowed
        empty = ~narrowed.any(axis=1)
        for k, (c, row, _) in enumerate(tight):
            c.restricted_steps += 1
            if empty[k]:
                c._fallback(bitmask[row], torch.from_numpy(grammar_rows[k].view(np.int32)))

    def accept_token(self, token_id: int) -> bool:
        if self.done or not self.matcher.accept_token(token_id):
            return False
        self.cursor.advance(token_id)
        if token_id == self.vocab.eos_id:
            self.done = True
        return True

    def is_terminated(self) -> bool:
        return self.done

    def forced_tokens(self) -> list[int]:
        """What the grammar forces next (a tool call's keys and punctuation): speculation proposes it."""
        return [] if self.done else self.matcher.forced_tokens()

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        self.matcher.rollback(num_tokens)
        self.cursor.rollback(num_tokens)
        self.done = False

    def _narrow(self, own: torch.Tensor, remaining_tokens: int) -> None:
        # own: (words,) the grammar's row; AND the budget into it
        if self.cursor.unrestricted(remaining_tokens):
            return
        grammar_row = own.clone()
        if self.cursor.restrict(own, remaining_tokens):
            self.restricted_steps += 1
            if not bool(own.any()):
                self._fallback(own, grammar_row)

    def _fallback(self, own: torch.Tensor, grammar_row: torch.Tensor) -> None:
        # the backend allows only tokenizations the budget's shortest paths do not use (llguidance
        # keeps forced text canonical) or remaining < D: stay inside the grammar, preferring the
        # tokens that leave the least to do; never hit in tests
        own.copy_(grammar_row)
        self.cursor.restrict(own, 1 << 30, nearest=True)

    @property
    def min_tokens_left(self) -> int:
        """Tokens the budget keeps for the shortest completion from here (EOS and margin included)."""
        return self.cursor.dist + MARGIN


class GrammarConstraintFactory:
    """runner.sampling_params.ConstraintFactory: ready() once both compiles finished."""

    def __init__(self, budget: Future, grammar: Future, vocab: TokenVocab):
        self._budget = budget  # Future[BudgetAutomaton]
        self._grammar = grammar  # Future[LLGuidanceGrammar]
        self.vocab = vocab

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
    def grammar(self) -> LLGuidanceGrammar:
        return self._grammar.result()

    def new(self) -> GrammarConstraint:
        # raises the compile error, if any, to the engine (the request fails, others go on)
        return GrammarConstraint(self.grammar.matcher(), self.budget.cursor(), self.vocab)
