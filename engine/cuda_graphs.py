"""Decode steps captured in CUDA graphs, one per batch size of a ladder; a batch is padded up to the
next captured size (padding rows write no K/V and attend to nothing)."""

from __future__ import annotations

import logging

import torch

from engine.attention import AttentionMetadata

log = logging.getLogger("chatloom.engine")


def default_sizes(max_num_seqs: int) -> list[int]:
    ladder = [1, 2, 4, 8] + list(range(16, 257, 8))
    sizes = [s for s in ladder if s < max_num_seqs] + [max_num_seqs]
    return sorted(set(sizes))


class DecodeGraphs:
    def __init__(self, model, kv_caches, sizes: list[int], max_blocks: int, device: torch.device) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(sizes)
        self.max_bs = self.sizes[-1]
        n = self.max_bs
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros((n, max_blocks), dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture()

    def _forward(self, bs: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            num_decodes=bs,
            decode_block_tables=self.block_tables[:bs],
            decode_seq_lens=self.seq_lens[:bs],
            prefill_block_tables=None,
            prefill_cu_seqlens_q=None,
            prefill_seq_lens=None,
        )
        hidden = self.model(self.input_ids[:bs], self.positions[:bs], self.kv_caches, meta)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def _capture(self) -> None:
        from tqdm import tqdm

        pool = None
        for bs in tqdm(sorted(self.sizes, reverse=True), desc="capturing CUDA graphs", unit="graph"):
            self._forward(bs)  # compiles kernels and settles allocations outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[bs] = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def padded_size(self, bs: int) -> int | None:
        for s in self.sizes:
            if s >= bs:
                return s
        return None

    def run(
        self,
        input_ids: torch.Tensor,  # (bs,)
        positions: torch.Tensor,  # (bs,)
        slot_mapping: torch.Tensor,  # (bs,)
        block_tables: torch.Tensor,  # (bs, width) int32
        seq_lens: torch.Tensor,  # (bs,) int32
    ) -> torch.Tensor:  # (bs, vocab) float32 logits (a view of the graph's output)
        bs = input_ids.shape[0]
        size = self.padded_size(bs)
        assert size is not None
        self.input_ids[:bs].copy_(input_ids)
        self.positions[:bs].copy_(positions)
        self.slot_mapping[:bs].copy_(slot_mapping)
        self.block_tables[:bs, : block_tables.shape[1]].copy_(block_tables)
        self.seq_lens[:bs].copy_(seq_lens)
        if size > bs:
            self.slot_mapping[bs:size].fill_(-1)
            self.seq_lens[bs:size].fill_(0)
        self.graphs[size].replay()
        return self.logits[size][:bs]
