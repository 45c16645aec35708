"""The server's batch worker: one background task that takes the oldest unfinished batch through
validating -> in_progress -> finalizing -> completed (or cancelling -> cancelled), answering its
lines through the engine like `chatloom batch` does and storing each answer as a row the moment it
exists. After a restart it picks up every unfinished batch and skips the lines already stored.

Interactive traffic comes first: a batch keeps at most half of the engine's sequences
(max_num_seqs) in flight, so requests from clients always find room in the running batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import sqlalchemy as sa

from app.batch import store
from app.batch.dispatch import Line, answer, batch_serving, dumps, line_error, result_line
from app.batch.offline import read_lines_text
from app.memory.batch_models import Batch
from app.memory.models import utcnow

log = logging.getLogger("chatloom.batch")

POLL_S = 1.0  # how often an idle worker looks for batches; creating one wakes it at once
CANCEL_POLL_S = 0.5


class BatchWorker:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self._serving: Any = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name="chatloom-batch-worker")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None

    def serving(self) -> Any:
        app_serving = getattr(self.app.state, "serving", None)
        if app_serving is None:
            return None
        if self._serving is None or self._serving.engine is not app_serving.engine:
            self._serving = batch_serving(app_serving.engine, app_serving.settings, app_serving.metrics)
        return self._serving

    async def _loop(self) -> None:
        while True:
            try:
                db = getattr(self.app.state, "db", None)
                serving = self.serving()
                batch_id = None
                if db is not None and serving is not None:
                    async with db.session() as s:
                        batch_id = await store.next_active(s)
                if batch_id is None:
                    self.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), POLL_S)
                    continue
                await self.process(db, serving, batch_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch worker: an iteration failed; retrying")
                await asyncio.sleep(POLL_S)

    # ---- one batch -------------------------------------------------------------------------------

    async def _set(self, db: Any, batch_id: str, only_from: tuple[str, ...] | None = None, **values) -> bool:
        """Update the batch's row (only while its status is one of only_from); whether it did."""
        q = sa.update(Batch).where(Batch.id == batch_id)
        if only_from is not None:
            q = q.where(Batch.status.in_(only_from))
        async with db.session() as s:
            result = await s.execute(q.values(**values))
            return bool(result.rowcount)

    async def _status(self, db: Any, batch_id: str) -> str | None:
        async with db.session() as s:
            return (await s.execute(sa.select(Batch.status).where(Batch.id == batch_id))).scalar_one_or_none()

    async def process(self, db: Any, serving: Any, batch_id: str) -> None:
        async with db.session() as s:
            batch = await store.get_batch(s, batch_id)
            assert batch is not None
            source = await store.get_file(s, batch.input_file_id)
            done = await store.result_keys(s, batch_id)
        status, endpoint = batch.status, batch.endpoint
        if status in ("cancelling", "finalizing"):
            await self.finalize(db, batch_id, cancelled=status == "cancelling")
            return
        lines = read_lines_text(source.content.decode("utf-8", errors="replace") if source else "", endpoint)
        if status == "validating":
            if not lines:
                await self._set(
                    db,
                    batch_id,
                    ("validating",),
                    status="failed",
                    failed_at=utcnow(),
                    errors=[
                        {
                            "code": "empty_file",
                            "message": "The input file has no request lines.",
                            "line": None,
                        }
                    ],
                )
                return
            started = await self._set(
                db, batch_id, ("validating",), status="in_progress", in_progress_at=utcnow(), total=len(lines)
            )
            if not started:  # cancelled meanwhile: the next iteration finalizes it
                return
        todo = [line for line in lines if line.key not in done]
        log.info("batch %s: %d lines, %d to answer", batch_id, len(lines), len(todo))
        cancelled = await self.run_lines(db, serving, batch_id, todo)
        await self.finalize(db, batch_id, cancelled=cancelled)

    async def run_lines(self, db: Any, serving: Any, batch_id: str, todo: list[Line]) -> bool:
        """Answer and store every line; True when the batch was cancelled meanwhile."""
        slots = asyncio.Semaphore(max(1, serving.settings.max_num_seqs // 2))

        async def one(line: Line) -> None:
            if line.error is not None:
                item, ok = line_error(line), False
            else:
                assert line.url is not None and line.body is not None
                async with slots:
                    status, body = await answer(serving, line.url, line.body)
                item, ok = result_line(line, status, body), status == 200
            async with db.session() as s:
                await store.add_result(s, batch_id, line.key, line.number, ok, dumps(item))

        async def every_line() -> None:
            # a TaskGroup: one line that fails (the store went down) stops the others, and the
            # next attempt starts from what was stored
            async with asyncio.TaskGroup() as group:
                for line in todo:
                    group.create_task(one(line))

        work = asyncio.ensure_future(every_line())
        try:
            while True:
                finished, _ = await asyncio.wait({work}, timeout=CANCEL_POLL_S)
                if finished:
                    work.result()
                    return False
                if await self._status(db, batch_id) == "cancelling":
                    return True
        finally:  # cancelled, stopped (server shutdown) or failed: nothing keeps running
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work

    async def finalize(self, db: Any, batch_id: str, cancelled: bool) -> None:
        if not cancelled:
            moved = await self._set(
                db, batch_id, ("in_progress",), status="finalizing", finalizing_at=utcnow()
            )
            if not moved and await self._status(db, batch_id) == "cancelling":
                cancelled = True
        async with db.session() as s:
            batch = await store.get_batch(s, batch_id)
            assert batch is not None
            file_ids: dict[str, str | None] = {}
            for ok, name, field in ((True, "output", "output_file_id"), (False, "error", "error_file_id")):
                lines = await store.result_lines(s, batch_id, ok)
                file_ids[field] = None
                if lines:
                    content = ("\n".join(lines) + "\n").encode()
                    row = await store.add_file(
                        s, batch.owner, "batch_output", f"{batch_id}_{name}.jsonl", content
                    )
                    file_ids[field] = row.id
            now = utcnow()
            batch.output_file_id = file_ids["output_file_id"]
            batch.error_file_id = file_ids["error_file_id"]
            if cancelled:
                batch.status, batch.cancelled_at = "cancelled", now
            else:
                batch.status, batch.completed_at = "completed", now
        log.info("batch %s %s", batch_id, "cancelled" if cancelled else "completed")


def start(app: Any) -> BatchWorker:
    worker = BatchWorker(app)
    app.state.batch_worker = worker
    worker.start()
    return worker
