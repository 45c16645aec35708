"""What an assistant is, as the API and the YAML seed file take it (validated once, stored as JSON).

{"name", "system_prompt", "model"?, "sampling"?, "memory"?: {"max_turns" | "max_tokens"},
 "tool_choice"?, "tools"?: [{"type": "function", "function": {...},
                             "webhook": {"url", "method", "headers", "timeout_s"}}]}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Webhook(_Strict):
    url: HttpUrl
    method: Literal["POST", "PUT", "PATCH", "GET", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(default=30.0, gt=0, le=600)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI may add fields (strict, ...)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef
    webhook: Webhook


class Memory(_Strict):
    max_turns: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=64)

    @model_validator(mode="after")
    def _one(self) -> Memory:
        if self.max_turns is not None and self.max_tokens is not None:
            raise ValueError("memory takes max_turns or max_tokens, not both")
        return self


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    stop: list[str] | None = None
    repetition_penalty: float | None = Field(default=None, gt=0)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)


class AssistantIn(_Strict):
    id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    name: str = Field(min_length=1, max_length=255)
    system_prompt: str = ""
    model: str | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    memory: Memory = Field(default_factory=Memory)
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    tools: list[Tool] = Field(default_factory=list)

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[Tool]) -> list[Tool]:
        names = [t.function.name for t in tools]
        if len(names) != len(set(names)):
            raise ValueError("tool names must be unique")
        return tools

    @model_validator(mode="after")
    def _choice_names_a_tool(self) -> AssistantIn:
        choice = self.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or not name:
                raise ValueError('tool_choice object must be {"type": "function", "function": {"name": ...}}')
            if name not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        elif choice == "required" and not self.tools:
            raise ValueError('tool_choice "required" needs at least one tool')
        return self

    def to_row(self) -> dict[str, Any]:
        """The JSON-ready fields of the assistants table."""
        data = self.model_dump(mode="json", exclude_none=True, exclude={"id"})
        data.setdefault("model", None)
        data.setdefault("tool_choice", None)
        return data
