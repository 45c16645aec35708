"""What the web chat changes in a session besides adding messages: its title (given, or taken from
the first user message), a search over titles and messages, and rewinding the last exchange (the
last user message and everything after it go, for "regenerate" and "edit and resend")."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.memory.models import ChatSession, Message

TITLE_CHARS = 60  # a derived title: the first user message cut to this many characters
MAX_TITLE = 200  # the column's width


def derived_title(first_user_text: str) -> str:
    text = " ".join(first_user_text.split())  # one line: newlines and runs of spaces collapse
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1].rstrip() + "\u2026"


def _like(query: str) -> str:
    escaped = query.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def matches(query: str) -> sa.ColumnElement[bool]:
    """A WHERE clause on ChatSession: the title or some user/assistant message contains `query`."""
    pattern = _like(query)
    in_messages = (
        sa.select(Message.id)
        .where(
            Message.session_id == ChatSession.id,
            Message.role.in_(("user", "assistant")),
            sa.func.lower(Message.content).like(pattern, escape="\\"),
        )
        .exists()
    )
    return sa.or_(sa.func.lower(ChatSession.title).like(pattern, escape="\\"), in_messages)


async def titles(s: AsyncSession, sessions: list[ChatSession]) -> dict[str, str]:
    """Each session's title: the given one, else derived from its first user message ("" if none)."""
    out = {row.id: row.title or "" for row in sessions}
    untitled = [sid for sid, title in out.items() if not title]
    if untitled:
        first = (
            sa.select(sa.func.min(Message.id))
            .where(Message.session_id.in_(untitled), Message.role == "user")
            .group_by(Message.session_id)
        )
        q = sa.select(Message.session_id, Message.content).where(Message.id.in_(first))
        for sid, content in (await s.execute(q)).all():
            out[sid] = derived_title(content or "")
    return out


async def rename(s: AsyncSession, session: ChatSession, title: str | None) -> None:
    """Set the title; None or blank goes back to the derived one."""
    cleaned = " ".join((title or "").split())[:MAX_TITLE]
    session.title = cleaned or None
    await s.flush()


async def rewind(s: AsyncSession, history: sa.Table, session_id: str) -> tuple[str, int] | None:
    """Delete the last user message and every message after it (their n8n rows too); returns the
    deleted user message's text and how many messages went, or None when the session has no user
    message (nothing is deleted)."""
    last_user = await s.scalar(
        sa.select(Message)
        .where(Message.session_id == session_id, Message.role == "user")
        .order_by(Message.id.desc())
        .limit(1)
    )
    if last_user is None:
        return None
    doomed = (
        await s.execute(
            sa.select(Message.id, Message.n8n_row_id).where(
                Message.session_id == session_id, Message.id >= last_user.id
            )
        )
    ).all()
    n8n_ids = [row_id for _, row_id in doomed if row_id is not None]
    text = last_user.content
    await s.execute(sa.delete(Message).where(Message.session_id == session_id, Message.id >= last_user.id))
    if n8n_ids:
        await s.execute(sa.delete(history).where(history.c.id.in_(n8n_ids)))
    return text, len(doomed)
