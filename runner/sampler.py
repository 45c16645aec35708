"""Turns a step's logits into next tokens: bias, penalties, logits processors, grammar masks,
then greedy or temperature / top-k / top-p / min-p sampling, and logprobs."""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from kernels import dispatch as ops
from runner.host import host_to_device
from runner.sequence import Sequence

if TYPE_CHECKING:
    from runner.device_masks import DeviceMasks

log = logging.getLogger("chatloom.engine")


class Sampler:
    def __init__(
        self,
        vocab_size: int,
        eos_token_ids: set[int],
        device: torch.device,
        seed: int,
        max_rows: int = 0,
        mask_cache_rows: int = 0,
        graphs: bool = False,
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._seeds = random.Random(seed)  # per-step seeds of the fused sampler (drawn on the host: no sync)
        self._temps_key: tuple[float, ...] | None = None  # the fused sampler's last (batch,) temperatures
        self._temps: torch.Tensor | None = None
        self._bitmask: torch.Tensor | None = None  # (rows, words) int32, pinned on CUDA, reused
        # CUDA: grammar masks stay on the device and the fused sampler applies them (device_masks.py);
        # process() leaves them in _deferred for the next sample()
        self.device_masks: DeviceMasks | None = None
        if device.type == "cuda" and max_rows and mask_cache_rows:
            from runner.device_masks import DeviceMasks

            words = (vocab_size + 31) // 32
            self.device_masks = DeviceMasks(words, max_rows, max(mask_cache_rows, 2 * max_rows), device)
        self._deferred: torch.Tensor | None = None  # (batch,) int32 table row per logits row
        # sequences that failed alone in process() or sample(); EngineCore ends them and empties it
        self.failed: list[Sequence] = []
        # CUDA: the fused sampler replayed from graphs when the logits are a decode graph's output
        self.graphs = None
        if graphs and device.type == "cuda" and max_rows:
            from runner.sampler_graphs import SamplerGraphs

            self.graphs = SamplerGraphs(max_rows, device, self._seeds.getrandbits(31))

    def _bitmask_for(self, rows: int) -> torch.Tensor:
        # reused every step: the previous step's upload from it was waited for (its sampled tokens
        # were read back) before the host fills it again
        words = (self.vocab_size + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < rows:
            self._bitmask = torch.empty(
                (rows, words), dtype=torch.int32, pin_memory=self.device.type == "cuda"
            )
        return self._bitmask[:rows]

    def process(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Per-sequence logit changes, in place where possible. logits: (batch, vocab) in the model's
        dtype; 16-bit logits that a row edits (bias, penalties, processors) are first copied to float32,
        so edits never round to 16 bits. Rows of finished sequences (their token will be dropped) are
        left alone. Grammar masks are applied here, or on CUDA left to the next sample() when it runs
        the fused sampler."""
        self._deferred = None
        fills: dict[object, list] = {}  # batch filler (None: row by row) -> [(constraint, row, budget)]
        owners: dict[int, Sequence] = {}  # id(constraint) -> its sequence, to blame a failed fill
        for i, seq in enumerate(seqs):
            if seq.is_finished or seq.error is not None or (not seq.edits_logits and seq.constraint is None):
                continue
            p = seq.params
            try:
                if logits.dtype != torch.float32 and (
                    p.logit_bias or p.needs_penalties or p.logits_processors
                ):
                    logits = logits.float()  # the first row that edits values: -inf set so far is kept
                if p.logit_bias:
                    ids = host_to_device(list(p.logit_bias), torch.long, logits.device)
                    logits[i, ids] += host_to_device(list(p.logit_bias.values()), logits.dtype, logits.device)
                if p.needs_penalties:
                    _apply_penalties(logits[i], seq, p)
                if p.min_tokens and seq.num_output_tokens < p.min_tokens:
                    banned = self.eos_token_ids + list(p.stop_token_ids)
                    if banned:
                        logits[i, host_to_device(banned, torch.long, logits.device)] = float("-inf")
                for proc in p.logits_processors:
                    logits[i] = proc(seq.output_token_ids, logits[i])
            except Exception as exc:  # this row's own edits: it fails alone, its token is dropped
                fail_sequence(seq, "processing its logits", exc, self.failed)
                continue
            c = seq.constraint
            if c is not None:
                owners[id(c)] = seq
                fills.setdefault(getattr(c, "fill_bitmasks", None), []).append((c, i, _remaining_tokens(seq)))
        if fills and self.device_masks is not None and self._fusable(logits, seqs):
            self._deferred = self._device_masks(fills, len(seqs), owners)
        elif fills:
            bitmask = self._bitmask_for(len(seqs))
            bitmask.fill_(-1)
            for fill, rows in fills.items():
                _fill_rows(fill, bitmask, rows, owners, self.failed)
            ops.apply_token_bitmask_(logits, bitmask.to(logits.device, non_blocking=True))
        return logits

    def _device_masks(
        self, fills: dict[object, list], batch: int, owners: dict[int, Sequence]
    ) -> torch.Tensor:
        """The rows of `fills` on the device: cached rows by key, the others computed into staging
        rows and uploaded. Returns the (batch,) int32 device index of each row's mask (-1: none)."""
        dm = self.device_masks
        rows = np.full(batch, -1, dtype=np.int32)
        todo: dict[object, list] = {}  # batch filler -> [(constraint, staging row, budget)]
        claimed: dict[object, int] = {}  # key -> staging row computing it this step
        keys: list[tuple[int, object, object, int]] = []  # (staging row, key, constraint, budget)
        computed = 0
        lookup = dm.lookup
        for fill, items in fills.items():
            for c, row, budget in items:
                key_of = getattr(c, "mask_key", None)
                key = key_of(budget) if key_of is not None else None
                if key is not None:
                    slot = lookup(key)
                    if slot is None and key in claimed:
                        slot = dm.scratch_row(claimed[key])
                    if slot is not None:
                        rows[row] = slot
                        continue
                    claimed[key] = computed
                    keys.append((computed, key, c, budget))
                rows[row] = dm.scratch_row(computed)
                todo.setdefault(fill, []).append((c, computed, budget))
                computed += 1
        staging = dm.staging[:computed]
        if computed:
            staging.fill_(-1)
            for fill, items in todo.items():
                _fill_rows(fill, staging, items, owners, self.failed)
        # a row is cached only if it still has its key once computed (its matcher did not fail)
        keep = [
            (local, key) for local, key, c, budget in keys if _same_key(c, budget, key, owners, self.failed)
        ]
        return dm.upload(rows, computed, keep)

    def _temps_for(self, seqs: list[Sequence]) -> torch.Tensor:
        """(batch,) float32 temperatures on the device, 0 = greedy; a steady batch reuses its tensor (no
        upload per step)."""
        key = tuple(0.0 if s.params.greedy else s.params.temperature for s in seqs)
        if key != self._temps_key:
            self._temps_key, self._temps = key, host_to_device(list(key), torch.float32, self.device)
        return self._temps

    def graph_temps(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The rows' temperatures when a step graph may sample them itself (every row plain: no logit
        edits, which grammars and penalties are, no filters, per-request seed or logprobs), else None."""
        for s in seqs:
            if s.edits_logits or s.params.logprobs is not None or not _plain(s):
                return None
        return self._temps_for(seqs)

    @staticmethod
    def _fusable(logits: torch.Tensor, seqs: list[Sequence]) -> bool:
        """Whether the fused Triton sampler can take these rows (CUDA, no filters, no per-request seed)."""
        return ops.use_triton(logits) and all(_plain(s) for s in seqs)

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence], static: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(batch, vocab) processed logits (float32 or the model's dtype) -> (batch,) token ids. static:
        the whole buffer that logits leads, when it is a decode graph's output (the fused sampler then
        replays a graph).

        When the batch cannot be sampled, each row is sampled alone to find the rows that fail:
        those sequences fail alone (their token, 0, is dropped) and the others keep theirs. Only a
        failure of every row is raised (then the cause is not one request)."""
        mask_rows = self._deferred
        try:
            return self._sample_batch(logits, seqs, static)
        except Exception as exc:
            if len(seqs) <= 1:
                raise
            error = exc
        tokens = []
        failed = 0
        for i, seq in enumerate(seqs):
            self._deferred = mask_rows[i : i + 1] if mask_rows is not None else None
            try:
                tokens.append(self._sample_batch(logits[i : i + 1], [seq], None).view(1))
            except Exception as exc:
                self._deferred = None
                failed += 1
                fail_sequence(seq, "sampling", exc, self.failed)
                tokens.append(torch.zeros(1, dtype=torch.long, device=logits.device))
        if failed == len(seqs):
            raise error
        return torch.cat(tokens)

    def _sample_batch(
        self, logits: torch.Tensor, seqs: list[Sequence], static: torch.Tensor | None
    ) -> torch.Tensor:
        mask_rows, self._deferred = self._deferred, None
        if mask_rows is None and all(s.params.greedy for s in seqs):
            return logits.argmax(dim=-1)
        # masked rows were deferred only when the fused sampler can take them (process)
        if mask_rows is not None or self._fusable(logits, seqs):
            # fast path: mask + temperature + exponential race + argmax in one pass (kernels.sampling)
            self._temps_for(seqs)
            table = self.device_masks.table if mask_rows is not None else None
            if static is not None and self.graphs is not None:
                return self.graphs.sample(static, len(seqs), self._temps, table, mask_rows)
            seed = self._seeds.getrandbits(31)
            return ops.sample_tokens(logits, self._temps, seed, mask=table, mask_rows=mask_rows)
        temps = host_to_device(
            [1.0 if s.params.greedy else s.params.temperature for s in seqs], torch.float32, logits.device
        )
        probs = torch.softmax(logits.float() / temps[:, None], dim=-1)
        probs = _filter(probs, seqs)
        # exponential race: argmax(p / E), E ~ Exp(1), samples from p; per-seed generators where asked
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                noise[i].exponential_(generator=s.generator)
        sampled = (probs / noise).argmax(dim=-1)
        greedy = [s.params.greedy for s in seqs]
        if any(greedy):
            sampled = torch.where(
                host_to_device(greedy, torch.bool, logits.device), logits.argmax(dim=-1), sampled
            )
        return sampled


def fail_sequence(seq: Sequence, stage: str, exc: BaseException, failed: list[Sequence]) -> None:
    """Mark one sequence failed and add it to `failed` (Sampler.failed: the engine ends those with
    finish_reason "error" after this step's sampling); its message names what failed and is what
    its client sees."""
    if seq.error is None:
        log.warning("request %s (sample %d) failed while %s: %r", seq.request_id, seq.index, stage, exc)
        seq.error = f"failed while {stage}: {type(exc).__name__}: {exc}"
        failed.append(seq)


def _fill_rows(
    fill, bitmask: torch.Tensor, rows: list, owners: dict[int, Sequence], failed: list[Sequence]
) -> None:
    """Grammar masks of one group of rows: (constraint, row, budget) each. The group's shared filler
    goes first; when it raises, every row is filled alone so that only the failing ones are blamed.
    A failed row is left all-allowed (its token is dropped)."""
    if fill is not None:
        try:
            fill(bitmask, rows)  # the whole group at once (e.g. in parallel, without the GIL)
            return
        except Exception:
            log.warning("a batched grammar mask fill failed; filling its %d rows one by one", len(rows))
            for _, row, _ in rows:
                bitmask[row] = -1
    for constraint, row, budget in rows:
        try:
            constraint.fill_bitmask(bitmask, row, budget)
        except Exception as exc:
            bitmask[row] = -1
            seq = owners.get(id(constraint))
            if seq is None:
                raise
            fail_sequence(seq, "computing its grammar mask", exc, failed)


def _same_key(
    constraint, budget: int, key: object, owners: dict[int, Sequence], failed: list[Sequence]
) -> bool:
    seq = owners.get(id(constraint))
    if seq is not None and seq.error is not None:
        return False
    try:
        return constraint.mask_key(budget) == key
    except Exception as exc:
        if seq is None:
            raise
        fail_sequence(seq, "computing its grammar mask", exc, failed)
        return False


def _plain(seq: Sequence) -> bool:
    """No top-k / top-p / min-p filter and no per-request seed: the fused sampler applies."""
    p = seq.params
    return seq.generator is None and p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0


def _remaining_tokens(seq: Sequence) -> int:
    limit = seq.params.max_tokens
    left = 1 << 30 if limit is None else limit - seq.num_output_tokens
    return max(left, 0)


def _apply_penalties(row: torch.Tensor, seq: Sequence, p) -> None:
    # ids and counts are made on the host and uploaded through pinned memory: nothing here waits
    # for the device
    out = seq.output_token_ids
    if p.repetition_penalty != 1.0:
        seen = host_to_device(sorted(set(seq.token_ids)), torch.long, row.device)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if out and (p.frequency_penalty or p.presence_penalty):
        counts = Counter(out)
        ids = host_to_device(list(counts), torch.long, row.device)
        n = host_to_device(list(counts.values()), row.dtype, row.device)
        row[ids] -= p.frequency_penalty * n + p.presence_penalty


def _filter(probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    top_k = [s.params.top_k for s in seqs]
    top_p = [s.params.top_p for s in seqs]
    min_p = [s.params.min_p for s in seqs]
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = torch.ones_like(sorted_p, dtype=torch.bool)
        if any(k > 0 for k in top_k):
            vocab = probs.shape[-1]
            ks = host_to_device([min(k, vocab) if k > 0 else vocab for k in top_k], torch.long, probs.device)
            keep &= torch.arange(probs.shape[-1], device=probs.device)[None, :] < ks[:, None]
        if any(p < 1.0 for p in top_p):
            ps = host_to_device(top_p, probs.dtype, probs.device)
            before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
            keep &= before < ps[:, None]
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
    if any(m > 0 for m in min_p):
        ms = host_to_device(min_p, probs.dtype, probs.device)
        probs = torch.where(probs < ms[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0, probs)
    return probs


class LogprobTensors(NamedTuple):
    chosen: torch.Tensor  # (batch,) logprob of each sampled token
    top_ids: torch.Tensor  # (batch, k) ids of the k most likely tokens, k = the largest asked
    top_vals: torch.Tensor  # (batch, k) their logprobs, descending


def logprob_tensors(
    logits: torch.Tensor, token_ids: torch.Tensor, top: list[int | None]
) -> LogprobTensors | None:
    """Logprobs under the model's distribution (raw logits), left on the logits' device (no sync);
    None when no row asks for them."""
    if all(t is None for t in top):
        return None
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, token_ids.view(-1, 1)).squeeze(1)
    vals, ids = lp.topk(max(t or 0 for t in top), dim=-1)
    return LogprobTensors(chosen, ids, vals)


def logprob_rows(
    t: LogprobTensors, top: list[int | None]
) -> list[tuple[float, list[tuple[int, float]]] | None]:
    """Per row: (chosen logprob, [(id, logprob)] of its top-k), or None where not asked."""
    chosen = t.chosen.tolist()
    ids, vals = t.top_ids.tolist(), t.top_vals.tolist()
    return [
        None if k is None else (chosen[i], list(zip(ids[i][:k], vals[i][:k], strict=True)))
        for i, k in enumerate(top)
    ]


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top: list[int | None]
) -> list[tuple[float, list[tuple[int, float]]] | None]:
    """Logprob of each chosen token under the model's distribution (raw logits), and its top-k."""
    t = logprob_tensors(logits, token_ids, top)
    return [None] * len(top) if t is None else logprob_rows(t, top)
