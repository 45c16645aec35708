"""Query-parameter aliases with bounds, so an out-of-range value (`?offset=2^63`, which no SQL
OFFSET takes) is a 400 naming the parameter instead of an error from the database."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

# a page of a listing: 1..500 rows, skipping at most 2**31 - 1 (far beyond any real listing,
# and inside SQLite's and PostgreSQL's 64-bit OFFSET)
Limit = Annotated[int, Query(ge=1, le=500)]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1)]
