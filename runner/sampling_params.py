"""SamplingParams: how one request is sampled and when it stops."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_LOGPROBS = 20  # top logprobs per token (OpenAI's bound)
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound on each logit_bias value


def _int(name: str, value: Any, low: int | None = None, high: int | None = None) -> None:
    # bool is an int subclass: True is not a count
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "" if low is None else f">= {low}"
        hi = "" if high is None else f"<= {high}"
        raise ValueError(f"{name} must be {' and '.join(x for x in (lo, hi) if x)}, got {value}")


def _float(name: str, value: Any, low: float | None = None, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    if low is not None and high is not None and not low <= value <= high:
        raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low:g}, got {value}")


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
    # None: the engine's (EngineConfig); "off" opts out; "ngram" / "draft" need the engine's on
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None  # at most the engine's

    def __post_init__(self) -> None:
        """Every numeric field checked against its bounds here, so that nothing out of range reaches
        a kernel (a ValueError names the field; the app answers it with a 400). Bounds that need the
        model (top_k and token ids against the vocabulary) are checked by EngineCore.add_request."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        self.stop = [s for s in self.stop if s]
        _int("n", self.n, 1)
        _float("temperature", self.temperature, 0.0)
        _float("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _int("top_k", self.top_k, -1, INT64_MAX)  # at most the vocabulary: check_vocab
        if self.top_k == 0:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        _float("min_p", self.min_p, 0.0, 1.0)
        _float("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        if self.max_tokens is not None:
            _int("max_tokens", self.max_tokens, 1)
        _int("min_tokens", self.min_tokens, 0)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.seed is not None:
            _int("seed", self.seed, INT64_MIN, INT64_MAX)
        for t in self.stop_token_ids:
            _int("stop_token_ids", t, INT64_MIN, INT64_MAX)  # the vocabulary: check_vocab
        if self.speculative_method not in (None, "off", "ngram", "draft"):
            raise ValueError(f"speculative_method must be off, ngram or draft: {self.speculative_method!r}")
        if self.num_speculative_tokens is not None:
            _int("num_speculative_tokens", self.num_speculative_tokens, 1, 64)
        for t, bias in self.logit_bias.items():
            _int("logit_bias", t, INT64_MIN, INT64_MAX)
            _float("logit_bias", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)

    def check_vocab(self, vocab_size: int) -> None:
        """The bounds that depend on the model: top_k and every token id within the vocabulary."""
        if self.top_k > vocab_size:
            raise ValueError(f"top_k must be at most the vocabulary size {vocab_size}, got {self.top_k}")
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise ValueError(f"{name} token id {bad} is outside the vocabulary (0..{vocab_size - 1})")

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
