"""One Database object per app: the async SQLAlchemy engine, its session factory, the n8n
history table, and Alembic migrations run over the same async connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.memory.n8n_table import history_table

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def async_url(url: str) -> str:
    """`sqlite:///path` -> aiosqlite, `postgresql://` -> asyncpg; explicit drivers are kept."""
    parsed = make_url(url)
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        if driver not in ("", "aiosqlite"):
            raise ValueError(f"database_url: SQLite needs the aiosqlite driver, got {parsed.drivername!r}")
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        if driver not in ("", "asyncpg"):
            raise ValueError(f"database_url: PostgreSQL needs the asyncpg driver, got {parsed.drivername!r}")
        parsed = parsed.set(drivername="postgresql+asyncpg")
    else:
        raise ValueError(f"database_url must start with sqlite:/// or postgresql://, got {backend!r}")
    return parsed.render_as_string(hide_password=False)


def ensure_sqlite_dir(url: str) -> None:
    """SQLite creates the file but not its folder (the default is ./data/chatloom.db)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # foreign keys make ON DELETE CASCADE work; WAL lets readers run beside the one writer
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


class Database:
    def __init__(self, url: str, n8n_history_table: str = "n8n_chat_histories", echo: bool = False):
        self.url = async_url(url)
        self.n8n_table_name = n8n_history_table
        self.history = history_table(n8n_history_table)
        self.is_sqlite = make_url(self.url).get_backend_name() == "sqlite"
        ensure_sqlite_dir(self.url)
        # SQLite: wait for the one writer instead of failing at once with "database is locked"
        connect_args = {"timeout": 30} if self.is_sqlite else {}
        self.engine: AsyncEngine = create_async_engine(
            self.url, echo=echo, pool_pre_ping=not self.is_sqlite, connect_args=connect_args
        )
        if self.is_sqlite:
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A unit of work: commits on success, rolls back on error."""
        async with self.sessionmaker() as db, db.begin():
            yield db

    async def migrate(self, revision: str = "head") -> None:
        """Alembic upgrade over this engine's own async connection (no second driver needed)."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.attributes["n8n_history_table"] = self.n8n_table_name

        def upgrade(connection) -> None:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)

        async with self.engine.begin() as conn:
            await conn.run_sync(upgrade)
        async with self.engine.connect() as conn:
            present = await conn.run_sync(lambda c: sa.inspect(c).has_table(self.n8n_table_name))
        if not present:
            # the table is named at migration time; a later rename of the setting needs a migration
            raise RuntimeError(
                f"table {self.n8n_table_name!r} (CHATLOOM_N8N_HISTORY_TABLE) does not exist: the first "
                "migration created it under the name set then; create it in n8n's shape or restore that name"
            )

    async def dispose(self) -> None:
        await self.engine.dispose()
