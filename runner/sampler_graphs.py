"""The fused sampler replayed from CUDA graphs: a decode step's sampling costs one graph launch
instead of a Triton launch, its argument checks and its allocations (~0.15 ms of host time on the
H200 host; for rows whose masks the host fills, that time sits between the forward and the tokens).

A graph is captured per static logits buffer (a decode graph's output, all its padded rows) and per
mask use, on first use. Its inputs live here: temperatures, each row's mask row, and the seed, on the
device; each replay samples with the seed and then increments it, so no step uploads a seed. The
tokens are the graph's static output: everything that reads them (the copy to the host, the next
forward's inputs) is queued before the graph is replayed again.
"""

from __future__ import annotations

import torch

from kernels import dispatch as ops


class SamplerGraphs:
    def __init__(self, max_rows: int, device: torch.device, seed: int) -> None:
        self.temps = torch.zeros(max_rows, dtype=torch.float32, device=device)
        # padded rows keep stale values: always -1 or a row of the mask table, so always safe to read
        self.mask_rows = torch.full((max_rows,), -1, dtype=torch.int32, device=device)
        self.seed = torch.tensor([seed & 0x7FFFFFFF], dtype=torch.int64, device=device)
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = None
        self._temps_src: torch.Tensor | None = None
        self.replays = 0

    def _run(self, logits: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
        size = logits.shape[0]
        rows = self.mask_rows[:size] if table is not None else None
        out = ops.sample_tokens(logits, self.temps[:size], self.seed, mask=table, mask_rows=rows)
        self.seed.add_(1)
        return out

    def _capture(self, logits: torch.Tensor, table: torch.Tensor | None):
        self._run(logits, table)  # compiles outside the capture (its draw is not used)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._run(logits, table)
        self._pool = graph.pool()
        return graph, out

    def sample(
        self,
        static_logits: torch.Tensor,  # (size, vocab): a decode graph's whole output buffer
        rows: int,  # the leading rows that are real
        temps: torch.Tensor,  # (rows,) float32 on the device, 0 = greedy
        table: torch.Tensor | None,  # the mask table, or None when no row is masked
        mask_rows: torch.Tensor | None,  # (rows,) int32 on the device
    ) -> torch.Tensor:  # (rows,) int64, a view of the graph's output
        if temps is not self._temps_src:  # a steady batch keeps its temperatures: no copy
            self.temps[:rows].copy_(temps)
            self._temps_src = temps
        if mask_rows is not None:
            self.mask_rows[:rows].copy_(mask_rows)
        key = (static_logits.data_ptr(), static_logits.shape[0], table.data_ptr() if table is not None else 0)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(static_logits, table)
        graph, out = entry
        graph.replay()
        self.replays += 1
        return out[:rows]
