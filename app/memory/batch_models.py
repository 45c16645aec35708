"""Tables of the Batch API (app.batch): uploaded and produced files, batches, and one row per
answered request line, written as each answer arrives so that a restart resumes a batch where it
stopped. The schema changes only through migrations/ (0003_batches)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.memory.models import Base, utcnow
from app.memory.n8n_table import JSONType


class BatchFile(Base):
    """A file of the Files API: an uploaded batch input (purpose "batch") or a batch's output or
    error file (purpose "batch_output")."""

    __tablename__ = "batch_files"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)  # file-...
    owner: Mapped[str] = mapped_column(sa.String(128), index=True)  # app.principal id
    purpose: Mapped[str] = mapped_column(sa.String(32))
    filename: Mapped[str] = mapped_column(sa.String(255))
    size: Mapped[int] = mapped_column("bytes", sa.BigInteger)
    content: Mapped[bytes] = mapped_column(sa.LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)  # batch_...
    owner: Mapped[str] = mapped_column(sa.String(128), index=True)
    endpoint: Mapped[str] = mapped_column(sa.String(64))
    input_file_id: Mapped[str] = mapped_column(sa.ForeignKey("batch_files.id", ondelete="RESTRICT"))
    completion_window: Mapped[str] = mapped_column(sa.String(16), default="24h")
    # validating | in_progress | finalizing | completed | failed | cancelling | cancelled | expired
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    output_file_id: Mapped[str | None] = mapped_column(sa.String(64))
    error_file_id: Mapped[str | None] = mapped_column(sa.String(64))
    errors: Mapped[list[Any] | None] = mapped_column(JSONType)  # [{"code", "message", "line"}]
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    total: Mapped[int] = mapped_column(default=0)
    completed: Mapped[int] = mapped_column(default=0)
    failed: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    in_progress_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]


class BatchResult(Base):
    """One answered line of a batch: its output-file line (ok) or error-file line (not ok)."""

    __tablename__ = "batch_results"
    __table_args__ = (sa.UniqueConstraint("batch_id", "key", name="uq_batch_results_batch_key"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(sa.ForeignKey("batches.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(sa.String(255))  # custom_id, or "line:N" for a line without one
    line_no: Mapped[int] = mapped_column(sa.Integer)
    ok: Mapped[bool] = mapped_column(sa.Boolean)
    line: Mapped[str] = mapped_column(sa.Text)  # the JSON line, without its newline
