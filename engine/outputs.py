"""What the engine hands back: per-step deltas (online) and finished results (offline)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class StepOutput:
    """New tokens of one sequence since its last StepOutput (AsyncEngine.generate yields these)."""

    request_id: str
    index: int  # which of the request's n sequences
    new_token_ids: list[int]
    text_delta: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" once finished
    logprobs: list[TokenLogprob] | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    error: str | None = None  # with finish_reason "error": what failed for this sequence alone


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None


@dataclass
class RequestOutput:
    """A finished request of LLM.generate: one CompletionOutput per sample (n)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    cached_tokens: int = 0

    # the first sample, for the common n=1 case
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason
