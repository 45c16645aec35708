"""Owners (app.principal) of sessions and assistants; assistants' webhook auth and anonymous tools.

Existing rows belong to "default", the open server's principal (the API key holder reads it too).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("owner", sa.String(128), nullable=False, server_default="default"))
        batch.create_index("ix_sessions_owner", ["owner"])
    with op.batch_alter_table("assistants") as batch:
        batch.add_column(sa.Column("owner", sa.String(128), nullable=False, server_default="default"))
        batch.add_column(sa.Column("webhook_auth", JSONType, nullable=True))
        batch.add_column(sa.Column("anonymous_tools", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("assistants") as batch:
        batch.drop_column("anonymous_tools")
        batch.drop_column("webhook_auth")
        batch.drop_column("owner")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_index("ix_sessions_owner")
        batch.drop_column("owner")
