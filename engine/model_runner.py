"""Runs the model on a scheduled batch: builds the step's tensors, owns the paged KV pool
(sized from memory), returns the logits of the sequences that sample this step."""

from __future__ import annotations

import logging

import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.scheduler import ScheduledBatch
from engine.sequence import PENDING

log = logging.getLogger("chatloom.engine")


class ModelRunner:
    def __init__(
        self, model, hf_config, config: EngineConfig, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.dtype = dtype
        self.block_size = config.block_size
        attn = model.layers[0].self_attn
        self.num_layers = len(model.layers)
        self.num_kv_heads = attn.num_kv_heads
        self.head_dim = attn.head_dim
        self.num_blocks = config.num_kv_blocks or self._blocks_from_memory()
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        # zeroed: attention may read (and mask) slots past a sequence's end inside its last block
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(self.num_layers)
        ]
        self.graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            from engine.cuda_graphs import DecodeGraphs, default_sizes

            sizes = config.cuda_graph_sizes or default_sizes(config.max_num_seqs)
            max_blocks = -(-model.cos_sin.shape[0] // self.block_size)  # max_model_len in blocks
            self.graphs = DecodeGraphs(model, self.kv_caches, sizes, max_blocks, device)
        log.info(
            "KV cache: %d blocks x %d tokens (%.1f MiB)",
            self.num_blocks,
            self.block_size,
            self.num_blocks * self.block_bytes / 2**20,
        )

    @property
    def block_bytes(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def _blocks_from_memory(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * self.config.gpu_memory_utilization) - (1 << 30)  # activations headroom
        else:
            budget = self.config.cpu_kv_cache_bytes
        blocks = budget // self.block_bytes
        if blocks < 1:
            raise ValueError("not enough memory for a single KV block; lower max_model_len or add memory")
        return int(blocks)

    def _tensor(self, data, dtype) -> torch.Tensor:
        return host_to_device(data, dtype, self.device)

    def prepare(
        self, batch: ScheduledBatch, pending: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        nd = batch.num_decodes
        pending_at: list[int] = []  # batch positions whose token is still on the device
        pending_rows: list[int] = []  # ... and its row in the previous step's sampled ids
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            if input_ids[-1] == PENDING:
                pending_at.append(len(input_ids) - 1)
                pending_rows.append(seq.pending_row)
            table = seq.block_table
            for p in range(start, start + n):
                positions.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            if start + n == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)

        def tables(seqs) -> torch.Tensor:
            width = max(len(s.block_table) for s in seqs)
            return self._tensor(
                [s.block_table + [0] * (width - len(s.block_table)) for s in seqs], torch.int32
            )

        dec, pre = batch.seqs[:nd], batch.seqs[nd:]
        dec_lens = [s.num_computed_tokens + 1 for s in dec]
        meta = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.int64),
            num_decodes=nd,
            decode_block_tables=tables(dec) if dec else None,
            decode_seq_lens=self._tensor(dec_lens, torch.int32) if dec else None,
            decode_max_seq_len=max(dec_lens, default=0),
            prefill_block_tables=None,
            prefill_cu_seqlens_q=None,
            prefill_seq_lens=None,
        )
        if pre:
            q_lens = batch.num_new_tokens[nd:]
            cu = [0]
            for q in q_lens:
                cu.append(cu[-1] + q)
            meta.prefill_block_tables = tables(pre)
            meta.prefill_cu_seqlens_q = self._tensor(cu, torch.int32)
            meta.prefill_seq_lens = self._tensor(
                [s.num_computed_tokens + q for s, q in zip(pre, q_lens, strict=True)], torch.int32
            )
            meta.prefill_max_q = max(q_lens)
        ids = self._tensor(input_ids, torch.int64)
        if pending_at:
            if pending is None:
                raise RuntimeError("a scheduled token is still in flight but no previous step was given")
            ids[self._tensor(pending_at, torch.int64)] = pending[self._tensor(pending_rows, torch.int64)]
        return ids, self._tensor(positions, torch.int64), meta, sample_rows

    @torch.inference_mode()
    def execute(
        self, batch: ScheduledBatch, pending: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, list[int]]:
        """Runs one step; returns (logits (num_sampling, vocab) float32, the batch indices that sample)."""
        input_ids, positions, meta, sample_rows = self.prepare(batch, pending)
        bs = len(batch.seqs)
        if (
            self.graphs is not None
            and meta.prefill_block_tables is None
            and self.graphs.padded_size(bs) is not None
        ):
            logits = self.graphs.run(
                input_ids, positions, meta.slot_mapping, meta.decode_block_tables, meta.decode_seq_lens
            )
            return logits, list(range(bs))
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if not sample_rows:
            return None, []
        rows = self._tensor(sample_rows, torch.int64)
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        # which scheduled sequences sample: those whose last token was in this step
        sampling = [
            i
            for i, (s, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
            if s.num_computed_tokens + n == s.num_tokens
        ]
        return logits, sampling


def host_to_device(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A python list as a tensor on device; on CUDA through pinned memory, so the copy is queued
    behind the running step instead of waiting for it (a pageable copy synchronizes the stream)."""
    t = torch.tensor(data, dtype=dtype)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)
