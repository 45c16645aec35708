"""Pieces shared by the chat, completions and Responses schemas."""

from __future__ import annotations

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


class FunctionDefinition(Strict):
    """openai.types.shared_params.FunctionDefinition"""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _parameters = field_validator("parameters")(empty_parameters_as_object)


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
