"""Continuous batching under a token budget: decodes and prefill chunks share each step;
first come, first served; preemption by recompute when KV blocks run out. No torch."""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    # decodes first (one token each), then prefill chunks
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_decodes: int = 0
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.bm.free(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        bm = self.bm
        bs = bm.block_size
        decodes: list[Sequence] = []
        prefills: list[Sequence] = []
        chunks: list[int] = []  # tokens of each prefill chunk
        preempted: list[Sequence] = []

        # 1. running sequences, oldest first; the newest are preempted when blocks run out
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            i += 1
            if seq.done_scheduling:
                continue
            computed = seq.num_computed_tokens
            left = len(seq.token_ids) - computed
            n = left if left < budget else budget
            if computed + n > len(seq.block_table) * bs:  # a new block is needed
                while not bm.allocate(seq, computed + n):
                    victim = running[-1]
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING:
                    break
            if left == 1:
                decodes.append(seq)
            else:
                prefills.append(seq)
                chunks.append(n)
            budget -= n

        # 2. waiting sequences in arrival order, while budget, seats and blocks last
        if not preempted:
            skipped: list[Sequence] = []
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                seq = self.waiting[0]
                constraint = seq.params.constraint
                compiling = constraint is not None and seq.constraint is None and not constraint.ready()
                if compiling or seq.done_scheduling:
                    skipped.append(self.waiting.popleft())  # grammar still compiling: let others pass
                    continue
                hits = self.bm.match_prefix(seq.token_ids) if seq.num_computed_tokens == 0 else []
                n = seq.num_tokens - len(hits) * self.bm.block_size
                if n > budget and not self.enable_chunked_prefill:
                    break
                n = min(n, budget)
                # blocks for the chunk, counting the cached hits that are free now (taking them uses them)
                free_hits = sum(1 for b in hits if self.bm.blocks[b].ref_count == 0)
                need = -(-(len(hits) * self.bm.block_size + n) // self.bm.block_size) - len(hits)
                if need + free_hits > self.bm.num_free_blocks:
                    break
                self.waiting.popleft()
                self.bm.allocate_prefix(seq, hits)
                ok = self.bm.allocate(seq, seq.num_computed_tokens + n)
                assert ok
                seq.status = SequenceStatus.RUNNING
                self.running.append(seq)
                prefills.append(seq)
                chunks.append(n)
                budget -= n
            for seq in reversed(skipped):
                self.waiting.appendleft(seq)

        return ScheduledBatch(
            seqs=decodes + prefills,
            num_new_tokens=[1] * len(decodes) + chunks,
            num_decodes=len(decodes),
            preempted=preempted,
        )

    def after_step(self, batch: ScheduledBatch) -> None:
        """Record the K/V the step computed; register newly full blocks for prefix reuse."""
        bm = self.bm
        caching, bs = bm.enable_prefix_caching, bm.block_size
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq.is_finished:  # stopped while this step was in flight
                continue  # its blocks are already free
            seq.num_computed_tokens += n
            if caching and seq.num_computed_tokens >= (len(seq.block_hashes) + 1) * bs:  # a block filled
                bm.commit_full_blocks(seq)
