"""Chat requests as the prompt renderer and the conversation store take them, and the tools check."""

from __future__ import annotations

from typing import Any

from app.chat.template import ChatMessage
from app.errors import APIError
from app.schemas.chat import AssistantMessage, ChatCompletionRequest, ToolMessage


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def chat_messages(req: ChatCompletionRequest) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        if isinstance(m, AssistantMessage):
            calls = [c.model_dump() for c in m.tool_calls] if m.tool_calls else None
            out.append(ChatMessage("assistant", content_text(m.content), tool_calls=calls))
        elif isinstance(m, ToolMessage):
            out.append(ChatMessage("tool", content_text(m.content), tool_call_id=m.tool_call_id))
        else:
            out.append(ChatMessage(role, content_text(m.content), name=m.name))
    return out


def session_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The request's messages as the conversation store takes them: content as plain text (list
    content parts joined), None fields left out."""
    out = []
    for m in req.messages:
        data = m.model_dump(exclude_none=True)
        if "content" in data:
            data["content"] = content_text(m.content)
        out.append(data)
    return out


def check_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> None:
    """400 for tool_choice that cannot be honoured with the given tools."""
    names = [t["function"]["name"] for t in tools or []]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise APIError(
            f"Function names in 'tools' must be unique; repeated: {', '.join(dupes)}.", param="tools"
        )
    if tool_choice == "required" and not names:
        raise APIError("tool_choice 'required' needs at least one tool in 'tools'.", param="tool_choice")
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        if name not in names:
            raise APIError(
                f"tool_choice names function {name!r}, which is not in 'tools'.", param="tool_choice"
            )
