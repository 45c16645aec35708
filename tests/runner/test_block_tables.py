"""The runner's host copy of block tables always equals the sequences' own tables (zeros past their
end), through growth, preemption (a new table), finishing, row reuse and widening."""

from __future__ import annotations

import random

import numpy as np

from engine.block_manager import BlockManager
from runner.block_tables import BlockTables
from runner.sampling_params import SamplingParams
from runner.sequence import Sequence, SequenceStatus


def check(bt: BlockTables, seqs: list[Sequence]) -> None:
    rows, lens = bt.rows(seqs)
    assert len(set(rows.tolist())) == len(seqs)  # one row each
    for seq, row, n in zip(seqs, rows.tolist(), lens.tolist(), strict=True):
        assert n == len(seq.block_table)
        assert bt.table[row, :n].tolist() == seq.block_table
        assert not bt.table[row, n:].any()


def test_random_growth_preemption_and_reuse():
    rng = random.Random(0)
    bm = BlockManager(num_blocks=400, block_size=4)
    bt = BlockTables(rows=4, width=2)  # small: rows are reclaimed, then added; the width grows
    live: list[Sequence] = []
    for step in range(400):
        op = rng.random()
        if op < 0.15 and len(live) < 12:
            seq = Sequence(f"r{step}", [1] * rng.randint(1, 20), SamplingParams())
            if bm.allocate(seq, seq.num_tokens):
                seq.status = SequenceStatus.RUNNING
                live.append(seq)
        elif op < 0.25 and live:  # finished or preempted: its blocks go back, its table is new
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
            if rng.random() < 0.5:
                seq.status = SequenceStatus.FINISHED
            else:
                seq.status = SequenceStatus.WAITING
                if bm.allocate(seq, rng.randint(1, 30)):  # readmitted, maybe as many blocks as before
                    seq.status = SequenceStatus.RUNNING
                    live.append(seq)
        else:
            for seq in live:  # decodes: some cross into a new block
                grow = len(seq.block_table) * 4 + rng.choice([0, 0, 0, 1, 5])
                bm.allocate(seq, grow)
        batch = rng.sample(live, rng.randint(0, len(live))) if live else []
        check(bt, batch)
    assert bt.table.shape[1] > 2


def test_preempted_table_of_the_same_length_is_copied_again():
    bm = BlockManager(num_blocks=16, block_size=4)
    bt = BlockTables(rows=2)
    seq = Sequence("a", [1] * 8, SamplingParams())
    other = Sequence("b", [1] * 4, SamplingParams())
    for s in (seq, other):
        bm.allocate(s, s.num_tokens)
        s.status = SequenceStatus.RUNNING
    check(bt, [seq])
    old = list(seq.block_table)
    bm.free(seq)
    bm.free(other)
    bm.allocate(other, 8)  # takes the blocks seq had
    bm.allocate(seq, 8)  # same length, other blocks
    assert seq.block_table != old and len(seq.block_table) == len(old)
    check(bt, [seq, other])


def test_rows_are_int64_and_lengths_match():
    bm = BlockManager(num_blocks=8, block_size=4)
    bt = BlockTables(rows=2)
    seq = Sequence("a", [1] * 5, SamplingParams())
    bm.allocate(seq, 5)
    seq.status = SequenceStatus.RUNNING
    rows, lens = bt.rows([seq])
    assert rows.dtype == np.int64 and lens.tolist() == [2]
