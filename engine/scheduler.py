"""Continuous batching under a token budget: decodes and prefill chunks share each step;
first come, first served, except that a request's first sequence goes before other requests'
further samples (n > 1) and a few seats are kept for requests not yet started, so one request's
many samples cannot starve a small one; preemption by recompute when KV blocks run out. No torch."""

from __future__ import annotations

import contextlib
from collections import Counter, deque

from engine.block_manager import BlockManager
from runner.batch import ScheduledBatch
from runner.sequence import Sequence, SequenceStatus


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
        # seats only a request with no running sequence may take: further samples of running
        # requests (n > 1) stop short of them, so a new request always finds a seat soon
        self.reserved_seats = max_num_seqs // 16 if max_num_seqs >= 16 else 0
        self._running_per_request: Counter[str] = Counter()

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._left(seq)
        elif seq.status is SequenceStatus.WAITING:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.spec_tokens = []
        self.bm.free(seq)

    def _left(self, seq: Sequence) -> None:
        rid = seq.request_id
        self._running_per_request[rid] -= 1
        if self._running_per_request[rid] <= 0:
            del self._running_per_request[rid]

    def _preempt(self, seq: Sequence) -> None:
        seq.spec_tokens = []
        self.running.remove(seq)
        self._left(seq)
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
            spec = seq.spec_tokens  # proposals verified in this chunk (engine.speculative)
            left = len(seq.token_ids) - computed + len(spec)
            n = left if left < budget else budget
            if n < left and spec:  # the proposals that fit; none when the chunk stops short of the end
                del spec[max(n - left + len(spec), 0) :]
                left = len(seq.token_ids) - computed + len(spec)
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

        # 2. waiting sequences while budget, seats and blocks last: first those whose request has
        # nothing running yet (arrival order), then further samples of running requests, which
        # leave the reserved seats free
        if not preempted and self.waiting and len(self.running) < self.max_num_seqs:
            admitted: set[int] = set()
            per_request = self._running_per_request
            for newcomers in (True, False):
                limit = self.max_num_seqs - (0 if newcomers else self.reserved_seats)
                blocked = False
                for seq in self.waiting:
                    if budget <= 0 or len(self.running) >= limit:
                        break
                    if (seq.request_id not in per_request) != newcomers or seq.seq_id in admitted:
                        continue
                    constraint = seq.params.constraint
                    if constraint is not None and seq.constraint is None and not constraint.ready():
                        continue  # grammar still compiling: let others pass
                    if seq.done_scheduling:
                        continue
                    n = self._admit(seq, budget)
                    if n is None:
                        blocked = True  # out of blocks (or a whole prompt does not fit): wait
                        break
                    admitted.add(seq.seq_id)
                    prefills.append(seq)
                    chunks.append(n)
                    budget -= n
                if blocked:
                    break
            if admitted:
                self.waiting = deque(s for s in self.waiting if s.seq_id not in admitted)

        return ScheduledBatch(
            seqs=decodes + prefills,
            num_new_tokens=[1] * len(decodes) + chunks,
            num_decodes=len(decodes),
            preempted=preempted,
        )

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Allocate blocks for seq's first chunk and make it running; returns the chunk's tokens,
        or None when it cannot start now."""
        bm = self.bm
        hits = bm.match_prefix(seq.token_ids) if seq.num_computed_tokens == 0 else []
        n = seq.num_tokens - len(hits) * bm.block_size
        if n > budget and not self.enable_chunked_prefill:
            return None
        n = min(n, budget)
        # blocks for the chunk, counting the cached hits that are free now (taking them uses them)
        free_hits = sum(1 for b in hits if bm.blocks[b].ref_count == 0)
        need = -(-(len(hits) * bm.block_size + n) // bm.block_size) - len(hits)
        if need + free_hits > bm.num_free_blocks:
            return None
        bm.allocate_prefix(seq, hits)
        ok = bm.allocate(seq, seq.num_computed_tokens + n)
        assert ok
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._running_per_request[seq.request_id] += 1
        return n

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
