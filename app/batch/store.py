"""Repository functions of the Batch API tables and their wire forms (the openai SDK's FileObject
and Batch)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from app.memory.batch_models import Batch, BatchFile, BatchResult
from app.memory.models import utcnow

# a batch the worker still has to take further
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
COMPLETION_WINDOW = timedelta(hours=24)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}" if prefix == "file" else f"{prefix}_{secrets.token_hex(12)}"


def epoch(value: datetime | None) -> int | None:
    return None if value is None else int(value.replace(tzinfo=UTC).timestamp())


def file_object(row: BatchFile) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.size,
        "created_at": epoch(row.created_at),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(row: Batch) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "errors": {"object": "list", "data": row.errors} if row.errors else None,
        "created_at": epoch(row.created_at),
        "in_progress_at": epoch(row.in_progress_at),
        "expires_at": epoch(row.expires_at),
        "finalizing_at": epoch(row.finalizing_at),
        "completed_at": epoch(row.completed_at),
        "failed_at": epoch(row.failed_at),
        "expired_at": None,
        "cancelling_at": epoch(row.cancelling_at),
        "cancelled_at": epoch(row.cancelled_at),
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "metadata": row.batch_metadata,
    }


async def add_file(s: AsyncSession, owner: str, purpose: str, filename: str, content: bytes) -> BatchFile:
    row = BatchFile(
        id=new_id("file"),
        owner=owner,
        purpose=purpose,
        filename=filename,
        size=len(content),
        content=content,
        created_at=utcnow(),
    )
    s.add(row)
    await s.flush()
    return row


async def get_file(s: AsyncSession, file_id: str) -> BatchFile | None:
    return await s.get(BatchFile, file_id)


async def list_files(s: AsyncSession, owners: frozenset[str], purpose: str | None) -> list[BatchFile]:
    q = sa.select(BatchFile).where(BatchFile.owner.in_(owners)).order_by(BatchFile.created_at.desc())
    if purpose:
        q = q.where(BatchFile.purpose == purpose)
    return list((await s.scalars(q)).all())


async def add_batch(
    s: AsyncSession, owner: str, endpoint: str, input_file_id: str, metadata: dict[str, str] | None
) -> Batch:
    now = utcnow()
    row = Batch(
        id=new_id("batch"),
        owner=owner,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window="24h",
        status="validating",
        batch_metadata=metadata,
        total=0,
        completed=0,
        failed=0,
        created_at=now,
        expires_at=now + COMPLETION_WINDOW,
    )
    s.add(row)
    await s.flush()
    return row


async def get_batch(s: AsyncSession, batch_id: str) -> Batch | None:
    return await s.get(Batch, batch_id)


async def list_batches(
    s: AsyncSession, owners: frozenset[str], after: str | None, limit: int
) -> tuple[list[Batch], bool]:
    """Newest first; `after`: the id of the last batch of the previous page."""
    q = sa.select(Batch).where(Batch.owner.in_(owners))
    if after:
        anchor = await s.get(Batch, after)
        if anchor is not None:
            q = q.where(
                sa.or_(
                    Batch.created_at < anchor.created_at,
                    sa.and_(Batch.created_at == anchor.created_at, Batch.id < anchor.id),
                )
            )
    q = q.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit + 1)
    rows = list((await s.scalars(q)).all())
    return rows[:limit], len(rows) > limit


async def next_active(s: AsyncSession) -> str | None:
    q = sa.select(Batch.id).where(Batch.status.in_(ACTIVE)).order_by(Batch.created_at, Batch.id).limit(1)
    return (await s.execute(q)).scalar_one_or_none()


async def result_keys(s: AsyncSession, batch_id: str) -> set[str]:
    q = sa.select(BatchResult.key).where(BatchResult.batch_id == batch_id)
    return set((await s.scalars(q)).all())


async def add_result(s: AsyncSession, batch_id: str, key: str, line_no: int, ok: bool, line: str) -> None:
    """One answered line and its count, in the caller's transaction."""
    s.add(BatchResult(batch_id=batch_id, key=key, line_no=line_no, ok=ok, line=line))
    counter = Batch.completed if ok else Batch.failed
    await s.execute(sa.update(Batch).where(Batch.id == batch_id).values({counter: counter + 1}))


async def result_lines(s: AsyncSession, batch_id: str, ok: bool) -> list[str]:
    q = (
        sa.select(BatchResult.line)
        .where(BatchResult.batch_id == batch_id, BatchResult.ok == ok)
        .order_by(BatchResult.line_no)
    )
    return list((await s.scalars(q)).all())
