"""Grammar compilation off the caller's thread, cached by grammar.

The key is the Lark grammar itself (hashed): a pure function of (tool set or schema, mode, dialect,
vocabulary), so equal requests share one compile, even while it is still running (the cache holds
futures). Both halves are bounded: llguidance by its limits (llguidance_backend.LIMITS), the budget by
a widened schema (schema_regex.budget_schema_regex)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from grammar.budget import BudgetAutomaton
from grammar.constraint import GrammarConstraintFactory
from grammar.llguidance_backend import LLGuidanceBackend
from grammar.per_object import PerObjectCache
from grammar.tools import GrammarSpec
from grammar.vocab import TokenVocab


class GrammarCompiler:
    def __init__(self, vocab: TokenVocab, max_workers: int = 2, max_entries: int = 64):
        self.vocab = vocab
        self.backend = LLGuidanceBackend(vocab)
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self.max_entries = max_entries
        self._cache: OrderedDict[str, tuple[Future, Future]] = OrderedDict()
        self._lock = threading.Lock()

    def submit(self, spec: GrammarSpec) -> GrammarConstraintFactory:
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                budget = self.pool.submit(BudgetAutomaton, spec.budget_regex, self.vocab)
                grammar = self.pool.submit(self.backend.compile, spec.lark)
                hit = (budget, grammar)
                self._cache[key] = hit
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        return GrammarConstraintFactory(hit[0], hit[1], self.vocab)


_compilers: PerObjectCache[GrammarCompiler] = PerObjectCache()


def compiler_for(vocab: TokenVocab) -> GrammarCompiler:
    """The process-wide compiler of a vocabulary."""
    return _compilers.get(vocab, (), lambda: GrammarCompiler(vocab))
