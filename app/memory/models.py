"""Typed ORM models. The schema changes only through migrations/ (Alembic)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from app.memory.n8n_table import JSONType
from app.principal import DEFAULT


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)  # stored naive, always UTC


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONType, list[Any]: JSONType}


class Assistant(Base):
    """A named configuration: model, system prompt, sampling, memory window, tools."""

    __tablename__ = "assistants"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    system_prompt: Mapped[str] = mapped_column(sa.Text, default="")
    model: Mapped[str | None] = mapped_column(sa.String(255))
    sampling: Mapped[dict[str, Any]] = mapped_column(default=dict)  # temperature, top_p, max_tokens, ...
    memory: Mapped[dict[str, Any]] = mapped_column(default=dict)  # {"max_turns": n} | {"max_tokens": n}
    tool_choice: Mapped[Any | None] = mapped_column(JSONType)  # first tool round only
    tools: Mapped[list[Any]] = mapped_column(default=list)  # OpenAI function tools + "webhook"
    # app.principal: who created it (lists and reads under /v1); the webhook serves it to its callers
    owner: Mapped[str] = mapped_column(sa.String(128), default=DEFAULT, server_default=DEFAULT)
    # who may call its webhook: {"type": "none"} | {"type": "basic", "user", "password_hash"} |
    # {"type": "header", "name", "value_hash"}; None: the server's CHATLOOM_WEBHOOK_AUTH
    webhook_auth: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # whether anonymous webhook callers (an open webhook on a server with a key) may run its tools
    anonymous_tools: Mapped[bool] = mapped_column(default=False, server_default=sa.false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ChatSession(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)  # n8n sessionId / X-Session-Id
    assistant_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("assistants.id", ondelete="SET NULL"), index=True
    )
    # app.principal: the only caller that sees this session (every other one gets a 404)
    owner: Mapped[str] = mapped_column(sa.String(128), default=DEFAULT, server_default=DEFAULT, index=True)
    # a name the user gave it; None: lists show the start of its first user message
    title: Mapped[str | None] = mapped_column(sa.String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    messages: Mapped[list[Message]] = relationship(
        back_populates="session", order_by="Message.id", cascade="all, delete-orphan", passive_deletes=True
    )


class Message(Base):
    """One chat message; order within a session is the id order."""

    __tablename__ = "messages"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(sa.ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(sa.String(16))  # system | user | assistant | tool
    content: Mapped[str] = mapped_column(sa.Text, default="")
    # OpenAI form: [{"id", "type": "function", "function": {"name", "arguments": str}}]
    tool_calls: Mapped[list[Any] | None] = mapped_column(JSONType)
    tool_call_id: Mapped[str | None] = mapped_column(sa.String(255))
    name: Mapped[str | None] = mapped_column(sa.String(255))  # the tool's name on tool results
    # the ids the engine generated for this assistant message (stop token excluded): replayed
    # verbatim so the next turn's prompt extends this turn's token for token
    token_ids: Mapped[list[Any] | None] = mapped_column(JSONType)
    # the mirrored row in the n8n history table (None until mirrored)
    n8n_row_id: Mapped[int | None] = mapped_column(sa.Integer, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    session: Mapped[ChatSession] = relationship(back_populates="messages")

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if self.name:
                out["name"] = self.name
        return out

    def to_replay(self) -> dict[str, Any]:
        """to_openai() plus the generated ids of assistant messages (app.agent.replay splices them)."""
        out = self.to_openai()
        if self.role == "assistant" and self.token_ids:
            out["token_ids"] = self.token_ids
        return out
