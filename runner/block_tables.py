"""A host copy of the running sequences' block tables, one row each, kept across steps: a step
copies only the blocks a sequence gained since the last one and gathers its rows with numpy,
instead of flattening every table into a python list. No torch.

Contract with the block manager: a block table only grows by appending; freeing a sequence gives it
a new (empty) table and sets its table_row to -1, so the row that copied the old one is not used."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from runner.sequence import SequenceStatus

if TYPE_CHECKING:
    from runner.sequence import Sequence


class BlockTables:
    def __init__(self, rows: int, width: int = 64) -> None:
        self.table = np.zeros((rows, width), dtype=np.int32)  # (rows, width) block ids, 0 past the end
        self.lens = np.zeros(rows, dtype=np.int64)  # (rows,) blocks copied into each row
        self.owner: list[Sequence | None] = [None] * rows
        self.free_rows = list(range(rows - 1, -1, -1))

    def rows(self, seqs: list[Sequence]) -> tuple[np.ndarray, np.ndarray]:
        """(len(seqs),) int64 rows holding the sequences' current tables, and their lengths in blocks."""
        rows = np.array([s.table_row for s in seqs], dtype=np.int64)
        lens = np.array([len(s.block_table) for s in seqs], dtype=np.int64)
        stale = (rows < 0) | (self.lens[rows] != lens)
        if not stale.any():
            return rows, lens
        if int(lens.max()) > self.table.shape[1]:
            self._widen(int(lens.max()))
        # the common change: one block appended since the last step (a decode crossed into it)
        grew = np.flatnonzero(stale & (rows >= 0) & (self.lens[rows] + 1 == lens))
        if grew.size:
            self.table[rows[grew], lens[grew] - 1] = [seqs[i].block_table[-1] for i in grew.tolist()]
            self.lens[rows[grew]] = lens[grew]
            stale[grew] = False
        for i in np.flatnonzero(stale).tolist():
            rows[i] = self._sync(seqs[i])
        return rows, lens

    def _sync(self, seq: Sequence) -> int:
        row = seq.table_row
        if row < 0:
            row = seq.table_row = self._take_row()
            self.owner[row] = seq
        blocks = seq.block_table
        have, n = int(self.lens[row]), len(blocks)
        if n < have:  # not expected (tables only grow), but never serve stale blocks
            self.table[row] = 0
            have = 0
        self.table[row, have:n] = blocks[have:n]
        self.lens[row] = n
        return row

    def _widen(self, blocks: int) -> None:
        grown = np.zeros((self.table.shape[0], max(blocks, 2 * self.table.shape[1])), dtype=np.int32)
        grown[:, : self.table.shape[1]] = self.table
        self.table = grown

    def _take_row(self) -> int:
        if not self.free_rows:
            self._reclaim()
        if not self.free_rows:
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.lens = np.concatenate([self.lens, np.zeros_like(self.lens)])
            self.owner += [None] * old
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        return self.free_rows.pop()

    def _reclaim(self) -> None:
        """Free the rows of sequences that stopped running or whose table was replaced."""
        for row, seq in enumerate(self.owner):
            if seq is None or (seq.table_row == row and seq.status is SequenceStatus.RUNNING):
                continue
            if seq.table_row == row:
                seq.table_row = -1
            self.owner[row] = None
            self.table[row] = 0  # past a table's end a row reads 0, as a fresh one does
            self.lens[row] = 0
            self.free_rows.append(row)
