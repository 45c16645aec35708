"""One streamed chat completion read to its end, as the soak's and the hostile suite's load does."""

from __future__ import annotations

import json

import httpx


def stream_chat(client: httpx.Client, body: dict, cancel_after: int | None = None) -> str:
    """ "completed" (a finish reason, then [DONE], no error), "cancelled" (the connection closed by
    us after `cancel_after` chunks) or "error: ..." naming what went wrong."""
    chunks, reasons, done = 0, [], False
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return f"error: status {r.status_code} {r.read()[:200]!r}"
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return f"error: in-band {chunk['error']}"
                chunks += 1
                reasons += [c["finish_reason"] for c in chunk.get("choices", []) if c.get("finish_reason")]
                if cancel_after is not None and chunks >= cancel_after:
                    return "cancelled"  # leaving the block closes the connection mid-stream
    if not done or reasons not in (["length"], ["stop"]):
        return f"error: no normal end (reasons={reasons}, done={done})"
    return "completed"
