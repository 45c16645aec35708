"""/v1/sessions: list sessions, read and delete a session's messages."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from app.deps import ApiKey
from app.errors import APIError
from app.memory import repository as repo
from app.memory.deps import DB
from app.memory.models import Message

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
    assistant_id: str | None = None,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0),
) -> dict[str, Any]:
    async with db.session() as s:
        rows = await repo.list_sessions(s, db.history, assistant_id=assistant_id, limit=limit, offset=offset)
    return {
        "object": "list",
        "data": [{**session_out(r), "message_count": r.message_count} for r in rows],
    }


async def _read(db, session_id: str) -> tuple[Any, list[Message]]:
    async with db.session() as s:
        session = await repo.get_session(s, db.history, session_id)
        if session is None:
            raise APIError(f"No session with id {session_id!r}.", 404, param="session_id")
        return session, await repo.get_messages(s, db.history, session_id)


@router.get("/{session_id}")
async def get_session(session_id: str, db: DB) -> dict[str, Any]:
    session, messages = await _read(db, session_id)
    return {**session_out(session), "messages": [message_out(m) for m in messages]}


@router.get("/{session_id}/messages")
async def get_messages(session_id: str, db: DB) -> dict[str, Any]:
    _, messages = await _read(db, session_id)
    return {"object": "list", "data": [message_out(m) for m in messages]}


@router.delete("/{session_id}")
async def delete_session(session_id: str, db: DB) -> dict[str, Any]:
    async with db.session() as s:
        if not await repo.delete_session(s, db.history, session_id):
            raise APIError(f"No session with id {session_id!r}.", 404, param="session_id")
    return {"id": session_id, "object": "session.deleted", "deleted": True}
