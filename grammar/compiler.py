"""Grammar compilation off the caller's thread, cached by (grammar, backend).

The key is the regex itself (hashed): it is a pure function of (tool set or schema, mode), so equal
requests share one compile, even while it is still running (the cache holds futures).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from grammar.backend import DEFAULT_BACKEND, get_backend
from grammar.budget import BudgetAutomaton
from grammar.constraint import GrammarConstraintFactory
from grammar.per_object import PerObjectCache
from grammar.tools import GrammarSpec
from grammar.vocab import TokenVocab


class GrammarCompiler:
    def __init__(
        self, vocab: TokenVocab, backend: str = DEFAULT_BACKEND, max_workers: int = 2, max_entries: int = 64
    ):
        self.vocab = vocab
        self.backend = get_backend(backend, vocab)
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
                grammar = self.pool.submit(self.backend.compile, spec.regex)
                hit = (budget, grammar)
                self._cache[key] = hit
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        exact = spec.regex == spec.budget_regex
        return GrammarConstraintFactory(hit[0], hit[1], self.vocab, exact)


_compilers: PerObjectCache[GrammarCompiler] = PerObjectCache()


def compiler_for(vocab: TokenVocab, backend: str | None = None) -> GrammarCompiler:
    """The process-wide compiler of a vocabulary and backend (CHATLOOM_GRAMMAR_BACKEND or the default)."""
    backend = backend or os.environ.get("CHATLOOM_GRAMMAR_BACKEND") or DEFAULT_BACKEND
    return _compilers.get(vocab, (backend,), lambda: GrammarCompiler(vocab, backend))
