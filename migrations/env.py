"""Alembic environment. Two ways in:
- the server (app.memory.db.Database.migrate) hands over its own open connection in
  config.attributes["connection"];
- the CLI (`alembic upgrade head`) opens an async engine from CHATLOOM_DATABASE_URL (or
  sqlalchemy.url in alembic.ini).
The n8n history table's name comes from config.attributes["n8n_history_table"] or
CHATLOOM_N8N_HISTORY_TABLE."""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine

import app.memory.batch_models  # noqa: F401  (the Batch API tables join Base.metadata)
from app.memory.db import async_url, ensure_sqlite_dir
from app.memory.models import Base
from app.paths import default_database_url

config = context.config
target_metadata = Base.metadata


def _n8n_table() -> str:
    return config.attributes.get("n8n_history_table") or os.environ.get(
        "CHATLOOM_N8N_HISTORY_TABLE", "n8n_chat_histories"
    )


def _include_name(name, type_, parent_names) -> bool:
    # autogenerate / `alembic check` compare the ORM models only: n8n's table is not one of them
    return not (type_ == "table" and name == _n8n_table())


def _configure_and_run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=_include_name,
        render_as_batch=connection.dialect.name == "sqlite",  # ALTER TABLE support on SQLite
        compare_type=True,
    )
    config.attributes["n8n_history_table"] = _n8n_table()
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = os.environ.get("CHATLOOM_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    return async_url(url or default_database_url())  # the server's default store (app.paths)


async def _run_async() -> None:
    ensure_sqlite_dir(_url())
    engine = create_async_engine(_url())
    async with engine.begin() as conn:
        await conn.run_sync(_configure_and_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (conn := config.attributes.get("connection")) is not None:
    _configure_and_run(conn)
else:
    asyncio.run(_run_async())
