"""/v1/assistants: named configurations (system prompt, sampling, memory window, webhook tools,
who may call the webhook). Each belongs to the caller that created it (app.principal; seeded ones
to "default", which the key holder reads); secrets are write-only: never shown back."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.agent.config import AssistantIn, public_tools, public_webhook_auth
from app.agent.targets import TargetPolicy
from app.deps import ApiKey, Caller
from app.errors import APIError
from app.memory import repository as repo
from app.memory.deps import DB
from app.memory.models import Assistant
from app.principal import Principal

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
        "tools": public_tools(row.tools),
        "webhook_auth": public_webhook_auth(row.webhook_auth),
        "anonymous_tools": bool(row.anonymous_tools),
    }


async def assistant_or_404(
    s: AsyncSession, assistant_id: str, principal: Principal | None = None
) -> Assistant:
    """The assistant by id; with a principal, only one that caller reads (the webhook takes none:
    an assistant's webhook serves whoever passes its own authentication)."""
    if principal is None:
        row = await repo.get_assistant(s, assistant_id)
    else:
        row = await repo.visible_assistant(s, assistant_id, principal)
    if row is None:
        raise APIError(f"No assistant with id {assistant_id!r}.", 404, param="assistant_id")
    return row


def _exists(assistant_id: str | None) -> APIError:
    return APIError(f"An assistant with id {assistant_id!r} exists.", 409, param="id", code="conflict")


def _check_targets(body: AssistantIn, policy: TargetPolicy) -> None:
    """Webhook URLs the server would refuse to call are refused now (host names are resolved, and
    checked again, at each call)."""
    for i, tool in enumerate(body.tools):
        reason = policy.refusal_for_url(str(tool.webhook.url))
        if reason:
            raise APIError(f"tools[{i}].webhook.url: {reason}", param=f"tools[{i}].webhook.url")


@router.get("")
async def list_assistants(db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        return {"object": "list", "data": [assistant_out(a) for a in await repo.list_assistants(s, caller)]}


@router.post("")
async def create_assistant(body: AssistantIn, db: DB, caller: Caller, request: Request) -> dict[str, Any]:
    _check_targets(body, TargetPolicy.from_settings(request.app.state.settings))
    try:
        async with db.session() as s:
            if body.id and await repo.get_assistant(s, body.id) is not None:
                raise _exists(body.id)
            row = await repo.create_assistant(s, body.to_row(), body.id, owner=caller.id)
            return assistant_out(row)
    except IntegrityError as exc:  # a concurrent create with the same id
        raise _exists(body.id) from exc


@router.get("/{assistant_id}")
async def get_assistant(assistant_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        return assistant_out(await assistant_or_404(s, assistant_id, caller))


@router.delete("/{assistant_id}")
async def delete_assistant(assistant_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        await s.delete(await assistant_or_404(s, assistant_id, caller))
    return {"id": assistant_id, "object": "assistant.deleted", "deleted": True}
