"""Runs the model on a scheduled batch: builds the step's tensors, owns the paged KV pool
(sized from memory), returns the logits of the sequences that sample this step."""

from __future__ import annotations

import logging

import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.host import host_to_device
from engine.scheduler import ScheduledBatch
from engine.sequence import PENDING

log = logging.getLogger("chatloom.engine")


class ModelRunner:
    def __init__(self, model, config: EngineConfig, device: torch.device, dtype: torch.dtype) -> None:
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
        self.extend_graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            from engine.cuda_graphs import DecodeGraphs, ExtendGraphs, default_extend_sizes, default_sizes

            sizes = config.cuda_graph_sizes or default_sizes(config.max_num_seqs)
            max_blocks = -(-model.cos_sin.shape[0] // self.block_size)  # max_model_len in blocks
            self.graphs = DecodeGraphs(model, self.kv_caches, sizes, max_blocks, device)
            limit = min(config.prefill_graph_max_tokens, config.max_num_batched_tokens)
            extend = default_extend_sizes(limit)
            if extend:
                self.extend_graphs = ExtendGraphs(model, self.kv_caches, extend, max_blocks, device)
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

    def prepare(
        self, batch: ScheduledBatch, pending: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """The step's tensors, moved in one host-to-device copy per dtype."""
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
            if n == 1:
                positions.append(start)
                slots.append(table[start // bs] * bs + start % bs)
            else:
                positions.extend(range(start, start + n))
                slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            if start + n == seq.num_tokens:
                sample_rows.append(len(input_ids) - 1)

        up = _Upload()
        h_ids = up.add(input_ids, torch.int64)
        h_pos = up.add(positions, torch.int64)
        h_slots = up.add(slots, torch.int64)
        h_pend = up.add(pending_at + pending_rows, torch.int64)
        h_rows = up.add(sample_rows, torch.int64)
        dec, pre = batch.seqs[:nd], batch.seqs[nd:]
        dec_lens = [s.num_computed_tokens + 1 for s in dec]
        h_dec = (up.table(dec), up.add(dec_lens, torch.int32)) if dec else None
        h_pre = None
        q_lens = batch.num_new_tokens[nd:]
        if pre:
            cu = [0]
            for q in q_lens:
                cu.append(cu[-1] + q)
            pre_lens = [s.num_computed_tokens + q for s, q in zip(pre, q_lens, strict=True)]
            h_pre = (up.table(pre), up.add(cu, torch.int32), up.add(pre_lens, torch.int32))
        t = up.upload(self.device)
        meta = AttentionMetadata(
            slot_mapping=t[h_slots],
            num_decodes=nd,
            decode_block_tables=t[h_dec[0]] if h_dec else None,
            decode_seq_lens=t[h_dec[1]] if h_dec else None,
            decode_max_seq_len=max(dec_lens, default=0),
            prefill_block_tables=t[h_pre[0]] if h_pre else None,
            prefill_cu_seqlens_q=t[h_pre[1]] if h_pre else None,
            prefill_seq_lens=t[h_pre[2]] if h_pre else None,
            prefill_max_q=max(q_lens, default=0),
        )
        ids = t[h_ids]
        if pending_at:
            if pending is None:
                raise RuntimeError("a scheduled token is still in flight but no previous step was given")
            k = len(pending_at)
            ids[t[h_pend][:k]] = pending[t[h_pend][k:]]
        self.sample_rows = t[h_rows]  # (num_sampling,) rows of the hidden states to project
        return ids, t[h_pos], meta, sample_rows

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
        if (
            self.extend_graphs is not None
            and bs == 1
            and meta.num_decodes == 0
            and self.extend_graphs.padded_size(input_ids.shape[0]) is not None
        ):
            logits = self.extend_graphs.run(
                input_ids,
                positions,
                meta.slot_mapping,
                meta.prefill_block_tables,
                meta.prefill_cu_seqlens_q,
                meta.prefill_seq_lens,
            )
            return (logits, [0]) if sample_rows else (None, [])
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if not sample_rows:
            return None, []
        rows = self.sample_rows
        logits = self.model.compute_logits(hidden.index_select(0, rows))
        # which scheduled sequences sample: those whose last token was in this step
        sampling = [
            i
            for i, (s, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
            if s.num_computed_tokens + n == s.num_tokens
        ]
        return logits, sampling


class _Upload:
    """Collects a step's integer arrays; upload() moves them in one copy per dtype and returns views."""

    def __init__(self) -> None:
        self.data: dict[torch.dtype, list[int]] = {torch.int64: [], torch.int32: []}
        self.specs: list[tuple[torch.dtype, int, int, int]] = []  # dtype, offset, length, rows (0 = 1-D)

    def add(self, values: list[int], dtype: torch.dtype, rows: int = 0) -> int:
        buf = self.data[dtype]
        self.specs.append((dtype, len(buf), len(values), rows))
        buf.extend(values)
        return len(self.specs) - 1

    def table(self, seqs) -> int:
        # (num_seqs, max_blocks) int32 block tables, padded with block 0 (never read past seq_len)
        width = max(len(s.block_table) for s in seqs)
        flat: list[int] = []
        for s in seqs:
            flat.extend(s.block_table)
            flat.extend([0] * (width - len(s.block_table)))
        return self.add(flat, torch.int32, rows=len(seqs))

    def upload(self, device: torch.device) -> list[torch.Tensor]:
        moved = {dt: host_to_device(buf, dt, device) for dt, buf in self.data.items() if buf}
        out = []
        for dt, off, n, rows in self.specs:
            t = moved[dt][off : off + n] if n else torch.empty(0, dtype=dt, device=device)
            out.append(t.view(rows, -1) if rows else t)
        return out
