"""Pieces shared by the chat, completions and Responses schemas."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_.\-]{1,64}$")]


class Request(BaseModel):
    """Base of request bodies: unknown fields are ignored (clients send many we do not use).

    Strict types, as the OpenAI API checks them: `"stream": "true"`, `"n": "2"` or
    `"temperature": "0.5"` are a 400 naming the field, not coerced (a JSON integer is still a
    valid float)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class Strict(BaseModel):
    """Base of nested request objects whose shape we check (extra keys ignored, strict types)."""

    model_config = ConfigDict(extra="ignore", strict=True)


# bounds of the wire's integers: what SQL's BIGINT and the engine's int64 tensors can hold, and a
# 32-bit ceiling for counts (tokens, k) that no model comes near
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
# ids and names stored in VARCHAR(255) columns (session ids, tool-call ids, tool names)
Id255 = Annotated[str, StringConstraints(min_length=1, max_length=255)]
Name255 = Annotated[str, StringConstraints(max_length=255)]
ModelName = Annotated[str, StringConstraints(max_length=256)]
User = Annotated[str, StringConstraints(max_length=256)]
Metadata = Annotated[
    dict[Annotated[str, StringConstraints(max_length=64)], Annotated[str, StringConstraints(max_length=512)]],
    Field(max_length=16),
]
MaxTokens = Annotated[int, Field(ge=1, le=INT32_MAX)]
N = Annotated[int, Field(ge=1, le=128)]  # the server's own cap (settings.max_n) is checked later
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]


class Wire(BaseModel):
    """Base of response models: dumped with every declared field, None included."""

    model_config = ConfigDict(extra="forbid")


def empty_parameters_as_object(value: Any) -> Any:
    # `{}` (and omitted) mean "no parameters": the arguments are still a JSON object
    return {"type": "object", "properties": {}} if value == {} else value


def arguments_as_json_string(value: Any) -> Any:
    # some clients echo call arguments as an object; the wire type is a JSON string
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return value


class FunctionDefinition(Strict):
    """openai.types.shared_params.FunctionDefinition"""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _parameters = field_validator("parameters")(empty_parameters_as_object)


class StreamOptions(Strict):
    """openai.types.chat.ChatCompletionStreamOptionsParam"""

    include_usage: bool | None = None


Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StopList = Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=16)]


# the sampling fields chat completions and legacy completions share (`x: Type | None = None`);
# top_p 0 is accepted and means greedy (only the most likely token survives)
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Stop = Annotated[str, Field(max_length=512)] | StopList
# keys: token ids as strings (checked against the vocabulary later); at most 1024 entries
LogitBias = Annotated[
    dict[Annotated[str, StringConstraints(max_length=16)], Annotated[float, Field(ge=-100.0, le=100.0)]],
    Field(max_length=1024),
]
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX)]  # -1 and 0: off; larger than the vocabulary: off
MinP = Annotated[float, Field(ge=0.0, le=1.0)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=2.0)]


class CompletionTokensDetails(Wire):
    """openai.types.completion_usage.CompletionTokensDetails"""

    reasoning_tokens: int = 0


class PromptTokensDetails(Wire):
    """openai.types.completion_usage.PromptTokensDetails"""

    cached_tokens: int = 0


class CompletionUsage(Wire):
    """openai.types.CompletionUsage"""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class Model(Wire):
    """openai.types.Model"""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "chatloom"
    max_model_len: int | None = None


class ModelList(Wire):
    """openai.pagination.SyncPage[Model] (the list body of GET /v1/models)"""

    object: Literal["list"] = "list"
    data: list[Model] = Field(default_factory=list)


class TopLogprob(Wire):
    """openai.types.chat.chat_completion_token_logprob.TopLogprob"""

    token: str
    bytes: list[int] | None
    logprob: float


class TokenLogprob(Wire):
    """openai.types.chat.ChatCompletionTokenLogprob"""

    token: str
    bytes: list[int] | None
    logprob: float
    top_logprobs: list[TopLogprob]
