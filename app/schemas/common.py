"""Pieces shared by the chat, completions and Responses schemas."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_.\-]{1,64}$")]


class Request(BaseModel):
    """Base of request bodies: unknown fields are ignored (clients send many we do not use)."""

    model_config = ConfigDict(extra="ignore")


class Strict(BaseModel):
    """Base of nested request objects whose shape we check (extra keys still ignored)."""

    model_config = ConfigDict(extra="ignore")


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


# the sampling fields chat completions and legacy completions share (`x: Type | None = None`)
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopP = Annotated[float, Field(ge=0.0, le=1.0)]
Stop = Annotated[str, Field(max_length=512)] | StopList
LogitBias = dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]
TopK = Annotated[int, Field(ge=-1)]
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
