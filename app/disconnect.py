"""Stop work whose client has gone: for answers sent whole (non-streaming), nothing notices a
disconnect until the response is written, so the generation would run to its end for nobody.
Streams need none of this (a failed send cancels them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger("chatloom.disconnect")


async def join_unless_gone(request: Any, pieces: AsyncIterator[str], interval: float = 0.2) -> str:
    """The pieces joined, watching request.is_disconnected() meanwhile. When the client goes, the
    consumer is cancelled and `pieces` closed (an engine request inside is aborted by its own
    cleanup); what was produced until then is returned, for a response nobody will read."""
    got: list[str] = []

    async def consume() -> str:
        async for piece in pieces:
            got.append(piece)
        return "".join(got)

    task = asyncio.ensure_future(consume())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            if await request.is_disconnected():
                log.info(
                    "client of %s %s disconnected; its turn is stopped", request.method, request.url.path
                )
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                aclose = getattr(pieces, "aclose", None)
                if aclose is not None:
                    await aclose()
                return "".join(got)
    finally:
        if not task.done():  # this handler itself was cancelled
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
