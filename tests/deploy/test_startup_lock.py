"""Replicas that start together on one PostgreSQL migrate and seed one at a time
(Database.startup_lock, an advisory lock): none fails on a half-made schema or a duplicate row."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.memory.db import Database

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]


# one replica's store startup (app.memory.lifespan.startup), begun at the wall-clock time argv[2]
# so that every process has finished importing and they all start together
REPLICA = """
import asyncio, sys, time
from types import SimpleNamespace
from app.memory.lifespan import shutdown, startup

async def main():
    settings = SimpleNamespace(
        database_url=sys.argv[1], n8n_history_table="n8n_chat_histories",
        database_timeout_s=10.0, assistants_file=sys.argv[3],
    )
    app = SimpleNamespace(state=SimpleNamespace())
    await asyncio.sleep(max(0.0, float(sys.argv[2]) - time.time()))
    try:
        await startup(app, settings)
    finally:
        await shutdown(app)

asyncio.run(main())
"""


@pytest.mark.slow  # four processes import the app first (about 15 s)
def test_replicas_starting_together_migrate_and_seed_once(pg_url, tmp_path):
    assistants = tmp_path / "assistants.yaml"
    assistants.write_text("- id: support\n  name: Support\n  system_prompt: Be brief.\n")
    start_at = time.time() + 8  # after every process has imported the app
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REPLICA, pg_url, str(start_at), str(assistants)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(4)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [out[-2000:] for p, out in zip(procs, outputs, strict=True) if p.returncode != 0]
    assert failed == []
    plain = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain) as conn:
        versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        ids = sorted(r[0] for r in conn.execute("SELECT id FROM assistants").fetchall())
    assert len(versions) == 1
    assert ids == ["default", "support"]


async def test_a_second_replica_waits_for_the_lock_and_gives_up_in_time(pg_url):
    first, second = Database(pg_url), Database(pg_url)
    try:
        async with first.startup_lock():
            with pytest.raises(RuntimeError, match="startup lock"):
                async with second.startup_lock(wait_s=0.5):
                    pytest.fail("the lock was granted twice")
        # released: the next one gets it at once
        async with second.startup_lock(wait_s=0.5):
            pass
    finally:
        await first.dispose()
        await second.dispose()


async def test_sqlite_needs_no_lock(tmp_path):
    db = Database(f"sqlite:///{tmp_path}/c.db")
    try:
        async with db.startup_lock(wait_s=0):
            await db.migrate()
    finally:
        await db.dispose()


async def test_the_pool_is_sized_per_replica_from_settings(pg_url, monkeypatch):
    from types import SimpleNamespace

    from app.memory.lifespan import shutdown, startup
    from app.settings import Settings

    monkeypatch.setenv("CHATLOOM_DATABASE_POOL_SIZE", "3")
    monkeypatch.setenv("CHATLOOM_DATABASE_MAX_OVERFLOW", "1")
    settings = Settings(database_url=pg_url)
    app = SimpleNamespace(state=SimpleNamespace())
    try:
        await startup(app, settings)
        pool = app.state.db.engine.pool
        assert (pool.size(), pool._max_overflow) == (3, 1)
    finally:
        await shutdown(app)
