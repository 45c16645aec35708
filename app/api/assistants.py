"""/v1/assistants: named configurations (system prompt, sampling, memory window, webhook tools)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.agent.config import AssistantIn
from app.deps import ApiKey
from app.errors import APIError
from app.memory import repository as repo
from app.memory.deps import DB
from app.memory.models import Assistant

router = APIRouter(prefix="/v1/assistants", dependencies=[ApiKey], tags=["assistants"])


def assistant_out(row: Assistant) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "assistant",
        "created_at": int(row.created_at.timestamp()),
        "name": row.name,
        "system_prompt": row.system_prompt,
        "model": row.model,
        "sampling": row.sampling,
        "memory": row.memory,
        "tool_choice": row.tool_choice,
        "tools": row.tools,
    }


async def assistant_or_404(s: AsyncSession, assistant_id: str) -> Assistant:
    row = await repo.get_assistant(s, assistant_id)
    if row is None:
        raise APIError(f"No assistant with id {assistant_id!r}.", 404, param="assistant_id")
    return row


def _exists(assistant_id: str | None) -> APIError:
    return APIError(f"An assistant with id {assistant_id!r} exists.", 409, param="id", code="conflict")


@router.get("")
async def list_assistants(db: DB) -> dict[str, Any]:
    async with db.session() as s:
        return {"object": "list", "data": [assistant_out(a) for a in await repo.list_assistants(s)]}


@router.post("")
async def create_assistant(body: AssistantIn, db: DB) -> dict[str, Any]:
    try:
        async with db.session() as s:
            if body.id and await repo.get_assistant(s, body.id) is not None:
                raise _exists(body.id)
            row = await repo.create_assistant(s, body.to_row(), body.id)
            return assistant_out(row)
    except IntegrityError as exc:  # a concurrent create with the same id
        raise _exists(body.id) from exc


@router.get("/{assistant_id}")
async def get_assistant(assistant_id: str, db: DB) -> dict[str, Any]:
    async with db.session() as s:
        return assistant_out(await assistant_or_404(s, assistant_id))


@router.delete("/{assistant_id}")
async def delete_assistant(assistant_id: str, db: DB) -> dict[str, Any]:
    async with db.session() as s:
        await s.delete(await assistant_or_404(s, assistant_id))
    return {"id": assistant_id, "object": "assistant.deleted", "deleted": True}
