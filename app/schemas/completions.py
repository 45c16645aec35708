"""Legacy completions: openai.types.CompletionCreateParams in, openai.types.Completion out."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.schemas.common import (
    INT32_MAX,
    CompletionUsage,
    LogitBias,
    MaxTokens,
    MinP,
    ModelName,
    N,
    Penalty,
    RepetitionPenalty,
    Request,
    Seed,
    Stop,
    StreamOptions,
    Temperature,
    TopK,
    TopP,
    User,
    Wire,
)


class CompletionRequest(Request):
    """openai.types.CompletionCreateParams (one prompt: a string or a list of token ids)"""

    model: ModelName | None = None
    # token ids: checked against the vocabulary later; the bound keeps them inside int64
    prompt: (
        str
        | list[Annotated[int, Field(ge=-INT32_MAX, le=INT32_MAX)]]
        | Annotated[list[str], Field(min_length=1, max_length=1)]
    )
    max_tokens: MaxTokens | None = 16
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: N = 1
    stop: Stop | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    suffix: str | None = None
    user: User | None = None
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
