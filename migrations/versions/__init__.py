"""Alembic migrations: the one way chatloom's schema changes."""
