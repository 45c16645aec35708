"""app.disconnect.join_unless_gone: a non-streaming answer stops its generation when the client
goes (the webhook's sendMessage without streaming uses it)."""

from __future__ import annotations

import asyncio

from app.disconnect import join_unless_gone


class _Request:
    method, url = "POST", type("U", (), {"path": "/webhook/a/chat"})()

    def __init__(self, gone_after: float | None) -> None:
        self.gone_after = gone_after
        self.t0 = asyncio.get_running_loop().time()

    async def is_disconnected(self) -> bool:
        now = asyncio.get_running_loop().time()
        return self.gone_after is not None and now - self.t0 >= self.gone_after


async def test_pieces_are_joined_while_the_client_stays():
    async def pieces():
        for p in ("a", "b", "c"):
            await asyncio.sleep(0.01)
            yield p

    assert await join_unless_gone(_Request(None), pieces(), interval=0.005) == "abc"


async def test_the_work_stops_when_the_client_goes():
    produced, closed = [], asyncio.Event()

    async def pieces():
        try:
            for i in range(10_000):  # would take 100 s
                await asyncio.sleep(0.01)
                produced.append(i)
                yield "x"
        finally:
            closed.set()  # where run_turn aborts its engine request

    t0 = asyncio.get_running_loop().time()
    out = await join_unless_gone(_Request(0.1), pieces(), interval=0.02)
    assert closed.is_set() and asyncio.get_running_loop().time() - t0 < 5
    assert out == "x" * len(out) and len(out) < 1000
    n = len(produced)
    await asyncio.sleep(0.05)
    assert len(produced) == n  # nothing runs after the client left
