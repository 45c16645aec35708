"""The Batch API's files, batches and per-line results (app.memory.batch_models).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_batch_files_owner", "batch_files", ["owner"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column(
            "input_file_id",
            sa.String(64),
            sa.ForeignKey("batch_files.id", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("errors", JSONType, nullable=True),
        sa.Column("metadata", JSONType, nullable=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("completed", sa.Integer, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("in_progress_at", sa.DateTime, nullable=True),
        sa.Column("finalizing_at", sa.DateTime, nullable=True),
        sa.Column("completed_at", sa.DateTime, nullable=True),
        sa.Column("failed_at", sa.DateTime, nullable=True),
        sa.Column("cancelling_at", sa.DateTime, nullable=True),
        sa.Column("cancelled_at", sa.DateTime, nullable=True),
        sa.Column("expires_at", sa.DateTime, nullable=True),
    )
    op.create_index("ix_batches_owner", "batches", ["owner"])
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_table(
        "batch_results",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("batch_id", sa.String(64), sa.ForeignKey("batches.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("line_no", sa.Integer, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("line", sa.Text, nullable=False),
        sa.UniqueConstraint("batch_id", "key", name="uq_batch_results_batch_key"),
    )
    op.create_index("ix_batch_results_batch_id", "batch_results", ["batch_id"])


def downgrade() -> None:
    op.drop_index("ix_batch_results_batch_id", "batch_results")
    op.drop_table("batch_results")
    op.drop_index("ix_batches_status", "batches")
    op.drop_index("ix_batches_owner", "batches")
    op.drop_table("batches")
    op.drop_index("ix_batch_files_owner", "batch_files")
    op.drop_table("batch_files")
