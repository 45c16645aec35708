"""Server-side memory for OpenAI chat completions (`X-Session-Id` header or `session_id` field).

The handler calls load_and_append before rendering and record_reply once the reply is complete:

    history = await load_and_append(app.state.db, session_id, [m.model_dump() ...])
    prompt_ids = app.agent.replay.render_ids(tokenizer, history, tools=tools)  # or its own renderer
    ... generate with retention_key=session_id ...
    await record_reply(app.state.db, session_id, content, tool_calls=calls, token_ids=ids)

Clients differ: some send only the new message, some (n8n) resend the whole history every call.
The request's non-system messages that already end the stored history are not stored twice.

A session belongs to the caller that created it (app.principal): both functions take the caller
as `principal`, by default the one app.deps.require_api_key set for the request being served; a
session id another caller holds is a 404 (APIError), nothing read from it or written into it."""

from __future__ import annotations

from typing import Any

from app import principal as principals
from app.memory import repository as repo
from app.memory.db import Database
from app.principal import Principal


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: their text
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _key(m: dict[str, Any]) -> tuple:
    content = _text(m.get("content")).strip()
    if m.get("role") == "assistant":
        # clients echo calls with reformatted arguments or "" content; compare call names
        names = tuple(c.get("function", {}).get("name") for c in m.get("tool_calls") or [])
        return ("assistant", names or content)
    return (m.get("role"), content, m.get("tool_call_id"))


def _overlap(stored: list[dict], new: list[dict]) -> int:
    """The longest k < len(new) with stored[-k:] == new[:k] (the resent history)."""
    for k in range(min(len(stored), len(new) - 1), 0, -1):
        if [_key(m) for m in stored[-k:]] == [_key(m) for m in new[:k]]:
            return k
    return 0


async def load_and_append(
    db: Database,
    session_id: str,
    messages: list[dict[str, Any]],
    *,
    assistant_id: str | None = None,
    principal: Principal | None = None,
    added: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Store the request's new messages as the session's next turn (committed on return) and
    return the whole conversation to render: the request's system/developer messages, then the
    stored history with the new messages at its end. Generated assistant messages carry
    "token_ids" (see app.agent.replay.render_ids: replaying them keeps the prefix cache warm).
    added: receives the ids of the messages stored now (for forget() when the turn fails)."""
    system = [m for m in messages if m.get("role") in ("system", "developer")]
    rest = [m for m in messages if m.get("role") not in ("system", "developer")]
    principal = principal or principals.current()
    async with db.session() as s:
        await repo.claim_session(s, db.history, session_id, principal, assistant_id)
        stored = [m.to_replay() for m in await repo.get_messages(s, db.history, session_id)]
        fresh = rest[_overlap(stored, rest) :] if stored else rest
        for m in fresh:
            row = await repo.add_message(
                s,
                db.history,
                session_id,
                m["role"],
                _text(m.get("content")),
                tool_calls=m.get("tool_calls") or None,
                tool_call_id=m.get("tool_call_id"),
                name=m.get("name"),
            )
            if added is not None:
                added.append(row.id)
            stored.append({k: v for k, v in m.items() if v is not None})
    return [{"role": "system", "content": _text(m.get("content"))} for m in system] + stored


async def record_reply(
    db: Database,
    session_id: str,
    content: str,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    token_ids: list[int] | None = None,
    principal: Principal | None = None,
) -> None:
    """Store the generated assistant message (token_ids: generated ids, stop token excluded)."""
    principal = principal or principals.current()
    async with db.session() as s:
        await repo.claim_session(s, db.history, session_id, principal)
        await repo.add_message(
            s,
            db.history,
            session_id,
            "assistant",
            content,
            tool_calls=tool_calls or None,
            token_ids=token_ids or None,
        )


async def forget(db: Database, session_id: str, message_ids: list[int]) -> None:
    """Remove messages a failed turn stored (load_and_append's `added`) and their n8n rows."""
    if not message_ids:
        return
    import sqlalchemy as sa

    from app.memory.models import Message

    async with db.session() as s:
        rows = sa.select(Message.n8n_row_id).where(
            Message.session_id == session_id, Message.id.in_(message_ids), Message.n8n_row_id.is_not(None)
        )
        n8n_ids = list((await s.scalars(rows)).all())
        await s.execute(
            sa.delete(Message).where(Message.session_id == session_id, Message.id.in_(message_ids))
        )
        if n8n_ids:
            await s.execute(sa.delete(db.history).where(db.history.c.id.in_(n8n_ids)))
