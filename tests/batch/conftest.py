"""Request lines in the Batch API's input format and a shared tiny engine for the batch tests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

SYSTEM = "You are a terse assistant. Answer in one short sentence, without lists or formatting."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def request_line(i: int, max_tokens: int = 6) -> dict:
    """Line i: chat (shared system prompt), completions or responses, in turn; every 7th chat
    line calls a tool (grammar-constrained)."""
    kind = i % 3
    if kind == 0:
        body: dict = {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Question {i}?"},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if i % 7 == 0:
            body |= {"tools": TOOLS, "tool_choice": "required", "max_tokens": 24}
        url = "/v1/chat/completions"
    elif kind == 1:
        body = {
            "model": "tiny",
            "prompt": f"Once upon a time {i}",
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        url = "/v1/completions"
    else:
        body = {"model": "tiny", "input": f"Say {i}.", "max_output_tokens": max_tokens, "temperature": 0}
        url = "/v1/responses"
    return {"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}


BAD_BODY = {
    "custom_id": "bad-body",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 7},
}


def write_input(path: Path, n: int, extra: list[str] = (), max_tokens: int = 6) -> Path:
    lines = [json.dumps(request_line(i, max_tokens)) for i in range(n)]
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@pytest.fixture(scope="session")
def batch_engine(tiny_qwen3):
    from app.main import build_engine
    from app.settings import Settings

    settings = Settings(
        model=str(tiny_qwen3), device="cpu", dtype="float32", max_model_len=1024, num_kv_blocks=512
    )
    engine = build_engine(settings)
    yield engine, settings
    asyncio.run(engine.shutdown())
