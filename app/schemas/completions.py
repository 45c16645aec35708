"""Legacy completions: openai.types.CompletionCreateParams in, openai.types.Completion out."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.schemas.common import (
    CompletionUsage,
    LogitBias,
    MinP,
    Penalty,
    RepetitionPenalty,
    Request,
    Stop,
    StreamOptions,
    Temperature,
    TopK,
    TopP,
    Wire,
)


class CompletionRequest(Request):
    """openai.types.CompletionCreateParams (one prompt: a string or a list of token ids)"""

    model: str | None = None
    prompt: str | list[int] | Annotated[list[str], Field(min_length=1, max_length=1)]
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: int = Field(default=1, ge=1)
    stop: Stop | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    suffix: str | None = None
    user: str | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None


class CompletionLogprobs(Wire):
    """openai.types.completion_choice.Logprobs"""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class CompletionChoice(Wire):
    """openai.types.CompletionChoice"""

    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = None


class Completion(Wire):
    """openai.types.Completion (also each streamed chunk, with finish_reason None until the end)"""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
