"""Fixtures of the deployment suite: a fresh PostgreSQL database on 127.0.0.1:5432 per test,
named chatloom_deploy_test_<pid>_<hex> and dropped after (the shared databases are never touched)."""

from __future__ import annotations

import os
import secrets

import pytest

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def pg_available() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=2):
            return True
    except Exception:
        return False


@pytest.fixture
def pg_url():
    if not pg_available():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    import psycopg

    name = f"chatloom_deploy_test_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
