"""A PostgreSQL that is shutting down, starting up or out of connections is the store being
unavailable (a 503), however the driver wraps the error; anything else stays a bug (a 500)."""

from __future__ import annotations

import pytest
from sqlalchemy import exc

from app.memory.db import unavailable_reason


class _PgError(Exception):
    def __init__(self, message: str, sqlstate: str):
        super().__init__(message)
        self.sqlstate = sqlstate


@pytest.mark.parametrize("state", ["57P01", "57P02", "57P03", "53300", "08006", "08001"])
def test_server_states_that_cannot_serve_are_unavailable(state):
    direct = exc.DBAPIError("SELECT 1", {}, _PgError("the database system is shutting down", state))
    assert unavailable_reason(direct) is not None
    wrapped = Exception("adapted by the driver")
    wrapped.__cause__ = _PgError("cannot connect now", state)
    assert unavailable_reason(exc.DBAPIError("SELECT 1", {}, wrapped)) is not None


@pytest.mark.parametrize("state", ["42601", "23505", None])
def test_other_errors_stay_bugs(state):
    error = _PgError("syntax error", state) if state else Exception("no state")
    assert unavailable_reason(exc.DBAPIError("SELECT 1", {}, error)) is None
