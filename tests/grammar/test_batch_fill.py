"""GrammarConstraint.fill_bitmasks (the engine's one call per step for a batch of rows), with rows
shared through the mask cache, writes exactly the rows a matcher without the cache writes one by
one: llguidance's batch fill, the budget near the limit, backends without a batch fill, a bitmask
wider than the grammar's vocabulary, rollback, and matcher errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.grammar import g1_tools
from grammar.api import build_constraint
from grammar.constraint import GrammarConstraint
from grammar.mask_cache import mask_cache
from tests.grammar.driver import OPEN_ID, RandomLogits, allowed_ids


def _lockstep(tok, vocab, backend: str, width: int, rows: int = 12, steps: int = 60) -> int:
    """Drives `rows` requests twice in lockstep (batch fill vs row by row); returns rows narrowed."""
    tools = g1_tools()
    f = build_constraint(
        tok, tools=tools, tool_choice="required", max_tokens=512, vocab_size=vocab.vocab_size, backend=backend
    ).wait()
    # budgets from the shortest call up: the tight ones are narrowed by the budget from step one
    limits = [f.min_tokens + 3 * i for i in range(rows)]
    mask_cache().clear()
    batch = [f.new() for _ in range(rows)]
    assert batch[0].grammar is not None  # tool calls: the budget DFA is exact, rows are cached
    single = [GrammarConstraint(f.grammar.matcher(), f.budget.cursor(), f.vocab) for _ in range(rows)]
    logits = RandomLogits(vocab.vocab_size, seed=4)
    a = torch.empty(rows + 1, width, dtype=torch.int32)  # one row no request uses
    b = torch.empty(rows + 1, width, dtype=torch.int32)
    live = list(range(rows))
    for step in range(steps):
        live = [i for i in live if not batch[i].is_terminated() and step < limits[i]]
        if not live:
            break
        a.fill_(-1)
        b.fill_(-1)
        GrammarConstraint.fill_bitmasks(a, [(batch[i], i + 1, limits[i] - step) for i in live])
        for i in live:
            single[i].fill_bitmask(b, i + 1, limits[i] - step)
        assert torch.equal(a, b), f"step {step}"
        for i in live:
            ids = allowed_ids(a[i + 1], vocab.vocab_size)
            t = int(ids[int(np.argmax(logits.row(step, 97 * i)[ids]))])
            assert batch[i].accept_token(t) and single[i].accept_token(t)
    assert not live, "every request ends within its budget"
    assert mask_cache().hits > 0 and mask_cache().misses > 0
    return sum(c.restricted_steps for c in batch)


def test_llguidance_batch_equals_rows(tok, vocab):
    assert _lockstep(tok, vocab, "llguidance", vocab.mask_words) > 0


def test_lexers_filled_in_parallel(tok, vocab, monkeypatch):
    from grammar import llguidance_backend

    monkeypatch.setattr(llguidance_backend, "THREADS", 3)  # requests spread over 3 independent lexers
    _lockstep(tok, vocab, "llguidance", vocab.mask_words, rows=9)


def test_wider_bitmask_falls_back_to_rows(tok, vocab):
    _lockstep(tok, vocab, "llguidance", vocab.mask_words + 3, rows=4, steps=30)


def test_backend_without_batch_fill(tok, vocab):
    pytest.importorskip("xgrammar")
    _lockstep(tok, vocab, "xgrammar", vocab.mask_words, rows=4, steps=30)


def test_matcher_error_ends_with_eos(tok, vocab):
    tools = g1_tools()
    f = build_constraint(
        tok, tools=tools, tool_choice="required", max_tokens=512, vocab_size=vocab.vocab_size
    ).wait()
    mask_cache().clear()
    # bad and good in the same state: bad computes the row (first), fails, and good, which would
    # copy it, computes its own; failed rows are not cached
    bad, good = f.new(), f.new()
    assert not bad.matcher.m.consume_token(vocab.eos_id)  # EOS first: the matcher is in error
    m = torch.full((2, vocab.mask_words), -1, dtype=torch.int32)
    GrammarConstraint.fill_bitmasks(m, [(bad, 0, 512), (good, 1, 512)])
    assert allowed_ids(m[0], vocab.vocab_size).tolist() == [vocab.eos_id]
    assert allowed_ids(m[1], vocab.vocab_size).tolist() == [OPEN_ID]  # a required call opens first
    assert mask_cache().get(f.grammar, good.cursor.state) is None


def test_rollback_with_waiting_tokens(tok, vocab):
    tools = g1_tools()
    f = build_constraint(
        tok, tools=tools, tool_choice="required", max_tokens=512, vocab_size=vocab.vocab_size
    ).wait()
    path = tok.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        add_special_tokens=False,
    ).ids + [vocab.eos_id]
    c, ref = f.new(), GrammarConstraint(f.grammar.matcher(), f.budget.cursor(), f.vocab)

    def mask(x):
        m = torch.full((1, vocab.mask_words), -1, dtype=torch.int32)
        x.fill_bitmask(m, 0, 512)
        return m

    for t in path[:6]:
        assert c.accept_token(t) and ref.accept_token(t)
    assert torch.equal(mask(c), mask(ref))  # the matcher took the waiting tokens
    for t in path[6:9]:
        assert c.accept_token(t) and ref.accept_token(t)
    assert len(c.pending) == 3
    c.rollback(5)  # three waiting, two already in the matcher
    ref.rollback(5)
    assert torch.equal(mask(c), mask(ref)) and c.cursor.state == ref.cursor.state
    assert not c.accept_token(path[0])  # a second <tool_call> here is outside the grammar
    for t in path[4:]:
        assert c.accept_token(t)
    assert c.is_terminated() and not c.accept_token(path[0])


def test_slices_fit_our_strings():
    # llguidance's fast path inside strings needs slices over the very character class our JSON
    # strings use (a default slice that includes U+007F..U+009F never fits them)
    from grammar.llguidance_backend import _STRING_CHAR, SLICES
    from grammar.tools import grammar_spec

    spec = grammar_spec(g1_tools(), "required", True)
    assert _STRING_CHAR in spec.regex and any(s.startswith(_STRING_CHAR) for s in SLICES)
