"""Chat Completions: the request we accept (openai.types.chat.CompletionCreateParams) and what we
answer (openai.types.chat.ChatCompletion / ChatCompletionChunk)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from app.schemas.common import (
    CompletionUsage,
    FunctionDefinition,
    FunctionName,
    Id255,
    LogitBias,
    MaxTokens,
    Metadata,
    MinP,
    ModelName,
    N,
    Name255,
    Penalty,
    RepetitionPenalty,
    Request,
    Seed,
    Stop,
    StreamOptions,
    Strict,
    Temperature,
    TokenLogprob,
    TopK,
    TopP,
    User,
    Wire,
    arguments_as_json_string,
)

# ---- request -------------------------------------------------------------------------------------


class TextPart(Strict):
    """openai.types.chat.ChatCompletionContentPartTextParam"""

    type: Literal["text"]
    text: str


Content = str | list[TextPart]


class SystemMessage(Strict):
    """openai.types.chat.ChatCompletionSystemMessageParam"""

    role: Literal["system"]
    content: Content
    name: Name255 | None = None


class DeveloperMessage(Strict):
    """openai.types.chat.ChatCompletionDeveloperMessageParam"""

    role: Literal["developer"]
    content: Content
    name: Name255 | None = None


class UserMessage(Strict):
    """openai.types.chat.ChatCompletionUserMessageParam (text parts only)"""

    role: Literal["user"]
    content: Content
    name: Name255 | None = None


class ToolCallFunction(Strict):
    """openai.types.chat.chat_completion_message_function_tool_call_param.Function"""

    name: Name255
    arguments: str = "{}"

    _arguments = field_validator("arguments", mode="before")(arguments_as_json_string)


class ToolCallParam(Strict):
    """openai.types.chat.ChatCompletionMessageFunctionToolCallParam"""

    id: Id255
    type: Literal["function"] = "function"
    function: ToolCallFunction


class AssistantMessage(Strict):
    """openai.types.chat.ChatCompletionAssistantMessageParam (content "" or null with tool_calls)"""

    role: Literal["assistant"]
    content: Content | None = None
    tool_calls: list[ToolCallParam] | None = None
    name: Name255 | None = None
    refusal: str | None = None


class ToolMessage(Strict):
    """openai.types.chat.ChatCompletionToolMessageParam"""

    role: Literal["tool"]
    content: Content
    tool_call_id: Id255


Message = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]


class ChatTool(Strict):
    """openai.types.chat.ChatCompletionFunctionToolParam"""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: Name255


class NamedToolChoice(Strict):
    """openai.types.chat.ChatCompletionNamedToolChoiceParam"""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JSONSchemaFormat(Strict):
    """openai.types.shared_params.response_format_json_schema.JSONSchema"""

    name: FunctionName
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatText(Strict):
    """openai.types.shared_params.ResponseFormatText"""

    type: Literal["text"]


class ResponseFormatJSONObject(Strict):
    """openai.types.shared_params.ResponseFormatJSONObject"""

    type: Literal["json_object"]


class ResponseFormatJSONSchema(Strict):
    """openai.types.shared_params.ResponseFormatJSONSchema"""

    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema, Field(discriminator="type")
]


class ChatCompletionRequest(Request):
    """openai.types.chat.CompletionCreateParams (plus top_k / min_p / repetition_penalty)"""

    model: ModelName | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: N = 1
    stop: Stop | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    user: User | None = None
    store: bool | None = None
    metadata: Metadata | None = None
    # not in the OpenAI API: server-side memory (also the X-Session-Id header), vLLM-style sampling
    session_id: str | None = Field(default=None, min_length=1, max_length=255)
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None


# ---- response ------------------------------------------------------------------------------------


class FunctionCall(Wire):
    """openai.types.chat.chat_completion_message_function_tool_call.Function"""

    name: str
    arguments: str


class ChatCompletionMessageToolCall(Wire):
    """openai.types.chat.ChatCompletionMessageFunctionToolCall"""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatCompletionMessage(Wire):
    """openai.types.chat.ChatCompletionMessage"""

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ChatCompletionMessageToolCall] | None = None


class ChoiceLogprobs(Wire):
    """openai.types.chat.chat_completion.ChoiceLogprobs"""

    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class Choice(Wire):
    """openai.types.chat.chat_completion.Choice"""

    index: int
    message: ChatCompletionMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Wire):
    """openai.types.chat.ChatCompletion"""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None


class ChoiceDeltaToolCallFunction(Wire):
    """openai.types.chat.chat_completion_chunk.ChoiceDeltaToolCallFunction"""

    name: str | None = None
    arguments: str | None = None


class ChoiceDeltaToolCall(Wire):
    """openai.types.chat.chat_completion_chunk.ChoiceDeltaToolCall"""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChoiceDeltaToolCallFunction | None = None


class ChoiceDelta(Wire):
    """openai.types.chat.chat_completion_chunk.ChoiceDelta"""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None


class ChunkChoice(Wire):
    """openai.types.chat.chat_completion_chunk.Choice"""

    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None


class ChatCompletionChunk(Wire):
    """openai.types.chat.ChatCompletionChunk"""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
