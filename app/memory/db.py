"""One Database object per app: the async SQLAlchemy engine, its session factory, the n8n
history table, and Alembic migrations run over the same async connection.

Faults: every wait on the store is bounded (`timeout_s`: asyncpg's connect and per-statement
timeouts, the pool's checkout timeout, SQLite's busy timeout), and a session() that fails because
the store is down, frozen or locked raises app.errors.StoreUnavailable (a 503 with the OpenAI
error object), logged as one line.

Replicas on one PostgreSQL: each process holds at most pool_size + max_overflow connections
(CHATLOOM_DATABASE_POOL_SIZE / _MAX_OVERFLOW), and startup_lock() makes replicas that start
together migrate and seed one at a time (a PostgreSQL advisory lock).

NUL characters: PostgreSQL refuses them in TEXT and JSONB, SQLite stores them. Requests carrying
them are refused at the door (app.json_guard); whatever still reaches the store (a model's reply,
a form field) has NUL removed on both backends alike, in the bound parameters and in JSON values."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import NullPool

from app.errors import StoreUnavailable
from app.memory.n8n_table import history_table

log = logging.getLogger("chatloom.memory")

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"

# the PostgreSQL advisory lock (a bigint, scoped to the database) that startup_lock() holds
STARTUP_LOCK_KEY = 0x63686C6F6F6D  # "chloom"
STARTUP_LOCK_WAIT_S = 300.0  # a replica gives up when another one migrates for longer than this


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
    """SQLite creates the file but not its folder (the default is in the per-user data folder, app.paths)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # foreign keys make ON DELETE CASCADE work; WAL lets readers run beside the one writer
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def strip_nul(value: Any) -> Any:
    """value with every NUL character removed from its strings (keys included)."""
    if isinstance(value, str):
        return value.replace("\x00", "") if "\x00" in value else value
    if isinstance(value, dict):
        return {strip_nul(k): strip_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(strip_nul(v) for v in value)
    return value


def _json_without_nul(value: Any) -> str:
    return json.dumps(strip_nul(value))


def _params_without_nul(conn, cursor, statement, parameters, context, executemany):
    # bound TEXT/VARCHAR values (JSON columns arrive here already serialized, without NUL)
    if executemany:
        return statement, [strip_nul(p) for p in parameters]
    return statement, strip_nul(parameters)


# SQLite's OperationalError also reports bugs (no such table); these messages are the store's state
_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk i/o", "readonly", "disk is full")
# SQLSTATEs of a server that cannot serve now: admin/crash shutdown, cannot connect now, too many
# connections (class 08, connection exceptions, is taken whole)
_PG_UNAVAILABLE = ("57P01", "57P02", "57P03", "53300")


def unavailable_reason(error: BaseException) -> str | None:
    """Why `error` means the store cannot serve now (down, frozen, locked), or None (a bug)."""
    if isinstance(error, exc.DBAPIError):
        orig = error.orig
        if isinstance(orig, sqlite3.OperationalError):
            text = str(orig).lower()
            return str(orig) if any(part in text for part in _SQLITE_UNAVAILABLE) else None
        if error.connection_invalidated or isinstance(error, exc.OperationalError | exc.InterfaceError):
            return f"{type(orig or error).__name__}: {orig or error}"
        # PostgreSQL shutting down, starting up or out of connections, however the driver wraps it
        state = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "__cause__", None), "sqlstate", None)
        if isinstance(state, str) and (state.startswith("08") or state in _PG_UNAVAILABLE):
            return f"{type(orig or error).__name__}: {orig or error}"
        return None
    if isinstance(error, exc.TimeoutError):  # no pooled connection came free in time
        return "no connection free in time"
    if isinstance(error, TimeoutError):  # asyncpg's connect or statement timeout
        return "it did not answer in time"
    if isinstance(error, OSError):  # connection refused, reset, unreachable
        return f"{type(error).__name__}: {error.strerror or error}"
    module = type(error).__module__
    if module.startswith("asyncpg") and type(error).__name__ in (
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
        "ConnectionFailureError",
        "TooManyConnectionsError",
        "AdminShutdownError",
        "CrashShutdownError",
        "InterfaceError",
    ):
        return f"{type(error).__name__}: {error}"
    return None


class Database:
    def __init__(
        self,
        url: str,
        n8n_history_table: str = "n8n_chat_histories",
        echo: bool = False,
        timeout_s: float = 10.0,
        pool_size: int = 5,
        max_overflow: int = 10,
    ):
        self.url = async_url(url)
        self.n8n_table_name = n8n_history_table
        self.history = history_table(n8n_history_table)
        self.is_sqlite = make_url(self.url).get_backend_name() == "sqlite"
        self.timeout_s = timeout_s
        ensure_sqlite_dir(self.url)
        if self.is_sqlite:
            # SQLite waits this long for the one writer before "database is locked"
            connect_args: dict[str, Any] = {"timeout": timeout_s}
            pool_args: dict[str, Any] = {}
        else:
            # asyncpg: `timeout` bounds connecting, `command_timeout` every statement
            connect_args = {"timeout": timeout_s, "command_timeout": timeout_s}
            # per process: N replicas hold up to N * (pool_size + max_overflow) server connections
            pool_args = {"pool_timeout": timeout_s, "pool_size": pool_size, "max_overflow": max_overflow}
        self._connect_args = connect_args
        self.engine: AsyncEngine = create_async_engine(
            self.url,
            echo=echo,
            pool_pre_ping=not self.is_sqlite,
            connect_args=connect_args,
            json_serializer=_json_without_nul,
            **pool_args,
        )
        event.listen(self.engine.sync_engine, "before_cursor_execute", _params_without_nul, retval=True)
        if self.is_sqlite:
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        self.sessionmaker = async_sessionmaker(self.engine, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A unit of work: commits on success, rolls back on error. A store that is down, frozen or
        locked raises StoreUnavailable (a 503), logged here as one line."""
        try:
            async with self.sessionmaker() as db, db.begin():
                yield db
        except StoreUnavailable:
            raise
        except Exception as error:
            reason = unavailable_reason(error)
            if reason is None:
                raise
            log.error("conversation store unavailable: %s", reason)
            raise StoreUnavailable(reason) from error

    async def ping(self, timeout_s: float | None = None) -> str | None:
        """None when the store answers `SELECT 1` in time, else why not (for /health)."""
        try:
            async with asyncio.timeout(timeout_s or self.timeout_s):
                async with self.engine.connect() as conn:
                    await conn.execute(sa.text("SELECT 1"))
        except Exception as error:
            return unavailable_reason(error) or f"{type(error).__name__}: {error}"
        return None

    @asynccontextmanager
    async def startup_lock(self, wait_s: float = STARTUP_LOCK_WAIT_S) -> AsyncIterator[None]:
        """Held around migrating and seeding at startup, so that replicas starting together on one
        PostgreSQL do not run Alembic (or insert the same assistants) at the same time: a
        session-level advisory lock on a connection of its own, outside the pool, released when
        the body ends (or by the server, should this process die). SQLite: nothing to hold, its
        file is one host's and its writes are serialized already."""
        if self.is_sqlite:
            yield
            return
        lock_engine = create_async_engine(self.url, poolclass=NullPool, connect_args=self._connect_args)
        try:
            async with lock_engine.connect() as conn:
                await self._acquire_startup_lock(conn, wait_s)
                try:
                    yield
                finally:
                    # a broken connection has dropped the lock already
                    with contextlib.suppress(Exception):
                        await conn.execute(
                            sa.text("SELECT pg_advisory_unlock(:key)"), {"key": STARTUP_LOCK_KEY}
                        )
                        await conn.commit()
        finally:
            await lock_engine.dispose()

    @staticmethod
    async def _acquire_startup_lock(conn, wait_s: float) -> None:
        # try-and-sleep instead of pg_advisory_lock(): every statement has command_timeout, and the
        # wait stays bounded and visible in the log
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        waiting = False
        while True:
            got = await conn.scalar(sa.text("SELECT pg_try_advisory_lock(:key)"), {"key": STARTUP_LOCK_KEY})
            await conn.commit()  # the session-level lock outlives the transaction: none is left open
            if got:
                if waiting:
                    log.info("startup lock acquired")
                return
            if loop.time() > deadline:
                raise RuntimeError(
                    f"another process has held the startup lock (PostgreSQL advisory lock "
                    f"{STARTUP_LOCK_KEY}) for over {wait_s:.0f} s: a replica stuck migrating? (see pg_locks)"
                )
            if not waiting:
                log.info("another replica is migrating the conversation store; waiting for it")
                waiting = True
            await asyncio.sleep(0.25)

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
