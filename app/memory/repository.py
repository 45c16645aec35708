"""Repository functions over one AsyncSession (the caller owns the transaction).

Every message write goes to `messages` and, in the same transaction, to the n8n history table in
n8n's flat LangChain shape; rows that n8n wrote there (no `messages.n8n_row_id` points at them)
are imported into `messages` when a session is read, so both sides see one history.

Every session and assistant has an owner (app.principal). The functions that take a `principal`
treat rows of other owners as absent: visible_session and claim_session are the way in for a
caller; get_messages and add_message act on a session the caller already holds. A session that
exists only in n8n's table belongs to DEFAULT once imported."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.errors import APIError
from app.memory import session_edits
from app.memory.models import Assistant, ChatSession, Message, utcnow
from app.memory.n8n_table import from_langchain, to_langchain
from app.principal import DEFAULT, OPEN, Principal

ASSISTANT_FIELDS = (
    "name",
    "system_prompt",
    "model",
    "sampling",
    "memory",
    "tool_choice",
    "tools",
    "webhook_auth",
    "anonymous_tools",
)
# fields a re-seeded assistant takes even when None (back to the server's default)
_NULLABLE = ("model", "tool_choice", "webhook_auth")


# ---- assistants ---------------------------------------------------------------------------------


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]
    return f"{slug or 'asst'}-{secrets.token_hex(3)}"


async def get_assistant(s: AsyncSession, assistant_id: str) -> Assistant | None:
    return await s.get(Assistant, assistant_id)


async def visible_assistant(s: AsyncSession, assistant_id: str, principal: Principal) -> Assistant | None:
    """The assistant if this caller owns (or reads) it: what /v1/assistants shows and deletes."""
    row = await s.get(Assistant, assistant_id)
    return row if row is not None and principal.can_read(row.owner) else None


async def list_assistants(s: AsyncSession, principal: Principal = OPEN) -> list[Assistant]:
    q = (
        sa.select(Assistant)
        .where(Assistant.owner.in_(sorted(principal.reads)))
        .order_by(Assistant.created_at, Assistant.id)
    )
    return list((await s.scalars(q)).all())


async def create_assistant(
    s: AsyncSession, data: dict[str, Any], assistant_id: str | None = None, *, owner: str = DEFAULT
) -> Assistant:
    fields = {k: data[k] for k in ASSISTANT_FIELDS if data.get(k) is not None}
    fields.setdefault("system_prompt", "")
    fields.setdefault("sampling", {})
    fields.setdefault("memory", {})
    fields.setdefault("tools", [])
    fields["owner"] = owner
    row = Assistant(id=assistant_id or data.get("id") or _slug(fields.get("name", "")), **fields)
    s.add(row)
    await s.flush()
    return row


async def upsert_assistant(s: AsyncSession, data: dict[str, Any], assistant_id: str) -> Assistant:
    row = await s.get(Assistant, assistant_id)
    if row is None:
        return await create_assistant(s, data, assistant_id)
    for key in ASSISTANT_FIELDS:
        if key in data and (data[key] is not None or key in _NULLABLE):
            setattr(row, key, data[key])
    await s.flush()
    return row


# ---- sessions and messages ----------------------------------------------------------------------


def _insert(s: AsyncSession, table):
    dialect = s.bind.dialect.name
    return (pg_insert if dialect == "postgresql" else sqlite_insert)(table)


def session_not_found(session_id: str) -> APIError:
    # the same answer whether the id is unknown or another caller's: no one learns what others hold
    return APIError(f"No session with id {session_id!r}.", 404, param="session_id", code="session_not_found")


async def ensure_session(
    s: AsyncSession,
    session_id: str,
    assistant_id: str | None = None,
    *,
    lock: bool = False,
    owner: str = DEFAULT,
) -> ChatSession:
    """Get or create (race-free: INSERT .. ON CONFLICT DO NOTHING), whoever owns it: callers
    check the owner (claim_session does). lock: hold the row (SELECT .. FOR UPDATE on
    PostgreSQL) until the transaction ends. owner: the owner of a new row."""
    row = await s.get(ChatSession, session_id)
    if row is None:
        now = utcnow()
        await s.execute(
            _insert(s, ChatSession.__table__)
            .values(id=session_id, assistant_id=assistant_id, owner=owner, created_at=now, updated_at=now)
            .on_conflict_do_nothing(index_elements=["id"])
        )
    if row is None or lock:
        row = await s.get(ChatSession, session_id, with_for_update=lock, populate_existing=True)
    if assistant_id and row.assistant_id is None and row.owner == owner:
        row.assistant_id = assistant_id
    return row


async def session_exists(s: AsyncSession, history: sa.Table, session_id: str) -> bool:
    """Whether anyone holds this id (a session, or rows in n8n's table), whoever it is."""
    if await s.get(ChatSession, session_id) is not None:
        return True
    q = sa.select(history.c.id).where(history.c.session_id == session_id).limit(1)
    return (await s.execute(q)).first() is not None


async def visible_session(
    s: AsyncSession, history: sa.Table, session_id: str, principal: Principal
) -> ChatSession | None:
    """The session if it exists and this caller reads its owner (n8n's newer rows imported),
    else None. A session only n8n's table holds is imported (as DEFAULT's) for a caller that
    reads DEFAULT."""
    row = await s.get(ChatSession, session_id)
    if row is not None:
        if not principal.can_read(row.owner):
            return None
        await import_n8n_rows(s, history, session_id)
        return row
    if principal.can_read(DEFAULT) and await import_n8n_rows(s, history, session_id):
        return await s.get(ChatSession, session_id)
    return None


async def claim_session(
    s: AsyncSession,
    history: sa.Table,
    session_id: str,
    principal: Principal,
    assistant_id: str | None = None,
) -> ChatSession:
    """The caller's session, created for it when the id is new anywhere (sessions and n8n's
    table). An id another owner holds is a 404: nothing is read from it or written into it."""
    row = await visible_session(s, history, session_id, principal)
    if row is None:
        if await session_exists(s, history, session_id):
            raise session_not_found(session_id)
        row = await ensure_session(s, session_id, assistant_id, owner=principal.id)
        if not principal.can_read(row.owner):  # another caller created it in between
            raise session_not_found(session_id)
    if assistant_id and row.assistant_id is None:
        row.assistant_id = assistant_id
    return row


async def add_message(
    s: AsyncSession,
    history: sa.Table,
    session_id: str,
    role: str,
    content: str,
    *,
    tool_calls: list[dict] | None = None,
    tool_call_id: str | None = None,
    name: str | None = None,
    token_ids: list[int] | None = None,
) -> Message:
    """Append one message (and its n8n mirror row). The session must exist."""
    lc = to_langchain(role, content, tool_calls, tool_call_id, name)
    row_id = (
        await s.execute(sa.insert(history).values(session_id=session_id, message=lc).returning(history.c.id))
    ).scalar_one()
    msg = Message(
        session_id=session_id,
        role=role,
        content=content or "",
        tool_calls=tool_calls or None,
        tool_call_id=tool_call_id,
        name=name,
        token_ids=token_ids,
        n8n_row_id=row_id,
    )
    s.add(msg)
    await s.execute(sa.update(ChatSession).where(ChatSession.id == session_id).values(updated_at=utcnow()))
    await s.flush()
    return msg


async def import_n8n_rows(s: AsyncSession, history: sa.Table, session_id: str) -> int:
    """Copy rows n8n wrote for this session into `messages`; returns how many."""
    mirrored = sa.select(Message.n8n_row_id).where(
        Message.session_id == session_id, Message.n8n_row_id.is_not(None)
    )
    foreign = (
        sa.select(history.c.id, history.c.message)
        .where(history.c.session_id == session_id, history.c.id.not_in(mirrored))
        .order_by(history.c.id)
    )
    if not (await s.execute(foreign)).first():
        return 0
    # concurrent readers of one session: the session row lock makes one of them import, the
    # other then finds nothing left (the common path above takes no lock)
    await ensure_session(s, session_id, lock=True)
    rows = (await s.execute(foreign)).all()
    for row_id, message in rows:
        m = from_langchain(message)
        s.add(Message(session_id=session_id, n8n_row_id=row_id, **m))
    await s.flush()
    return len(rows)


async def get_messages(s: AsyncSession, history: sa.Table, session_id: str) -> list[Message]:
    await import_n8n_rows(s, history, session_id)
    q = sa.select(Message).where(Message.session_id == session_id).order_by(Message.id)
    return list((await s.scalars(q)).all())


@dataclass
class SessionSummary:
    id: str
    assistant_id: str | None
    created_at: datetime
    updated_at: datetime
    message_count: int
    title: str = ""  # the given title, else the start of the first user message (session_edits)


async def list_sessions(
    s: AsyncSession,
    history: sa.Table,
    *,
    principal: Principal = OPEN,
    assistant_id: str | None = None,
    limit: int = 50,
    offset: int = 0,
    query: str | None = None,
) -> list[SessionSummary]:
    """The caller's sessions, most recently active first; for a caller that reads DEFAULT, the
    sessions that exist only in the n8n table are imported first. query: only the sessions whose
    title or some message contains it (case-insensitive)."""
    if principal.can_read(DEFAULT):
        foreign = (
            await s.scalars(
                sa.select(history.c.session_id)
                .distinct()
                .where(history.c.session_id.not_in(sa.select(ChatSession.id)))
            )
        ).all()
        for sid in foreign:
            await import_n8n_rows(s, history, sid)
    counts = (
        sa.select(Message.session_id, sa.func.count(Message.id).label("n"))
        .group_by(Message.session_id)
        .subquery()
    )
    q = (
        sa.select(ChatSession, sa.func.coalesce(counts.c.n, 0))
        .outerjoin(counts, counts.c.session_id == ChatSession.id)
        .where(ChatSession.owner.in_(sorted(principal.reads)))
        .order_by(ChatSession.updated_at.desc(), ChatSession.id)
        .limit(limit)
        .offset(offset)
    )
    if assistant_id is not None:
        q = q.where(ChatSession.assistant_id == assistant_id)
    if query:
        q = q.where(session_edits.matches(query))
    rows = (await s.execute(q)).all()
    titles = await session_edits.titles(s, [row for row, _ in rows])
    return [
        SessionSummary(row.id, row.assistant_id, row.created_at, row.updated_at, int(n), titles[row.id])
        for row, n in rows
    ]


async def delete_session(
    s: AsyncSession, history: sa.Table, session_id: str, principal: Principal = OPEN
) -> bool:
    """Delete the caller's session, its messages and its n8n rows. False if it has none such."""
    if await visible_session(s, history, session_id, principal) is None:
        return False
    gone = (await s.execute(sa.delete(history).where(history.c.session_id == session_id))).rowcount
    gone += (await s.execute(sa.delete(Message).where(Message.session_id == session_id))).rowcount
    gone += (await s.execute(sa.delete(ChatSession).where(ChatSession.id == session_id))).rowcount
    return gone > 0
