"""/v1/sessions: list (and search) sessions, read, rename and delete them, rewind the last exchange:
the caller's own only (app.principal); another caller's session is a 404 like an unknown id."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import Field, field_validator

from app.agent.turn import session_lock
from app.deps import ApiKey, Caller
from app.errors import APIError
from app.memory import repository as repo
from app.memory import session_edits
from app.memory.deps import DB
from app.memory.models import Message
from app.schemas.common import Strict
from app.schemas.query import Offset

router = APIRouter(prefix="/v1/sessions", dependencies=[ApiKey], tags=["sessions"])


def session_out(row: Any) -> dict[str, Any]:
    """The fields a listed session (repo.SessionSummary) and a read one (ChatSession) share."""
    return {
        "id": row.id,
        "object": "session",
        "assistant_id": row.assistant_id,
        "created_at": int(row.created_at.timestamp()),
        "updated_at": int(row.updated_at.timestamp()),
    }


def message_out(m: Message) -> dict[str, Any]:
    return {"id": m.id, "created_at": int(m.created_at.timestamp()), **m.to_openai()}


@router.get("")
async def list_sessions(
    db: DB,
    caller: Caller,
    assistant_id: str | None = None,
    limit: int = Query(50, ge=1, le=500),
    offset: Offset = 0,  # bounded: ?offset=2**63 is a 400, not a database error
    q: str | None = Query(None, max_length=200, description="title or message text contains this"),
) -> dict[str, Any]:
    if q is not None and _unstorable(q):
        raise APIError("q must be text without NUL characters or lone surrogates.", param="q")
    async with db.session() as s:
        rows = await repo.list_sessions(
            s,
            db.history,
            principal=caller,
            assistant_id=assistant_id,
            limit=limit,
            offset=offset,
            query=q.strip() if q else None,
        )
    return {
        "object": "list",
        "data": [{**session_out(r), "title": r.title, "message_count": r.message_count} for r in rows],
    }


async def _read(db, session_id: str, caller) -> tuple[Any, list[Message]]:
    async with db.session() as s:
        session = await repo.visible_session(s, db.history, session_id, caller)
        if session is None:
            raise repo.session_not_found(session_id)
        return session, await repo.get_messages(s, db.history, session_id)


@router.get("/{session_id}")
async def get_session(session_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    session, messages = await _read(db, session_id, caller)
    first_user = next((m.content for m in messages if m.role == "user"), "")
    title = session.title or session_edits.derived_title(first_user)
    return {**session_out(session), "title": title, "messages": [message_out(m) for m in messages]}


def _unstorable(value: str) -> bool:
    """Text neither store takes alike: NUL (PostgreSQL refuses it) or a lone surrogate."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in value


class SessionPatch(Strict):
    # null or blank: back to the title taken from the first message
    title: str | None = Field(max_length=session_edits.MAX_TITLE)

    @field_validator("title")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        if value is not None and _unstorable(value):
            raise ValueError("must be text without NUL characters or lone surrogates")
        return value


@router.patch("/{session_id}")
async def rename_session(session_id: str, body: SessionPatch, db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        session = await repo.visible_session(s, db.history, session_id, caller)
        if session is None:
            raise repo.session_not_found(session_id)
        await session_edits.rename(s, session, body.title)
        given = session.title
        out = session_out(session)
    if given is None:  # derived: read like GET does
        return {**out, "title": (await get_session(session_id, db, caller))["title"]}
    return {**out, "title": given}


@router.post("/{session_id}/rewind")
async def rewind_session(session_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    """Remove the last user message and all that followed it; the answer gives its text back so a
    client can send it again (regenerate) or send an edited version. Waits for a turn that is still
    running in this session (a stopped reply is stored first, then removed)."""
    async with session_lock(session_id), db.session() as s:
        if await repo.visible_session(s, db.history, session_id, caller) is None:
            raise repo.session_not_found(session_id)
        rewound = await session_edits.rewind(s, db.history, session_id)
    if rewound is None:
        raise APIError(
            f"The session {session_id!r} has no user message to rewind.", 409, code="nothing_to_rewind"
        )
    content, removed = rewound
    return {"id": session_id, "object": "session.rewound", "content": content, "removed": removed}


@router.get("/{session_id}/messages")
async def get_messages(session_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    _, messages = await _read(db, session_id, caller)
    return {"object": "list", "data": [message_out(m) for m in messages]}


@router.delete("/{session_id}")
async def delete_session(session_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        if not await repo.delete_session(s, db.history, session_id, caller):
            raise repo.session_not_found(session_id)
    return {"id": session_id, "object": "session.deleted", "deleted": True}
