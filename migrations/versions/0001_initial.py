"""Sessions, messages, assistants, and n8n's chat history table.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def _n8n_table() -> str:
    return context.config.attributes.get("n8n_history_table", "n8n_chat_histories")


def upgrade() -> None:
    op.create_table(
        "assistants",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("system_prompt", sa.Text, nullable=False),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("sampling", JSONType, nullable=False),
        sa.Column("memory", JSONType, nullable=False),
        sa.Column("tool_choice", JSONType, nullable=True),
        sa.Column("tools", JSONType, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column(
            "assistant_id", sa.String(64), sa.ForeignKey("assistants.id", ondelete="SET NULL"), nullable=True
        ),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_sessions_assistant_id", "sessions", ["assistant_id"])
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "session_id", sa.String(255), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("tool_calls", JSONType, nullable=True),
        sa.Column("tool_call_id", sa.String(255), nullable=True),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("token_ids", JSONType, nullable=True),
        sa.Column("n8n_row_id", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_messages_session_id", "messages", ["session_id"])
    op.create_index("ix_messages_n8n_row_id", "messages", ["n8n_row_id"])

    # n8n's Postgres Chat Memory table; n8n may have made it already (CREATE TABLE IF NOT EXISTS)
    name = _n8n_table()
    if not sa.inspect(op.get_bind()).has_table(name):
        op.create_table(
            name,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("session_id", sa.String(255), nullable=False),
            sa.Column("message", JSONType, nullable=False),
        )
        op.create_index(f"ix_{name}_session_id", name, ["session_id"])


def downgrade() -> None:
    # the n8n history table stays: n8n workflows may still read and write it
    op.drop_table("messages")
    op.drop_table("sessions")
    op.drop_table("assistants")
