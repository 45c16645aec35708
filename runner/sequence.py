"""Per-sequence state: tokens, KV blocks, progress, detokenizer and constraint state. No torch."""

from __future__ import annotations

import enum
import itertools
import time
from typing import Any

from runner.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()

PENDING = -1  # placeholder for a sampled token whose value is still on the device


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        index: int = 0,
        retention_key: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.index = index  # which of the request's n samples
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + generated
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.retention_key = retention_key
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []  # only appended to; freeing gives a new list
        self.table_row = -1  # its row in the model runner's host copy of block tables; -1: not copied
        self.block_hashes: list[int] = []  # chain hashes of this sequence's full blocks, in order
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.finish_reason: str | None = None
        self.error: str | None = None  # why this sequence failed alone (finish_reason "error")
        self.stop_reason: str | int | None = None
        self.num_preemptions = 0
        self.pending_row = -1  # row of its last token in the in-flight step's sampled ids
        self.done_scheduling = False  # its final token is in flight: never scheduled again
        # owned by other layers; kept here so a request is one object
        self.detok: Any = None
        self.constraint: Any = None
        self.generator: Any = None
        self.spec: Any = None  # speculative.SpecState once it speculates
        self.spec_tokens: list[int] = []  # proposals verified by the step it is scheduled in
        self.logprobs: list | None = [] if params.logprobs is not None else None
        # read every step for every row: the request's params never change, so decided once
        self.needs_host_tokens = params.needs_host_tokens
        self.edits_logits = params.edits_logits

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def status(self) -> SequenceStatus:
        return self._status

    @status.setter
    def status(self, value: SequenceStatus) -> None:
        self._status = value
        self.is_finished = value is SequenceStatus.FINISHED  # a plain attribute: read per token

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, req={self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)}, {self.status.value})"
        )
