"""The engine-facing objects: a ConstraintFactory per request, a TokenConstraint per sequence.

A TokenConstraint pairs the backend's matcher (what the grammar allows) with a budget cursor (what
still fits in the remaining tokens); the row of the batch bitmask is their AND.
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import torch

from grammar.backend import CompiledGrammar, GrammarMatcher
from grammar.budget import BudgetAutomaton, BudgetCursor
from grammar.mask_cache import mask_cache
from grammar.vocab import TokenVocab


class GrammarConstraint:
    """engine.sampling_params.TokenConstraint over one grammar.

    With a mask cache (`grammar` set: the budget DFA is exact for it, see mask_cache.py) a row is
    copied from the cache when another request (or step) already computed it for the same DFA state;
    the matcher is then only needed on a miss, so accepted tokens wait in `pending` and the matcher
    takes them all at once before its next mask."""

    __slots__ = (
        "matcher", "cursor", "vocab", "words", "done", "restricted_steps", "fallbacks", "grammar", "pending",
        "_fill_masks", "_accept_many", "_is_error",
    )  # fmt: skip

    def __init__(
        self, matcher: GrammarMatcher, cursor: BudgetCursor, vocab: TokenVocab, grammar: object = None
    ):
        self.matcher = matcher
        self.cursor = cursor
        self.vocab = vocab
        self.words = vocab.mask_words
        self.done = False
        self.restricted_steps = 0  # steps where the budget narrowed the mask (for tests and stats)
        self.fallbacks = 0  # steps where budget and grammar masks did not intersect (see _narrow)
        self.grammar = grammar  # the compiled grammar whose rows are cached by DFA state; None: no cache
        self.pending: list[int] = []  # tokens the cursor took and the matcher not yet (cache only)
        # the matcher's optional methods, looked up once rather than every step (None: not offered)
        self._fill_masks = getattr(matcher, "fill_masks", None)  # batch fill of many rows
        self._accept_many = getattr(matcher, "accept_tokens", None)
        self._is_error = getattr(matcher, "is_error", None)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int, remaining_tokens: int) -> None:
        # bitmask: (batch, >= words) int32 on the CPU; words past our vocabulary stay disallowed
        line = bitmask[row]
        if line.shape[0] > self.words:
            line[self.words :] = 0
        own = line[: self.words]
        if not self._from_cache(own):
            self._sync()
            self.matcher.fill_mask(own)
            self._store(own)
        self._narrow(own, remaining_tokens)

    def mask_key(self, remaining_tokens: int) -> tuple[object, int] | None:
        """A key naming this step's row when it is the grammar's row for its DFA state, shared by
        every request in that state (the budget does not narrow it and the matcher has not failed);
        None when the row is this request's own. Equal keys mean equal rows: the key holds the
        grammar itself (hashed by identity), so no other grammar can take its id while it is kept."""
        if self.grammar is None or self.done or not self.cursor.unrestricted(remaining_tokens):
            return None
        if not self.pending and self._failed():
            return None
        return self._state_key()

    def _state_key(self) -> tuple[object, int] | None:
        # the grammar's row for this DFA state is shared by every request in it (see mask_cache.py)
        return (self.grammar, self.cursor.state) if self.grammar is not None else None

    @staticmethod
    def fill_bitmasks(bitmask: torch.Tensor, rows: list[tuple[GrammarConstraint, int, int]]) -> None:
        """fill_bitmask for many rows of one (batch, words) bitmask: cached rows are copied, each
        backend computes the others in one call where it can (llguidance: in parallel, without the
        GIL), then the budget narrows the rows that are near their limit."""
        batched: dict[object, list] = {}  # backend batch fill -> [(constraint, row)]
        first: dict[tuple[object, int], tuple] = {}  # (grammar, state) -> (constraint, row) computing it
        copies = []  # (constraint, row, source): misses whose state another row of this batch computes
        narrow = []  # (constraint, row view, remaining): _narrow leaves the unrestricted ones alone
        for c, row, remaining in rows:
            fill = c._fill_masks if bitmask.shape[1] == c.words else None
            if fill is None:
                c.fill_bitmask(bitmask, row, remaining)
                continue
            own = bitmask[row]
            if not c._from_cache(own):
                key = c._state_key()
                if key in first:
                    copies.append((c, row, first[key]))
                else:
                    if key is not None:
                        first[key] = (c, row)
                    c._sync()
                    batched.setdefault(fill, []).append((c, row))
            narrow.append((c, own, remaining))
        for fill, items in batched.items():
            fill(bitmask, [(c.matcher, row) for c, row in items])
            for c, row in items:
                c._store(bitmask[row])
        for c, row, (src, src_row) in copies:
            if src._failed():  # its row ends that request: compute this one on its own
                c._sync()
                c.matcher.fill_mask(bitmask[row])
            else:
                bitmask[row].copy_(bitmask[src_row])
        for c, own, remaining in narrow:
            c._narrow(own, remaining)

    def _from_cache(self, own: torch.Tensor) -> bool:
        if self.grammar is None:
            return False
        hit = mask_cache().get(self.grammar, self.cursor.state)
        if hit is None:
            return False
        np.copyto(own.numpy().view(np.uint32), hit)
        return True

    def _store(self, own: torch.Tensor) -> None:
        if self.grammar is not None and not self._failed():
            mask_cache().put(self.grammar, self.cursor.state, own.numpy().view(np.uint32))

    def _failed(self) -> bool:
        return self._is_error is not None and self._is_error()

    def _sync(self) -> None:
        # the matcher catches up with the cursor (one call for all waiting tokens where it can)
        if not self.pending:
            return
        tokens, self.pending = self.pending, []
        if self._accept_many is not None:
            self._accept_many(tokens)
            return
        for t in tokens:
            if not self.matcher.accept_token(t):
                return

    def accept_token(self, token_id: int) -> bool:
        if self.done:
            return False
        state = self.cursor.next_state(token_id)
        if self.grammar is None:
            if not self.matcher.accept_token(token_id):
                return False
        elif state == self.cursor.auto.n_states:
            return False  # outside the grammar (the exact DFA says so without the matcher)
        else:
            self.pending.append(token_id)
        self.cursor.advance_to(state)
        if token_id == self.vocab.eos_id:
            self.done = True
        return True

    def is_terminated(self) -> bool:
        return self.done

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        waiting = min(num_tokens, len(self.pending))
        if waiting:
            del self.pending[-waiting:]
        if num_tokens > waiting:
            self.matcher.rollback(num_tokens - waiting)
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
                # the backend allows only tokenizations the budget's shortest paths do not use
                # (llguidance keeps forced text canonical) or remaining < D: stay inside the grammar,
                # preferring the tokens that leave the least to do; never hit in tests
                self.fallbacks += 1
                own.copy_(grammar_row)
                self.cursor.restrict(own, 1 << 30, nearest=True)

    @property
    def min_tokens_left(self) -> int:
        """Tokens the shortest completion from here needs (EOS included)."""
        return self.cursor.dist


class GrammarConstraintFactory:
    """engine.sampling_params.ConstraintFactory: ready() once both compiles finished."""

    def __init__(self, budget: Future, grammar: Future, vocab: TokenVocab, exact: bool = False):
        self._budget = budget  # Future[BudgetAutomaton]
        self._grammar = grammar  # Future[CompiledGrammar]
        self.vocab = vocab
        self.exact = exact  # the budget DFA compiles the backend's own regex: masks are cached by its state

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
        grammar = self.grammar
        return GrammarConstraint(
            grammar.matcher(), self.budget.cursor(), self.vocab, grammar if self.exact else None
        )
