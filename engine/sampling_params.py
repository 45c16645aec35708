"""SamplingParams: how one request is sampled and when it stops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class TokenConstraint(Protocol):
    """Per-sequence state of a constraint on the next token (a grammar matcher).

    The engine calls fill_bitmask for every sequence of a step into one shared bitmask
    (int32, (batch, ceil(vocab / 32)); bit set = token allowed), applies it to the logits,
    samples, then calls accept_token with the chosen id.

    A constraint may also have `fill_bitmasks(bitmask, [(constraint, row, remaining_tokens), ...])`,
    one callable shared by its kind: the engine then fills all rows of that kind in one call (which
    may run them in parallel, without the GIL) instead of calling fill_bitmask per row.
    """

    def fill_bitmask(self, bitmask: Any, row: int, remaining_tokens: int) -> None: ...

    def accept_token(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...


class ConstraintFactory(Protocol):
    """Makes one TokenConstraint per sequence. ready() is False while its grammar still compiles;
    the scheduler leaves such a request waiting without stalling others."""

    def ready(self) -> bool: ...

    def new(self) -> TokenConstraint: ...


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = off
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token; 0 = only the chosen one
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    # per-sequence logits processors: f(generated_ids, logits (vocab,)) -> logits
    logits_processors: list[Callable] = field(default_factory=list)
    constraint: ConstraintFactory | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    @property
    def needs_host_tokens(self) -> bool:
        """Whether the host reads a sequence's previous token before it samples the next one
        (grammar masks, penalties, logits processors); the forward never waits for it."""
        return self.constraint is not None or self.needs_penalties or bool(self.logits_processors)

    @property
    def edits_logits(self) -> bool:
        """Whether the sampler changes this request's logits row before sampling."""
        return bool(self.logit_bias) or self.min_tokens > 0 or self.needs_host_tokens

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
