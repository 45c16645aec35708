"""/v1/sessions: list sessions, read and delete a session's messages: the caller's own only
(app.principal); another caller's session is a 404 like an unknown id."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from app.deps import ApiKey, Caller
from app.memory import repository as repo
from app.memory.deps import DB
from app.memory.models import Message
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
) -> dict[str, Any]:
    async with db.session() as s:
        rows = await repo.list_sessions(
            s, db.history, principal=caller, assistant_id=assistant_id, limit=limit, offset=offset
        )
    return {
        "object": "list",
        "data": [{**session_out(r), "message_count": r.message_count} for r in rows],
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
    return {**session_out(session), "messages": [message_out(m) for m in messages]}


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
