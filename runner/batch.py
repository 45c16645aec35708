"""One step's work as the scheduler hands it to the model runner: the sequences in the step, decodes
first (one token each), then prefill chunks, and the tokens each one computes. No torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.sequence import Sequence


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
