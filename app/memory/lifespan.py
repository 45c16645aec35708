"""Startup and shutdown of the conversation store, called from app.main's lifespan:
migrate to head, seed assistants (`default` and the YAML file), open the webhook HTTP client.
Migrating and seeding run under Database.startup_lock(): one replica at a time."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from app.agent.config import AssistantIn
from app.memory import repository as repo
from app.memory.db import Database

log = logging.getLogger("chatloom.memory")

DEFAULT_ASSISTANT = AssistantIn(
    id="default",
    name="Default assistant",
    system_prompt="You are a helpful assistant.",
)


def load_assistants_file(path: Path) -> list[AssistantIn]:
    """YAML: a list of assistants, or {"assistants": [...]}; each needs an `id`."""
    data: Any = yaml.safe_load(Path(path).read_text()) or []
    if isinstance(data, dict):
        data = data.get("assistants", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of assistants")
    out = []
    for i, item in enumerate(data):
        try:
            spec = AssistantIn.model_validate(item)
        except ValidationError as exc:
            raise ValueError(f"{path}: assistant #{i}: {exc}") from exc
        if not spec.id:
            raise ValueError(f"{path}: assistant #{i} ({spec.name!r}) needs an id")
        out.append(spec)
    return out


async def seed_assistants(db: Database, assistants_file: Path | None) -> None:
    async with db.session() as s:
        # `default` is created once and then belongs to the user; the file is re-applied each start
        if await repo.get_assistant(s, "default") is None:
            await repo.create_assistant(s, DEFAULT_ASSISTANT.to_row(), "default")
        if assistants_file:
            for spec in load_assistants_file(assistants_file):
                await repo.upsert_assistant(s, spec.to_row(), spec.id)


async def startup(app, settings) -> None:
    db = Database(
        settings.database_url,
        settings.n8n_history_table,
        timeout_s=getattr(settings, "database_timeout_s", 10.0),
        pool_size=getattr(settings, "database_pool_size", 5),
        max_overflow=getattr(settings, "database_max_overflow", 10),
    )
    # replicas starting together on one PostgreSQL take turns: one migrates and seeds, the next
    # finds the schema at head and the assistants in place
    async with db.startup_lock():
        await db.migrate()
        await seed_assistants(db, getattr(settings, "assistants_file", None))
    app.state.db = db
    app.state.webhook_http = httpx.AsyncClient(follow_redirects=True)
    log.info("conversation store ready (%s)", db.engine.url.render_as_string(hide_password=True))


async def shutdown(app) -> None:
    http = getattr(app.state, "webhook_http", None)
    if http is not None:
        await http.aclose()
    db = getattr(app.state, "db", None)
    if db is not None:
        await db.dispose()
