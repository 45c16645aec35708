"""BatchGraphs: steps with prefill chunks captured in CUDA graphs, one graph per token count of a ladder.

Run eagerly, such a step costs the host ~300 launches, more host time than the GPU needs for a short
step. Replayed, it costs one launch, and the
host prepares the next step while the GPU runs this one.

Any mix of sequences fits one graph. The decodes come first, one token each: the decode attention runs
over the first seqs(s) - 1 rows (a step holds one prefill chunk at least), those past its decodes with
length 0 (they attend to nothing; the prefill rows among them are written next). The prefill attention
launches one program per query tile of the prefill chunks, listed in a tile map built by the host
(ops.prefill_tile_map), so neither grid depends on the step. A step of n tokens replays the graph of
the smallest captured size s >= n; the padding tokens write no K/V and belong to no sequence.

Per size s the static inputs are the leading entries of two device buffers: int64 [ids | positions |
slots (s each) | sample rows (seqs(s)) | tokens in flight (2k)] and int32 [cu_seqlens (seqs(s) + 1) |
context lengths (seqs(s)) | decode lengths (seqs(s)) | tile map (2 x tiles(s)) | block-table rows,
every sequence's in token order]; the table rows are then copied into the graph's block table (one
copy, outside the graph)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from kernels import dispatch as ops
from models.attention import AttentionMetadata
from runner.cuda_graphs import capture_ladder, padded_size


def default_batch_sizes(limit: int) -> list[int]:
    """16, 32, 64, 128, then steps of 1.5x and 2x (192, 256, 384, ...) below limit, and limit."""
    sizes, s = [], 16
    while s < limit:
        sizes.append(s)
        if s >= 128 and s * 3 // 2 < limit:
            sizes.append(s * 3 // 2)
        s *= 2
    return sorted({*sizes, limit}) if limit > 0 else []


class BatchInputs(NamedTuple):
    """One step's inputs, already on the device (views of the static buffers)."""

    size: int  # the captured size it replays
    input_ids: torch.Tensor  # (num_tokens,) int64
    pending_at: torch.Tensor | None  # (2k,) rows of tokens in flight, then their rows in the last draw


class BatchGraphs:
    def __init__(
        self,
        model,
        kv_caches,
        sizes: list[int],
        max_seqs: int,
        max_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(sizes)
        self.max_seqs = max_seqs
        self.max_blocks = max_blocks
        self.max_len = max_blocks * block_size  # the longest context a block-table row holds
        self.query_tile = ops.prefill_query_tile(dtype, device)
        n, b = self.sizes[-1], self.seqs(self.sizes[-1])
        at64, at32 = self._layout(n)  # the largest graph's inputs hold every smaller one's
        self.inputs64 = torch.zeros(at64["pending"].start + 2 * b, dtype=torch.int64, device=device)
        self.inputs32 = torch.zeros(at32["tables"].start + b * max_blocks, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((b, max_blocks), dtype=torch.int32, device=device)
        vocab = model.logits_weight.shape[0]
        # every graph's logits land in this one buffer: outputs kept per graph would each hold their own
        # (rows x vocab) block of the shared pool
        self.logits = torch.zeros((b, vocab), dtype=model.logits_weight.dtype, device=device)
        self.replays = 0
        self.graphs = capture_ladder(self.sizes, self._forward, "capturing batch graphs", self._as_one_prompt)

    # ---- layout ---------------------------------------------------------------------------------
    def seqs(self, size: int) -> int:
        """Sequences a step of `size` tokens can hold (each has one token at least)."""
        return min(size, self.max_seqs)

    def tiles(self, size: int) -> int:
        """Query tiles a step of `size` tokens can need: each sequence starts a new one."""
        return -(-size // self.query_tile) + self.seqs(size)

    def padded_size(self, num_tokens: int) -> int | None:
        return padded_size(self.sizes, num_tokens)

    def _layout(self, size: int) -> tuple[dict[str, slice], dict[str, slice]]:
        """Where each static input of the graph of `size` lies: (int64 parts, int32 parts) in buffer
        order; "pending" and "tables" run from there to the end of what a step uploads."""
        b, t = self.seqs(size), self.tiles(size)
        i64 = {"ids": size, "pos": size, "slots": size, "rows": b, "pending": None}
        i32 = {"cu": b + 1, "lens": b, "dec_lens": b, "tiles": 2 * t, "tables": None}
        return _slices(i64), _slices(i32)

    def _views(self, size: int) -> dict[str, torch.Tensor]:
        at64, at32 = self._layout(size)
        views = {k: self.inputs64[s] for k, s in at64.items() if s.stop is not None}
        views.update({k: self.inputs32[s] for k, s in at32.items() if s.stop is not None})
        views["tiles"] = views["tiles"].view(2, -1)
        return views

    # ---- capture --------------------------------------------------------------------------------
    def _as_one_prompt(self, size: int) -> None:
        """A capture runs one fresh prompt that writes no K/V (slots -1): `size` tokens, or as many as a
        block-table row holds (the rest are padding)."""
        n = min(size, self.max_len)
        v = self._views(size)
        v["slots"].fill_(-1)
        v["cu"].fill_(n)
        v["cu"][0] = 0
        v["lens"].zero_()
        v["lens"][0] = n
        v["dec_lens"].zero_()
        tiles = ops.prefill_tile_map(np.array([n]), self.query_tile, v["tiles"].shape[1])
        v["tiles"].copy_(torch.from_numpy(tiles))
        v["rows"].zero_()

    def _forward(self, size: int) -> torch.Tensor:
        v, b = self._views(size), self.seqs(size)
        d = b - 1  # decode rows (a step has a prefill chunk); those past its decodes have length 0
        meta = AttentionMetadata(
            slot_mapping=v["slots"],
            num_decodes=d,
            decode_block_tables=self.block_tables[:d],
            decode_seq_lens=v["dec_lens"][:d],
            prefill_block_tables=self.block_tables[:b],
            prefill_cu_seqlens_q=v["cu"],
            prefill_seq_lens=v["lens"],
            prefill_max_q=size,
            prefill_tile_map=v["tiles"],
        )
        hidden = self.model(v["ids"], v["pos"], self.kv_caches, meta)
        self.logits[:b].copy_(self.model.compute_logits(hidden.index_select(0, v["rows"])))
        return self.logits[:b]

    # ---- a step ---------------------------------------------------------------------------------
    def load(
        self,
        staging,
        ids: np.ndarray,  # (n,) int64, tokens in flight as placeholders
        positions: np.ndarray,  # (n,) int64
        slots: np.ndarray,  # (n,) int64
        sample_rows: np.ndarray,  # (r,) int64 token rows whose logits are sampled
        pending: np.ndarray,  # (2k,) int64 rows of tokens in flight, then their rows in the last draw
        q_lens: np.ndarray,  # (b,) new tokens per sequence, in token order
        seq_lens: np.ndarray,  # (b,) context incl. the new tokens
        tables: np.ndarray,  # (b, width) int32 block-table rows
        num_decodes: int,  # the first sequences, one token each
    ) -> BatchInputs:
        """Moves a step's inputs into the static buffers of its size (one copy per dtype, queued)."""
        n, b = ids.size, q_lens.size
        size = self.padded_size(n)
        if size is None or b > self.seqs(size) or num_decodes >= b or tables.shape[1] > self.max_blocks:
            raise ValueError(f"a step of {n} tokens in {b} sequences does not fit the batch graphs")
        cap = self.seqs(size)
        at64, at32 = self._layout(size)
        head = np.zeros(at64["pending"].start, dtype=np.int64)  # ids | positions | slots | sample rows
        head[at64["slots"]] = -1  # padding tokens write no K/V
        for name, values in (("ids", ids), ("pos", positions), ("slots", slots), ("rows", sample_rows)):
            head[at64[name]][: values.size] = values
        cu = np.zeros(cap + 1, dtype=np.int32)
        np.cumsum(q_lens, out=cu[1 : b + 1])
        cu[b + 1 :] = cu[b]
        lens = np.zeros(cap, dtype=np.int32)
        lens[:b] = seq_lens
        dec_lens = np.zeros(cap, dtype=np.int32)
        dec_lens[:num_decodes] = seq_lens[:num_decodes]
        chunks = q_lens.copy()
        chunks[:num_decodes] = 0  # the decodes' rows are the decode attention's: no tiles
        tiles = ops.prefill_tile_map(chunks, self.query_tile, self.tiles(size))
        moved = staging.upload(
            {
                torch.int64: [head, pending.astype(np.int64, copy=False)],
                torch.int32: [
                    cu,
                    lens,
                    dec_lens,
                    tiles.reshape(-1),
                    tables.astype(np.int32, copy=False).reshape(-1),
                ],
            },
            into={torch.int64: self.inputs64, torch.int32: self.inputs32},
        )
        at = at32["tables"].start
        self.block_tables[:b, : tables.shape[1]].copy_(moved[torch.int32][at : at + tables.size].view(b, -1))
        at = at64["pending"].start
        pend = moved[torch.int64][at : at + pending.size] if pending.size else None
        return BatchInputs(size, self.inputs64[:n], pend)

    def run(self, size: int, rows: int) -> torch.Tensor:
        """Replays the graph of `size`; returns the logits of the first `rows` sample rows (model dtype,
        a view of the static output that the next replay overwrites)."""
        graph, logits = self.graphs[size]
        graph.replay()
        self.replays += 1
        return logits[:rows]


def _slices(lengths: dict[str, int | None]) -> dict[str, slice]:
    """Consecutive slices of these lengths from 0; a None length runs open-ended from there."""
    out, at = {}, 0
    for name, n in lengths.items():
        out[name] = slice(at, None if n is None else at + n)
        at += n or 0
    return out
