"""Scheduler on plain Python objects (no torch): FCFS admission, the token budget, chunked prefill,
decodes before prefills, max_num_seqs, preemption by recompute, requests whose grammar still compiles.

A step is simulated as the engine does it: schedule(), after_step(batch), then every sequence whose
tokens are all computed samples one token (here a fixed id) and finishes at max_tokens."""

from __future__ import annotations

import subprocess
import sys
from itertools import count

from engine.block_manager import BlockManager
from engine.scheduler import Scheduler
from runner.batch import ScheduledBatch
from runner.sampling_params import SamplingParams
from runner.sequence import Sequence, SequenceStatus

BS = 4
_tok = count(1000)
_rid = count()


def prompt(n: int) -> list[int]:
    """n distinct token ids, never seen before (no accidental prefix hits)."""
    return [next(_tok) for _ in range(n)]


def make(
    num_blocks: int = 64,
    max_num_seqs: int = 8,
    budget: int = 64,
    chunked: bool = True,
    prefix_caching: bool = True,
) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS, prefix_caching), max_num_seqs, budget, chunked)


def add(
    sched: Scheduler, n_tokens: int, max_tokens: int = 4, params: SamplingParams | None = None
) -> Sequence:
    rid = f"r{n_tokens}-{next(_rid)}"  # one request per sequence
    seq = Sequence(rid, prompt(n_tokens), params or SamplingParams(max_tokens=max_tokens))
    sched.add(seq)
    return seq


def step(sched: Scheduler) -> ScheduledBatch:
    batch = sched.schedule()
    assert batch.total_tokens <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    sched.after_step(batch)
    for seq in batch.seqs:
        if seq.num_computed_tokens == seq.num_tokens:  # prefill complete (or a decode): it samples
            seq.append_token(7)
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq)
    return batch


def run_all(sched: Scheduler, limit: int = 1000) -> list[ScheduledBatch]:
    batches = []
    while sched.has_unfinished():
        batches.append(step(sched))
        assert len(batches) < limit, "the scheduler made no progress"
    return batches


def test_imports_no_torch():
    code = (
        "import sys; import engine.scheduler, engine.block_manager, runner.sequence; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_fcfs_admission_and_max_num_seqs():
    sched = make(max_num_seqs=2)
    a, b, c = add(sched, 5, max_tokens=3), add(sched, 5, max_tokens=6), add(sched, 5, max_tokens=3)
    batch = step(sched)
    assert batch.seqs == [a, b]
    assert list(sched.waiting) == [c] and sched.running == [a, b]
    while not a.is_finished:
        batch = step(sched)
        assert c not in batch.seqs  # no seat until one of the first two leaves
    assert sched.running == [b]
    batch = step(sched)
    assert batch.seqs == [b, c] and batch.num_new_tokens == [1, 5]
    run_all(sched)
    assert [s.num_output_tokens for s in (a, b, c)] == [3, 6, 3]


def test_token_budget_respected_under_load():
    sched = make(num_blocks=256, max_num_seqs=6, budget=16)
    seqs = [add(sched, n, max_tokens=3) for n in (1, 30, 7, 16, 17, 45, 3, 9)]
    batches = run_all(sched)
    assert all(0 < b.total_tokens <= 16 for b in batches)
    assert max(b.total_tokens for b in batches) == 16  # the budget is filled when work allows
    assert all(s.is_finished and s.num_output_tokens == 3 for s in seqs)
    assert sched.bm.num_free_blocks == sched.bm.num_blocks


def test_chunked_prefill_splits_long_prompt():
    sched = make(budget=16)
    seq = add(sched, 40, max_tokens=2)
    chunks = []
    while seq.num_output_tokens == 0:
        batch = step(sched)
        chunks.append(batch.num_new_tokens[batch.seqs.index(seq)])
    assert chunks == [16, 16, 8]  # only the last chunk samples
    batch = step(sched)
    assert batch.num_new_tokens == [1] and batch.num_decodes == 1
    assert seq.is_finished


def test_without_chunked_prefill_a_prompt_waits_whole():
    sched = make(budget=16, chunked=False)
    a, b = add(sched, 10), add(sched, 10)
    batch = step(sched)
    assert batch.seqs == [a] and batch.num_new_tokens == [10]
    batch = step(sched)
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 10]


def test_decodes_come_before_prefills():
    sched = make(budget=64)
    a = add(sched, 6, max_tokens=10)
    step(sched)
    b = add(sched, 12)
    c = add(sched, 3)
    batch = step(sched)
    assert batch.seqs == [a, b, c]
    assert batch.num_decodes == 1 and batch.num_new_tokens == [1, 12, 3]
    batch = step(sched)
    assert batch.num_decodes == 3 and batch.num_new_tokens == [1, 1, 1]


def test_new_request_joins_running_batch_and_finished_leave():
    sched = make()
    a = add(sched, 5, max_tokens=3)
    step(sched)
    b = add(sched, 5, max_tokens=3)
    assert step(sched).seqs == [a, b]
    step(sched)
    assert a.is_finished and sched.running == [b]
    assert step(sched).seqs == [b]
    assert not sched.has_unfinished()


def test_preemption_newest_first_front_of_waiting_and_recompute():
    # 6 blocks of 4: three 8-token prompts fill the pool; their first decode needs a third block each
    sched = make(num_blocks=6, budget=64, prefix_caching=False)
    a, b, c = (add(sched, 8, max_tokens=3) for _ in range(3))
    d = add(sched, 2, max_tokens=1)
    batch = step(sched)
    assert batch.seqs == [a, b, c] and sched.bm.num_free_blocks == 0
    assert list(sched.waiting) == [d]
    c_tokens = list(c.token_ids)  # 8 prompt tokens + 1 generated

    batch = step(sched)
    assert batch.preempted == [c]  # the newest running sequence goes first
    assert batch.seqs == [a, b] and batch.num_new_tokens == [1, 1]
    assert list(sched.waiting) == [c, d]  # back at the front, ahead of later arrivals
    assert c.status is SequenceStatus.WAITING and c.block_table == [] and c.num_computed_tokens == 0
    assert c.num_preemptions == 1 and sched.num_preemptions == 1
    assert c.token_ids == c_tokens  # its generated token is kept and recomputed

    batch = step(sched)  # a and b need no new block: 10 tokens fit in 3 blocks
    assert batch.seqs == [a, b]
    assert a.is_finished and b.is_finished
    batch = step(sched)
    assert batch.seqs[0] is c and batch.num_new_tokens[0] == 9  # prompt + generated token again
    run_all(sched)
    assert c.is_finished and c.num_output_tokens == 3 and d.is_finished
    assert sched.bm.num_free_blocks == sched.bm.num_blocks


def test_preemption_order_is_newest_first_until_it_fits():
    sched = make(num_blocks=5, budget=64, prefix_caching=False)
    a = add(sched, 12, max_tokens=8)  # 3 blocks
    b = add(sched, 4, max_tokens=8)  # 1 block
    c = add(sched, 4, max_tokens=8)  # 1 block
    step(sched)
    assert sched.bm.num_free_blocks == 0
    # a needs 1 block (13 tokens); b and c need 1 each (5 tokens): c goes, then b; a runs alone
    batch = step(sched)
    assert batch.preempted == [c, b]
    assert batch.seqs == [a]
    assert list(sched.waiting) == [b, c]
    run_all(sched)
    assert all(s.is_finished and s.num_output_tokens == 8 for s in (a, b, c))


def test_preempted_sequence_reuses_its_cached_prefix():
    sched = make(num_blocks=5, budget=64, prefix_caching=True)
    a = add(sched, 8, max_tokens=2)
    c = add(sched, 8, max_tokens=3)
    step(sched)  # 2 + 2 blocks, 1 free
    batch = step(sched)  # a takes the free block; c needs one too and is preempted
    assert batch.preempted == [c] and batch.seqs == [a] and a.is_finished
    batch = step(sched)
    # c's two full blocks were committed before preemption: only its generated token is recomputed
    assert batch.seqs == [c] and batch.num_new_tokens == [1] and c.num_cached_tokens == 8
    run_all(sched)
    assert c.num_output_tokens == 3 and sched.bm.num_free_blocks == sched.bm.num_blocks


def test_preemption_under_load_finishes_everything():
    sched = make(num_blocks=7, budget=64, prefix_caching=True)
    a = add(sched, 8, max_tokens=6)
    b = add(sched, 8, max_tokens=6)
    c = add(sched, 9, max_tokens=6)
    step(sched)  # 2 + 2 + 3 blocks
    batches = run_all(sched)
    preempted = [s for bt in batches for s in bt.preempted]
    assert preempted and preempted[0] is c
    assert all(s.is_finished and s.num_output_tokens == 6 for s in (a, b, c))
    assert sched.bm.num_free_blocks == sched.bm.num_blocks


class Factory:
    """A ConstraintFactory whose grammar compiles until `done` is set."""

    def __init__(self) -> None:
        self.done = False

    def ready(self) -> bool:
        return self.done

    def new(self):
        return object()


def test_constraint_not_ready_waits_without_blocking_others():
    sched = make()
    factory = Factory()
    slow = add(sched, 5, params=SamplingParams(max_tokens=2, constraint=factory))
    fast = add(sched, 5, max_tokens=2)
    later = add(sched, 3, max_tokens=2)
    batch = step(sched)
    assert batch.seqs == [fast, later]
    assert list(sched.waiting) == [slow]  # keeps its place at the front
    step(sched)
    assert fast.is_finished and later.is_finished and slow.status is SequenceStatus.WAITING
    assert not sched.schedule()  # nothing runnable: an empty batch
    factory.done = True
    batch = step(sched)
    assert batch.seqs == [slow]
    run_all(sched)
    assert slow.is_finished


def test_head_of_line_waits_when_blocks_run_out():
    sched = make(num_blocks=4, budget=64)
    a = add(sched, 12, max_tokens=2)  # 3 blocks
    b = add(sched, 8, max_tokens=2)  # 2 blocks: does not fit beside a
    c = add(sched, 2, max_tokens=2)  # would fit, but FCFS keeps it behind b
    batch = step(sched)
    assert batch.seqs == [a]
    assert list(sched.waiting) == [b, c]
    run_all(sched)
    assert all(s.is_finished for s in (a, b, c))


def test_finish_of_waiting_or_running_frees_blocks():
    sched = make(num_blocks=8, budget=8)
    a = add(sched, 20)  # chunked: partially computed after one step
    b = add(sched, 4)
    step(sched)
    assert a.status is SequenceStatus.RUNNING and a.num_computed_tokens == 8
    sched.finish(a)  # abort mid-prefill
    sched.finish(b)  # abort while waiting
    assert not sched.has_unfinished()
    assert sched.bm.num_free_blocks == sched.bm.num_blocks
