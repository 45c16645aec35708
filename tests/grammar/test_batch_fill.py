"""GrammarConstraint.fill_bitmasks (the engine's one call per step for a batch of rows) writes exactly
the rows that fill_bitmask writes one by one: llguidance's batch fill, the budget near the limit, a
bitmask wider than the grammar's vocabulary, rollback, and matcher errors."""

from __future__ import annotations

import numpy as np
import torch

from bench.grammar import g1_tools
from grammar.api import build_constraint
from grammar.constraint import GrammarConstraint
from tests.grammar.driver import OPEN_ID, RandomLogits, allowed_ids


def _lockstep(tok, vocab, width: int, rows: int = 12, steps: int = 60) -> int:
    """Drives `rows` requests twice in lockstep (batch fill vs row by row); returns rows narrowed."""
    tools = g1_tools()
    f = build_constraint(
        tok, tools=tools, tool_choice="required", max_tokens=512, vocab_size=vocab.vocab_size
    ).wait()
    # budgets from the shortest call up: the tight ones are narrowed by the budget from step one
    limits = [f.min_tokens + 3 * i for i in range(rows)]
    batch = [f.new() for _ in range(rows)]
    single = [f.new() for _ in range(rows)]
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
    return sum(c.restricted_steps for c in batch)


def test_llguidance_batch_equals_rows(tok, vocab):
    assert _lockstep(tok, vocab, vocab.mask_words) > 0


def test_wider_bitmask_falls_back_to_rows(tok, vocab):
    _lockstep(tok, vocab, vocab.mask_words + 3, rows=4, steps=30)


def test_matcher_error_ends_with_eos(tok, vocab):
    f = build_constraint(
        tok, tools=g1_tools(), tool_choice="required", max_tokens=512, vocab_size=vocab.vocab_size
    ).wait()
    bad, good = f.new(), f.new()
    assert not bad.matcher.m.consume_token(vocab.eos_id)  # EOS first: the matcher is in error
    m = torch.full((2, vocab.mask_words), -1, dtype=torch.int32)
    GrammarConstraint.fill_bitmasks(m, [(bad, 0, 512), (good, 1, 512)])
    assert allowed_ids(m[0], vocab.vocab_size).tolist() == [vocab.eos_id]
    assert allowed_ids(m[1], vocab.vocab_size).tolist() == [OPEN_ID]  # a required call opens first


def test_rollback_restores_matcher_and_budget(tok, vocab):
    f = build_constraint(
        tok, tools=g1_tools(), tool_choice="required", max_tokens=512, vocab_size=vocab.vocab_size
    ).wait()
    path = tok.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Oslo"}}\n</tool_call>',
        add_special_tokens=False,
    ).ids + [vocab.eos_id]
    c, ref = f.new(), f.new()

    def mask(x):
        m = torch.full((1, vocab.mask_words), -1, dtype=torch.int32)
        x.fill_bitmask(m, 0, 512)
        return m

    for t in path[:9]:
        assert c.accept_token(t)
    for t in path[:4]:
        assert ref.accept_token(t)
    c.rollback(5)
    assert torch.equal(mask(c), mask(ref)) and c.cursor.state == ref.cursor.state
    assert not c.accept_token(path[0])  # a second <tool_call> here is outside the grammar
    for t in path[4:]:
        assert c.accept_token(t)
    assert c.is_terminated() and not c.accept_token(path[0])


def test_slices_fit_our_strings():
    # llguidance's fast path inside strings needs slices over its JSON string character class (a
    # slice that admits characters the strings exclude never fits them)
    from grammar.llguidance_backend import _STRING_CHAR, SLICES

    assert any(s.startswith(_STRING_CHAR) for s in SLICES)
