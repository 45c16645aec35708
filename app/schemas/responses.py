"""Responses API: the request we accept (openai.types.responses.ResponseCreateParams, function tools
only) and what we answer (openai.types.responses.Response and its stream events)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from app.schemas.common import (
    FunctionName,
    Id255,
    MaxTokens,
    Metadata,
    ModelName,
    Name255,
    Request,
    Strict,
    Temperature,
    TopP,
    User,
    Wire,
    arguments_as_json_string,
    empty_parameters_as_object,
)


class InputText(Strict):
    """openai.types.responses.ResponseInputTextParam"""

    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    """openai.types.responses.ResponseOutputTextParam (assistant text echoed back in `input`)"""

    type: Literal["output_text"]
    text: str


InputPart = Annotated[InputText | OutputText, Field(discriminator="type")]


class InputMessage(Strict):
    """openai.types.responses.EasyInputMessageParam / ResponseInputItemParam.Message"""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: Name255 | None = None


class FunctionCallItem(Strict):
    """openai.types.responses.ResponseFunctionToolCallParam"""

    type: Literal["function_call"]
    call_id: Id255
    name: Name255
    arguments: str = "{}"
    id: Name255 | None = None

    _arguments = field_validator("arguments", mode="before")(arguments_as_json_string)


class FunctionCallOutputItem(Strict):
    """openai.types.responses.response_input_item_param.FunctionCallOutput"""

    type: Literal["function_call_output"]
    call_id: Id255
    output: str | list[InputText]
    id: Name255 | None = None


def _item_kind(value: Any) -> str:
    # a message may leave out "type" (EasyInputMessage)
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


class FunctionToolParam(Strict):
    """openai.types.responses.FunctionToolParam (FunctionDefinition's fields, flat; `type` first:
    it is what a non-function tool gets reported on)"""

    type: Literal["function"]
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _parameters = field_validator("parameters")(empty_parameters_as_object)


class ToolChoiceFunction(Strict):
    """openai.types.responses.ToolChoiceFunctionParam"""

    type: Literal["function"]
    name: Name255


class FormatText(Strict):
    """openai.types.ResponseFormatText"""

    type: Literal["text"]


class FormatJSONObject(Strict):
    """openai.types.ResponseFormatJSONObject"""

    type: Literal["json_object"]


class FormatJSONSchema(Strict):
    """openai.types.responses.ResponseFormatTextJSONSchemaConfigParam"""

    type: Literal["json_schema"]
    name: FunctionName
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    """openai.types.responses.ResponseTextConfigParam"""

    format: (
        Annotated[FormatText | FormatJSONObject | FormatJSONSchema, Field(discriminator="type")] | None
    ) = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(Request):
    """openai.types.responses.ResponseCreateParams (function tools; no stored state)"""

    model: ModelName | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionToolParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    text: TextConfig | None = None
    metadata: Metadata | None = None
    store: bool | None = None
    previous_response_id: Name255 | None = None
    user: User | None = None


class ResponseUsage(Wire):
    """openai.types.responses.ResponseUsage"""

    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseOutputText(Wire):
    """openai.types.responses.ResponseOutputText"""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ResponseOutputMessage(Wire):
    """openai.types.responses.ResponseOutputMessage"""

    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[ResponseOutputText]


class ResponseFunctionToolCall(Wire):
    """openai.types.responses.ResponseFunctionToolCall"""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class Response(Wire):
    """openai.types.responses.Response"""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[ResponseOutputMessage | ResponseFunctionToolCall]
    parallel_tool_calls: bool
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: Any
    tools: list[dict[str, Any]]
    text: dict[str, Any] | None = None
    usage: ResponseUsage | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
