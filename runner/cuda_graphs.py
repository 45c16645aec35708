"""Steps captured in CUDA graphs, so a step costs one launch instead of hundreds:
- DecodeGraphs: decode steps, one graph per batch size of a ladder; a batch is padded up to the next
  captured size (padding rows write no K/V and attend to nothing);
- ExtendGraphs: one sequence's prefill chunk (a new chat turn over its cached history), one graph per
  token count of a ladder; padding tokens write no K/V and belong to no sequence."""

from __future__ import annotations

import logging

import torch

from kernels import dispatch as ops
from models.attention import AttentionMetadata

log = logging.getLogger("chatloom.engine")


def padded_size(sizes: list[int], n: int) -> int | None:
    """The smallest captured size >= n (sizes sorted), or None when n is beyond the ladder."""
    return next((s for s in sizes if s >= n), None)


@torch.inference_mode()
def capture_ladder(
    sizes: list[int], forward, desc: str, prepare=None
) -> dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]]:
    """size -> (graph, its output): forward(size) captured once per size, largest first, all graphs
    in one memory pool (they are replayed one at a time on one stream). prepare(size) sets the
    static inputs a capture needs before it runs."""
    from tqdm import tqdm

    graphs, pool = {}, None
    for n in tqdm(sorted(sizes, reverse=True), desc=desc, unit="graph"):
        if prepare is not None:
            prepare(n)
        forward(n)  # compiles kernels and settles allocations outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = forward(n)
        pool = graph.pool()
        graphs[n] = (graph, out)
    torch.cuda.synchronize()
    return graphs


def default_sizes(max_num_seqs: int) -> list[int]:
    ladder = [1, 2, 4, 8] + list(range(16, 257, 8))
    sizes = [s for s in ladder if s < max_num_seqs] + [max_num_seqs]
    return sorted(set(sizes))


class _TokenGraphs:
    """What both kinds share: a ladder of sizes and the static token inputs (ids, positions, K/V
    slots) of the largest, loaded for a step with the padding tokens' slots set to -1. They are the
    first 3n entries of one int64 buffer of 3n + extra (extra: room a subclass uses after them)."""

    def __init__(self, model, kv_caches, sizes: list[int], device: torch.device, extra: int = 0) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(sizes)
        n = self.sizes[-1]
        self.inputs64 = torch.zeros(3 * n + extra, dtype=torch.int64, device=device)
        self.input_ids, self.positions, self.slot_mapping = self.inputs64[: 3 * n].view(3, n)
        self.slot_mapping.fill_(-1)

    def padded_size(self, n: int) -> int | None:
        return padded_size(self.sizes, n)

    def _load_tokens(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor
    ) -> int:
        """Copies a step's (n,) token inputs in; returns the captured size they are padded to."""
        n = input_ids.shape[0]
        size = self.padded_size(n)
        assert size is not None
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        if size > n:
            self.slot_mapping[n:size].fill_(-1)
        return size


# Decode steps of at most this many sequences are also captured with the fused sampler after the
# forward, when the engine samples in graphs: a plain step (no logit edits, masks, filters, seeds or
# logprobs) is then one replay that leaves its tokens in `tokens`, where the next step's first launch
# reads those still in flight. Small batches only: at wide batches the separate sampler measured faster
# (docs/performance.md).
STEP_GRAPH_MAX_SIZE = 8
# Step graphs exchange a step with the host through pinned memory the device reads and writes itself:
# the host writes the step's inputs into a ring row that the graph's first launch reads
# (kernels.step_inputs.mapped_step_inputs), and the graph's last launch writes the tokens into a ring
# row that the host reads once the replay's event fired (kernels.publish). No copies run around the
# replay.
MAPPED_SLOTS = 4  # the host reads replay k's tokens before it launches replay k + 2


class DecodeGraphs(_TokenGraphs):
    """A step's prepare fills the static inputs with one host-to-device copy per buffer
    (ModelRunner.prepare), in the layout of kernels.step_inputs: int64 [ids | positions | slots (n each,
    n the largest size; the padding rows' slots -1) | k, rows, width, 0 | k in-flight positions | their
    rows in `tokens`] and int32 [lengths (n; padding rows 0) | the step's block-table rows]. Each graph
    starts with that kernel: it moves the table rows into the graph's table and, for k > 0, the
    previous step's tokens into the ids. A graph step samples rows 0..bs-1, the leading entries of
    sample_rows.

    Tokens in flight are always read from `tokens` (max_rows long: any step's draw fits); a previous
    draw made elsewhere (the sampler, a prefill) is copied there first (take_tokens).

    sample_seed: also capture step graphs (forward, then sampling into `tokens` with the temperatures
    in `temps` and the device seed, which each replay advances) for the sizes up to
    STEP_GRAPH_MAX_SIZE; at batch 1 the final norm, the lm_head and the draw are one launch
    (kernels.lm_head_sample)."""

    def __init__(
        self,
        model,
        kv_caches,
        sizes: list[int],
        max_blocks: int,
        device: torch.device,
        sample_seed: int | None = None,
        max_rows: int = 0,
    ) -> None:
        n = max(sizes)
        super().__init__(model, kv_caches, sizes, device, extra=4 + 2 * n)  # control, in-flight pairs
        self.control = self.inputs64[3 * n : 3 * n + 4]
        self.sample_rows = torch.arange(n, device=device)
        self.inputs32 = torch.zeros(n + n * max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = self.inputs32[:n]
        self.block_tables = torch.zeros((n, max_blocks), dtype=torch.int32, device=device)
        # the step graphs' sampled ids, and where the in-flight ids of any graph step are read
        self.tokens = torch.zeros(max(n, max_rows), dtype=torch.int64, device=device)
        self.temps = torch.zeros(n, dtype=torch.float32, device=device)
        self.seed = torch.tensor([(sample_seed or 0) & 0x7FFFFFFF], dtype=torch.int64, device=device)
        self._temps_src: torch.Tensor | None = None
        self.graphs = capture_ladder(self.sizes, self._forward, "capturing CUDA graphs")
        self.step_graphs = {}
        samples = sample_seed is not None
        self.step_sizes = [s for s in self.sizes if s <= STEP_GRAPH_MAX_SIZE and samples]
        self.host_ring = None  # (MAPPED_SLOTS, n) pinned int64, the step graphs' tokens
        if self.step_sizes:
            pinned = device.type == "cuda"
            ring = lambda width, dtype: torch.zeros((MAPPED_SLOTS, width), dtype=dtype, pin_memory=pinned)
            self.host_ring = ring(n, torch.int64)
            self.host64, self.host32 = ring(4 * n + 4, torch.int64), ring(n + n * max_blocks, torch.int32)
            self.published = torch.zeros(1, dtype=torch.int64, device=device)  # replays, on the device
            # recorded after the last replay that read each input row (a never recorded event is done)
            self.slot_events = [torch.cuda.Event() for _ in range(MAPPED_SLOTS)] if pinned else None
        if self.step_sizes:
            self.step_graphs = capture_ladder(self.step_sizes, self._step, "capturing sampling graphs")
        if self.host_ring is not None:
            self.published.zero_()  # the captures' own runs counted: host and device start again
        self.step_replays = 0

    def take_tokens(self, pending: torch.Tensor) -> None:
        """The previous step's (rows,) sampled ids where the next graph reads those in flight."""
        if pending.data_ptr() != self.tokens.data_ptr():
            self.tokens[: pending.shape[0]].copy_(pending)

    def finish_inputs(self, size: int) -> None:
        """What every graph launches first (kernels.step_inputs)."""
        ops.decode_step_inputs(self.inputs64, self.inputs32, self.block_tables, self.tokens, size)

    def _forward(self, bs: int) -> torch.Tensor:
        return self.model.compute_logits(self._hidden(bs))

    def _hidden(self, bs: int, final_norm: bool = True, mapped: bool = False):
        if mapped:
            ops.mapped_step_inputs(self.host64, self.host32, self.published, self.inputs64, self.seq_lens,
                                   self.block_tables, self.tokens, bs)  # fmt: skip
        else:
            self.finish_inputs(bs)
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs],
            num_decodes=bs,
            decode_block_tables=self.block_tables[:bs],
            decode_seq_lens=self.seq_lens[:bs],
            prefill_block_tables=None,
            prefill_cu_seqlens_q=None,
            prefill_seq_lens=None,
        )
        return self.model(self.input_ids[:bs], self.positions[:bs], self.kv_caches, meta, final_norm)

    def _step(self, bs: int) -> torch.Tensor:
        x, residual = self._hidden(bs, final_norm=False, mapped=self.host_ring is not None)
        norm, tokens = self.model.norm, self.tokens[:bs]
        head = self.model.logits_weight
        publish = (self.host_ring, self.published) if self.host_ring is not None else None
        ops.lm_head_sample(x, residual, norm.weight, norm.eps, head, self.temps[:bs], self.seed, tokens,
                           publish)  # fmt: skip
        return tokens

    def static_output(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The whole output buffer of the graph whose run() returned `logits` (its leading rows), else
        None (logits from anywhere else)."""
        size = self.padded_size(logits.shape[0])
        if size is None:
            return None
        out = self.graphs[size][1]
        return out if out.data_ptr() == logits.data_ptr() and out.stride() == logits.stride() else None

    def run(self, bs: int) -> torch.Tensor:  # (bs, vocab) logits in the model dtype (the graph's output)
        """Replays the graph of the size bs pads to, its static inputs already loaded by prepare."""
        size = self.padded_size(bs)
        assert size is not None
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:bs]

    def samples(self, bs: int) -> bool:
        """Whether a step graph takes a batch of bs."""
        return padded_size(self.step_sizes, bs) is not None

    def run_step(
        self,
        bs: int,
        temps: torch.Tensor,  # (bs,) float32 on the device, 0 = greedy
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Replays the step graph of the size bs pads to: forward and sampling. Returns the (bs,) int64
        sampled ids (the leading entries of `tokens`), valid until the next replay of any step graph
        (what reads them is queued before it), and their row of the pinned host
        ring, filled once the replay has run (the host reads it before its next-but-one replay)."""
        if temps is not self._temps_src:  # a steady batch keeps its temperatures: no copy
            self.temps[:bs].copy_(temps)
            self._temps_src = temps
        size = padded_size(self.step_sizes, bs)
        assert size is not None
        self.step_graphs[size][0].replay()
        host = None
        if self.host_ring is not None:
            at = self.step_replays % MAPPED_SLOTS
            host = self.host_ring[at, :bs]
            if self.slot_events is not None:
                self.slot_events[at].record()
        self.step_replays += 1
        return self.tokens[:bs], host

    def mapped_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next step replay's input rows of the pinned rings ((4n + 4,) int64, (n + n * max_blocks,)
        int32), once the replay that last read them has run (normally long ago)."""
        at = self.step_replays % MAPPED_SLOTS
        if self.slot_events is not None:
            self.slot_events[at].synchronize()
        return self.host64[at], self.host32[at]


def default_extend_sizes(max_tokens: int) -> list[int]:
    return [s for s in (16, 32, 64, 128, 256, 512) if s <= max_tokens]


class ExtendGraphs(_TokenGraphs):
    """A batch of exactly one prefill chunk of <= max(sizes) tokens: run eagerly, such a step is bound
    by the host launching ~300 kernels; replayed, by the GPU."""

    def __init__(self, model, kv_caches, sizes: list[int], max_blocks: int, device: torch.device) -> None:
        super().__init__(model, kv_caches, sizes, device)
        self.block_table = torch.zeros((1, max_blocks), dtype=torch.int32, device=device)
        self.cu_seqlens = torch.zeros(2, dtype=torch.int32, device=device)
        self.seq_len = torch.zeros(1, dtype=torch.int32, device=device)
        self.last_row = torch.zeros(1, dtype=torch.int64, device=device)
        self.replays = 0
        self.graphs = capture_ladder(self.sizes, self._forward, "capturing prefill graphs", self._as_full)
        self.slot_mapping.fill_(-1)

    def _as_full(self, n: int) -> None:
        # the capture runs a fresh n-token prompt (slots -1: nothing written)
        self.cu_seqlens.copy_(torch.tensor([0, n], dtype=torch.int32))
        self.seq_len.fill_(n)

    def _forward(self, n: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:n],
            num_decodes=0,
            decode_block_tables=None,
            decode_seq_lens=None,
            prefill_block_tables=self.block_table,
            prefill_cu_seqlens_q=self.cu_seqlens,
            prefill_seq_lens=self.seq_len,
            prefill_max_q=n,  # the padded count: query tiles past the real q_len exit at once
        )
        hidden = self.model(self.input_ids[:n], self.positions[:n], self.kv_caches, meta)
        return self.model.compute_logits(hidden.index_select(0, self.last_row))

    def run(
        self,
        input_ids: torch.Tensor,  # (n,)
        positions: torch.Tensor,  # (n,)
        slot_mapping: torch.Tensor,  # (n,)
        block_table: torch.Tensor,  # (1, width) int32
        cu_seqlens: torch.Tensor,  # (2,) int32: [0, n]
        seq_len: torch.Tensor,  # (1,) int32: cached + n
    ) -> torch.Tensor:  # (1, vocab) logits of the last token, model dtype (a view of the graph's output)
        n = input_ids.shape[0]
        size = self._load_tokens(input_ids, positions, slot_mapping)
        self.block_table[:, : block_table.shape[1]].copy_(block_table)
        self.cu_seqlens.copy_(cu_seqlens)
        self.seq_len.copy_(seq_len)
        self.last_row.fill_(n - 1)
        graph, logits = self.graphs[size]
        graph.replay()
        self.replays += 1
        return logits
