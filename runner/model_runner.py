"""Runs the model on a scheduled batch: builds the step's tensors, owns the paged KV pool
(sized from memory), returns the logits of the sequences that sample this step.

Over 400 lines on purpose: the step's inputs, the KV pool they index and the graphs that replay
them share one set of buffers and one layout; the graph capture itself lives in cuda_graphs.py and
batch_graphs.py."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from models.attention import AttentionMetadata
from runner.batch import ScheduledBatch
from runner.block_tables import BlockTables
from runner.host import Staging
from runner.sequence import PENDING

if TYPE_CHECKING:  # annotations only: the runner imports nothing from engine/ at run time
    from engine.config import EngineConfig

log = logging.getLogger("chatloom.engine")

_NONE = np.zeros(0, dtype=np.int64)


class _Decodes(NamedTuple):
    """A decode-only step's columns, what a graph step is written from."""

    ids: np.ndarray  # (nd,) int64: the decodes' tokens (PENDING where still on the device)
    pos: np.ndarray  # (nd,) int64
    slots: np.ndarray  # (nd,) int64
    pend_at: np.ndarray  # (k,) batch positions of the tokens in flight
    pend_rows: np.ndarray  # (k,) their rows in the previous step's sampled ids
    tables: np.ndarray  # (nd, width) int32


class ModelRunner:
    _tables: BlockTables | None = None  # created by the first prepare
    _staging: Staging | None = None
    graphs = None  # cuda_graphs.DecodeGraphs on CUDA unless eager
    batch_graphs = None  # batch_graphs.BatchGraphs: steps with prefill chunks
    cpu_step = None  # cpu_step.CpuDecodeStep: compiled CPU decode steps (EngineConfig.cpu_compile)

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
        self.batch_graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            from runner.batch_graphs import BatchGraphs, default_batch_sizes
            from runner.cuda_graphs import DecodeGraphs, ExtendGraphs, default_extend_sizes, default_sizes

            sizes = config.cuda_graph_sizes or default_sizes(config.max_num_seqs)
            max_blocks = -(-model.max_positions // self.block_size)  # max_model_len in blocks
            # step graphs end in kernels.lm_head_sample, which applies the final norm as an RMSNorm
            fused_head = getattr(model, "rms_final_norm", True)
            # the step graphs' own stream of draws
            seed = config.seed + 1 if config.sampler_graphs and fused_head else None
            self.graphs = DecodeGraphs(
                model, self.kv_caches, sizes, max_blocks, device, seed, config.max_num_seqs
            )
            limit = min(config.prefill_graph_max_tokens, config.max_num_batched_tokens)
            extend = default_extend_sizes(limit)
            if extend:
                self.extend_graphs = ExtendGraphs(model, self.kv_caches, extend, max_blocks, device)
            limit = min(config.batch_graph_max_tokens, config.max_num_batched_tokens)
            batch_sizes = default_batch_sizes(limit)
            if batch_sizes:
                self.batch_graphs = BatchGraphs(
                    model,
                    self.kv_caches,
                    batch_sizes,
                    config.max_num_seqs,
                    max_blocks,
                    self.block_size,
                    device,
                    dtype,
                )
        self.cpu_step = self._cpu_step(model) if self.device.type == "cpu" else None
        log.info(
            "KV cache: %d blocks x %d tokens (%.1f MiB)",
            self.num_blocks,
            self.block_size,
            self.num_blocks * self.block_bytes / 2**20,
        )

    def _cpu_step(self, model):
        """runner.cpu_step.CpuDecodeStep where EngineConfig.cpu_compile asks for it and the model fits."""
        if self.config.cpu_compile is False or (
            self.config.cpu_compile is None and self.config.quantization == "none"
        ):
            return None
        from runner.cpu_step import CpuDecodeStep

        why = CpuDecodeStep.supports(model)
        if why is not None:
            if self.config.cpu_compile:
                log.warning("cpu_compile: decode steps stay eager (%s)", why)
            return None
        return CpuDecodeStep(model, self.kv_caches)

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
        self,
        batch: ScheduledBatch,
        pending: torch.Tensor | None = None,
        defer_pending: bool = False,
        mapped: bool = False,
    ) -> StepInputs:
        """The step's tensors, moved in one host-to-device copy per dtype. Decodes (one token each,
        the last of their sequence) are built a column at a time with numpy; block tables come from
        a host copy that only learns the blocks gained since the last step. Tokens still in flight
        come from `pending` (the previous step's sampled ids on the device); with defer_pending they
        are filled in later by `run` (the previous step's sampling is not launched yet). mapped: a step
        for a step graph, which reads its inputs from pinned memory (cuda_graphs.DecodeGraphs)."""
        if self._staging is None:
            self._tables = BlockTables(2 * self.config.max_num_seqs)
            self._staging = Staging(self.device)
        bs = self.block_size
        seqs, nd = batch.seqs, batch.num_decodes
        rows, num_blocks = self._tables.rows(seqs)  # (num_seqs,) each
        table = self._tables.table
        dec, pre = seqs[:nd], seqs[nd:]
        q_lens = batch.num_new_tokens[nd:]

        # decodes: (nd,) each
        d_pos = np.array([s.num_computed_tokens for s in dec], dtype=np.int64)
        d_ids = np.array([s.token_ids[-1] for s in dec], dtype=np.int64)  # the one uncomputed token
        d_slots = table[rows[:nd], d_pos // bs].astype(np.int64) * bs + d_pos % bs
        pend_at = np.flatnonzero(d_ids == PENDING)  # batch positions whose token is still on the device
        pend_rows = np.array([dec[i].pending_row for i in pend_at.tolist()], dtype=np.int64)
        if self._decode_graph_takes(len(seqs), bool(pre)):
            tables = table[rows, : int(num_blocks.max())]  # (nd, width)
            dec_cols = _Decodes(d_ids, d_pos, d_slots, pend_at, pend_rows, tables)
            if mapped:
                return self._prepare_mapped_step(dec_cols, pending)
            return self._prepare_graph_step(dec_cols, pending, defer_pending)
        sample_rows = list(range(nd))  # rows of the step's tokens whose logits are sampled
        sampling = list(range(nd))  # ... and the batch positions of their sequences

        # prefill chunks: (num_prefill_tokens,) each
        p_ids: list[int] = []
        p_pos = p_slots = _NONE
        p_pend_at: list[int] = []
        p_pend_rows: list[int] = []
        spec_rows: list[int] = []  # rows of chunks ending in proposals: all logits after sample_rows'
        if pre:
            p_start: list[int] = []
            for i, (seq, n) in enumerate(zip(pre, q_lens, strict=True)):
                start = seq.num_computed_tokens
                p_start.append(start)
                spec = seq.spec_tokens
                p_ids.extend(seq.token_ids[start : start + n - len(spec)])
                p_ids.extend(spec)
                at = nd + len(p_ids) - 1
                if p_ids[-1] == PENDING:
                    p_pend_at.append(at)
                    p_pend_rows.append(seq.pending_row)
                if spec:
                    spec_rows.extend(range(at - len(spec), at + 1))
                elif start + n == len(seq.token_ids):
                    sample_rows.append(at)
                    sampling.append(nd + i)
            sample_rows += spec_rows
            q = np.array(q_lens, dtype=np.int64)
            cu = np.zeros(len(pre) + 1, dtype=np.int64)  # (num_prefills + 1,)
            np.cumsum(q, out=cu[1:])
            pre_start = np.array(p_start, dtype=np.int64)
            p_pos = np.arange(cu[-1], dtype=np.int64) + np.repeat(pre_start - cu[:-1], q)
            p_slots = table[np.repeat(rows[nd:], q), p_pos // bs].astype(np.int64) * bs + p_pos % bs

        # the step's tokens, decodes first: (num_tokens,) each
        ids = np.concatenate([d_ids, np.array(p_ids, dtype=np.int64)])
        pos, slots = np.concatenate([d_pos, p_pos]), np.concatenate([d_slots, p_slots])
        k = pend_at.size + len(p_pend_at)
        # (2k,) the pending batch positions, then their rows in the previous step's sampled ids
        pend = np.concatenate(
            [pend_at, np.array(p_pend_at, np.int64), pend_rows, np.array(p_pend_rows, np.int64)]
        )
        if pre and self._batch_graph_takes(len(seqs), ids.size, len(sample_rows), bool(spec_rows)):
            g = self.batch_graphs.load(
                self._staging, ids, pos, slots, np.array(sample_rows, dtype=np.int64), pend,
                np.concatenate([np.ones(nd, dtype=np.int64), q]), np.concatenate([d_pos + 1, pre_start + q]),
                table[rows, : int(num_blocks.max())], nd,
            )  # fmt: skip
            step = StepInputs(
                g.input_ids,
                None,
                None,
                None,
                sampling,
                g.pending_at,
                batch_size=g.size,
                spec_rows=len(spec_rows),
            )
            if k and not defer_pending:
                _fill_pending(step, pending)
            return step

        up = _Upload()
        h_ids = up.add(ids, torch.int64)
        h_pos = up.add(pos, torch.int64)
        h_slots = up.add(slots, torch.int64)
        h_pend = up.add(pend, torch.int64)
        h_rows = up.add(np.array(sample_rows, dtype=np.int64) if pre else np.arange(nd), torch.int64)
        dec_max = 0
        h_dec = h_pre = None
        if nd:
            width = int(num_blocks[:nd].max())
            dec_max = int(d_pos.max()) + 1
            h_dec = (up.add(table[rows[:nd], :width], torch.int32, rows=nd), up.add(d_pos + 1, torch.int32))
        if pre:
            width = int(num_blocks[nd:].max())
            h_pre = (
                up.add(table[rows[nd:], :width], torch.int32, rows=len(pre)),
                up.add(cu, torch.int32),
                up.add(pre_start + q, torch.int32),
            )
        t = up.upload(self._staging)
        meta = AttentionMetadata(
            slot_mapping=t[h_slots],
            num_decodes=nd,
            decode_block_tables=t[h_dec[0]] if h_dec else None,
            decode_seq_lens=t[h_dec[1]] if h_dec else None,
            decode_max_seq_len=dec_max,
            prefill_block_tables=t[h_pre[0]] if h_pre else None,
            prefill_cu_seqlens_q=t[h_pre[1]] if h_pre else None,
            prefill_seq_lens=t[h_pre[2]] if h_pre else None,
            prefill_max_q=max(q_lens, default=0),
        )
        in_flight = t[h_pend] if k else None
        step = StepInputs(t[h_ids], t[h_pos], meta, t[h_rows], sampling, in_flight, spec_rows=len(spec_rows))
        if k and not defer_pending:
            _fill_pending(step, pending)
        return step

    def _batch_graph_takes(self, num_seqs: int, num_tokens: int, num_rows: int, verifies: bool) -> bool:
        """Whether a step with prefill chunks replays a batch graph: within its ladder, its sampled and
        verified rows within the graph's, and not a lone chunk that an extend graph takes (those split
        long cached contexts over programs; they return one row, so a chunk of proposals stays here)."""
        g = self.batch_graphs
        size = None if g is None else g.padded_size(num_tokens)
        if size is None or num_rows > g.seqs(size):
            return False
        extend = self.extend_graphs
        lone = num_seqs == 1 and extend is not None and extend.padded_size(num_tokens) is not None
        return verifies or not lone

    def _decode_graph_takes(self, num_seqs: int, has_prefill: bool) -> bool:
        """Whether a step of num_seqs sequences replays a captured decode graph: decode-only, within
        the ladder."""
        return (
            self.graphs is not None
            and not has_prefill
            and num_seqs > 0
            and self.graphs.padded_size(num_seqs) is not None
        )

    def _prepare_graph_step(
        self, d: _Decodes, pending: torch.Tensor | None, defer_pending: bool
    ) -> StepInputs:
        """A decode-only step that a captured graph runs: its inputs go straight into the graph's static
        buffers (cuda_graphs.DecodeGraphs), one copy per dtype, the padding rows up to the largest size
        with slot -1 and length 0. The graph's first launch copies the block-table rows into its table
        and the tokens in flight from the graph's `tokens` into the ids (the previous draw put there by
        _take_pending, or by `run` with defer_pending)."""
        g, (ids, pos, slots, pend_at, pend_rows, tables) = self.graphs, d
        n, nd = g.sizes[-1], ids.size
        head = np.zeros(3 * n + 4, dtype=np.int64)  # ids | positions | slots | k, rows, width, 0
        head[:nd], head[n : n + nd], head[2 * n : 3 * n] = ids, pos, -1
        head[2 * n : 2 * n + nd] = slots
        head[3 * n : 3 * n + 3] = (pend_at.size, nd, tables.shape[1])
        lens = np.zeros(n, dtype=np.int32)
        lens[:nd] = pos + 1
        up = _Upload()
        up.add(np.concatenate([head, pend_at, pend_rows]), torch.int64)
        h32 = up.add(np.concatenate([lens, tables.reshape(-1)]), torch.int32)
        t = up.upload(self._staging, into={torch.int64: g.inputs64, torch.int32: g.inputs32})
        if pend_at.size and not defer_pending:
            self._take_pending(pending)
        return self._graph_step(pos, t[h32][n:].view(nd, -1))

    def _prepare_mapped_step(self, d: _Decodes, pending: torch.Tensor | None) -> StepInputs:
        """A decode step that a step graph reading pinned memory runs: written straight into the graph's
        next input row (DecodeGraphs.mapped_inputs), which its first launch moves into the static inputs;
        an id in flight is marked with its row in the previous draw, read from the graph's `tokens`. No
        copy to the device."""
        g, (ids, pos, slots, pend_at, pend_rows, tables) = self.graphs, d
        n, nd = g.sizes[-1], ids.size
        width = tables.shape[1]
        h64, h32 = (t.numpy() for t in g.mapped_inputs())
        h64[: 2 * n] = 0  # padding rows: id 0 at position 0, as the copied steps' padding
        h64[:nd], h64[n : n + nd] = ids, pos
        h64[2 * n : 4 * n] = -1  # slots past the batch write nothing; src -1: no id in flight
        h64[2 * n : 2 * n + nd] = slots
        h64[3 * n + pend_at] = pend_rows
        h64[4 * n : 4 * n + 2] = (nd, width)
        h32[:n] = 0
        h32[:nd] = pos + 1
        h32[n:].reshape(n, -1)[:nd, :width] = tables  # row r at n + r * max_blocks
        if pend_at.size:
            self._take_pending(pending)
        return self._graph_step(pos, torch.from_numpy(tables))  # (the graph reads its own table)

    def _take_pending(self, pending: torch.Tensor | None) -> None:
        if pending is None:
            raise RuntimeError("a scheduled token is still in flight but no previous step was given")
        self.graphs.take_tokens(pending)

    def _graph_step(self, pos: np.ndarray, block_tables: torch.Tensor) -> StepInputs:
        """The StepInputs of a decode step whose inputs are a graph's static buffers (nd = pos.size)."""
        g, nd = self.graphs, pos.size
        meta = AttentionMetadata(
            slot_mapping=g.slot_mapping[:nd],
            num_decodes=nd,
            decode_block_tables=block_tables,
            decode_seq_lens=g.seq_lens[:nd],
            decode_max_seq_len=int(pos.max()) + 1,
            prefill_block_tables=None,
            prefill_cu_seqlens_q=None,
            prefill_seq_lens=None,
        )
        rows = g.sample_rows[:nd]
        return StepInputs(g.input_ids[:nd], g.positions[:nd], meta, rows, list(range(nd)), None, True)

    def static_logits(self, logits: torch.Tensor | None) -> torch.Tensor | None:
        """The decode graph output buffer that `logits` (run's result) is the leading rows of, else None."""
        return None if self.graphs is None or logits is None else self.graphs.static_output(logits)

    @torch.inference_mode()
    def execute(
        self, batch: ScheduledBatch, pending: torch.Tensor | None = None, temps: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, list[int], tuple | None]:
        """Runs one step; returns (logits (num_sampling, vocab) in the model's dtype, the batch indices
        that sample, None); with `temps` ((batch,) float32 on the device, given only for a batch that
        samples_in_graph) one step-graph replay: (None, the batch indices, ((batch,) sampled ids, their
        pinned host row or None))."""
        if temps is None:
            return (*self.run(batch, self.prepare(batch, pending)), None)
        # the step graphs read their inputs from pinned memory
        step = self.prepare(batch, pending, mapped=self.graphs.host_ring is not None)
        return None, step.sampling, self.run_sampled(len(batch.seqs), temps)

    def samples_in_graph(self, batch: ScheduledBatch) -> bool:
        """Whether a step graph can take this batch (decode-only, small enough)."""
        bs = len(batch.seqs)
        return self.graphs is not None and batch.num_decodes == bs and self.graphs.samples(bs)

    def run_sampled(self, bs: int, temps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A prepared decode step's forward and sampling, one step-graph replay: the (bs,) int64 ids on
        the device and, when the graph writes them to the host itself, their pinned host row."""
        return self.graphs.run_step(bs, temps)

    @torch.inference_mode()
    def run(
        self, batch: ScheduledBatch, step: StepInputs, pending: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, list[int]]:
        """The forward of prepared inputs (`pending`: the in-flight tokens a deferred prepare left out)."""
        if pending is not None:  # deferred by prepare
            if step.in_graph:
                self.graphs.take_tokens(pending)
            else:
                _fill_pending(step, pending)
        input_ids, positions, meta = step.input_ids, step.positions, step.meta
        bs = len(batch.seqs)
        if step.in_graph:  # its inputs are the decode graph's static buffers already
            return self.graphs.run(bs), step.sampling
        if step.batch_size:  # a batch graph's, likewise
            rows = len(step.sampling) + step.spec_rows
            logits = self.batch_graphs.run(step.batch_size, rows)  # writes the chunks' K/V in any case
            return (logits, step.sampling) if rows else (None, [])
        if (
            self.extend_graphs is not None
            and not step.spec_rows
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
            return (logits, step.sampling) if step.sampling else (None, [])
        if self.cpu_step is not None and self.cpu_step.takes(meta):
            hidden = self.cpu_step(input_ids, positions, meta)
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
        if not step.sampling and not step.spec_rows:
            return None, []
        return self.model.compute_logits(hidden.index_select(0, step.rows)), step.sampling


class StepInputs(NamedTuple):
    """What prepare() builds for one step (tensors on the runner's device). A batch-graph step has only
    its ids (to patch tokens in flight into): the graph holds the rest (positions, meta and rows None)."""

    input_ids: torch.Tensor  # (num_tokens,) int64: decodes first, then the prefill chunks
    positions: torch.Tensor | None  # (num_tokens,) int64
    meta: AttentionMetadata | None
    rows: torch.Tensor | None  # (num_sampling,) token rows whose logits are sampled (each a sequence's last)
    sampling: list[int]  # batch positions of the sequences that sample, in row order
    pending_at: torch.Tensor | None = None  # (2k,) positions of in-flight tokens, then their sampled rows
    in_graph: bool = False  # a decode step whose tensors are views of the decode graph's static inputs
    batch_size: int = 0  # > 0: a step a batch graph of this many tokens runs (its inputs loaded already)
    # rows of proposals' chunks (engine.speculative) after the sampling ones, whose logits follow theirs;
    # eager or a batch graph's (the decode and extend graphs return one row per sequence)
    spec_rows: int = 0


def _fill_pending(step: StepInputs, pending: torch.Tensor | None) -> None:
    """Copies the in-flight tokens (rows of the previous step's sampled ids) into the step's ids."""
    if step.pending_at is None:
        return
    if pending is None:
        raise RuntimeError("a scheduled token is still in flight but no previous step was given")
    k = step.pending_at.shape[0] // 2
    step.input_ids.index_copy_(0, step.pending_at[:k], pending.index_select(0, step.pending_at[k:]))


class _Upload:
    """Collects a step's integer arrays; upload() moves them in one copy per dtype and returns views."""

    def __init__(self) -> None:
        self.parts: dict[torch.dtype, list[np.ndarray]] = {torch.int64: [], torch.int32: []}
        self.sizes = {torch.int64: 0, torch.int32: 0}
        self.specs: list[tuple[torch.dtype, int, int, int]] = []  # dtype, offset, length, rows (0 = 1-D)

    def add(self, values: np.ndarray, dtype: torch.dtype, rows: int = 0) -> int:
        self.specs.append((dtype, self.sizes[dtype], values.size, rows))
        self.parts[dtype].append(values.reshape(-1))
        self.sizes[dtype] += values.size
        return len(self.specs) - 1

    def upload(self, staging: Staging, into: dict | None = None) -> list[torch.Tensor]:
        moved = staging.upload(self.parts, into)
        out = []
        for dt, off, n, rows in self.specs:
            t = moved[dt][off : off + n] if dt in moved else torch.empty(0, dtype=dt, device=staging.device)
            out.append(t.view(rows, -1) if rows else t)
        return out
