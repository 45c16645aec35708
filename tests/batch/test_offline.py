"""`chatloom batch`: Batch API lines through the real engine (tiny random Qwen3), bad lines in the
errors file, bodies exactly the server's, and resuming after an interruption (a partial output
file, and a real kill -9 half-way)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from app.batch.dispatch import batch_serving
from app.batch.offline import finished_keys, run_file
from app.chat.serving import Serving
from app.main import create_app
from tests.batch.conftest import BAD_BODY, read_jsonl, request_line, write_input

SDK_TYPES = {"/v1/chat/completions": ChatCompletion, "/v1/completions": Completion, "/v1/responses": Response}


@pytest.fixture
async def serving(batch_engine):
    engine, settings = batch_engine
    await engine.start()
    return batch_serving(engine, settings)


async def test_fifty_lines_with_bad_ones(serving, tmp_path):
    extra = [json.dumps(BAD_BODY), "{not json", json.dumps(request_line(3))]  # the last: a duplicate id
    src = write_input(tmp_path / "in.jsonl", 50, extra)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    summary = await run_file(serving, src, out, err, progress=False)

    assert (summary.total, summary.completed, summary.failed, summary.skipped) == (53, 50, 3, 0)
    results = read_jsonl(out)
    assert sorted(r["custom_id"] for r in results) == sorted(f"req-{i}" for i in range(50))
    urls = {f"req-{i}": request_line(i)["url"] for i in range(50)}
    for r in results:
        assert r["error"] is None and r["id"].startswith("batch_req_")
        response = r["response"]
        assert response["status_code"] == 200 and response["request_id"] == response["body"]["id"]
        SDK_TYPES[urls[r["custom_id"]]].model_validate(response["body"], strict=False)
    tool_lines = [r for r in results if r["custom_id"] in ("req-0", "req-21", "req-42")]
    for r in tool_lines:  # tool_choice "required": a call whose arguments parse as the schema says
        choice = r["response"]["body"]["choices"][0]
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and choice["finish_reason"] in ("tool_calls", "length")
        if choice["finish_reason"] == "tool_calls":
            assert isinstance(json.loads(call["arguments"])["city"], str)
    assert summary.tokens == sum(
        (
            r["response"]["body"]["usage"].get("completion_tokens")
            or r["response"]["body"]["usage"]["output_tokens"]
        )
        for r in results
    )

    error_lines = read_jsonl(err)
    assert len(error_lines) == 3
    bad = next(e for e in error_lines if e["custom_id"] == "bad-body")["response"]
    assert bad["status_code"] == 400
    assert bad["body"]["error"]["param"] == "temperature" and "temperature" in bad["body"]["error"]["message"]
    by_code = {e["error"]["code"]: e for e in error_lines if e["error"] is not None}
    assert by_code["invalid_json_line"]["error"]["line"] == 52
    assert by_code["duplicate_custom_id"]["error"]["line"] == 53

    # a second run over the finished files answers nothing again
    again = await run_file(serving, src, out, err, progress=False)
    assert (again.completed, again.failed, again.skipped) == (0, 0, 53)
    assert len(read_jsonl(out)) == 50 and len(read_jsonl(err)) == 3


async def test_bodies_are_the_servers(serving, batch_engine, tmp_path):
    """A greedy line answered by `chatloom batch` equals POST to the app, but for id and created."""
    engine, settings = batch_engine
    app = create_app(settings, engine=engine)
    app.state.serving, app.state.engine = Serving(engine, settings), engine
    lines = [request_line(0), request_line(1), request_line(2), request_line(3)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    await run_file(serving, src, tmp_path / "out.jsonl", progress=False)
    got = {r["custom_id"]: r["response"]["body"] for r in read_jsonl(tmp_path / "out.jsonl")}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        for line in lines:
            resp = await client.post(line["url"], json=line["body"])
            assert resp.status_code == 200
            want, mine = resp.json(), got[line["custom_id"]]
            for body in (want, mine):
                body.pop("id"), body.pop("created", None), body.pop("created_at", None)
                for item in body.get("output", []):  # Responses: output items carry their own ids
                    item.pop("id", None)
                for choice in body.get("choices", []):
                    for call in (choice.get("message") or {}).get("tool_calls") or []:
                        call.pop("id")
            assert mine == want


async def test_resume_from_a_partial_output(serving, tmp_path):
    src = write_input(tmp_path / "in.jsonl", 12)
    full = tmp_path / "full.jsonl"
    await run_file(serving, src, full, progress=False)
    finished = full.read_text().splitlines(keepends=True)[:5]
    torn = full.read_text().splitlines(keepends=True)[5][:40]  # killed while writing the 6th line
    out = tmp_path / "out.jsonl"
    out.write_text("".join(finished) + torn)
    assert len(finished_keys(out)) == 5 and out.read_text() == "".join(finished)  # torn line cut

    out.write_text("".join(finished) + torn)
    summary = await run_file(serving, src, out, progress=False)
    assert (summary.skipped, summary.completed) == (5, 7)
    text = out.read_text()
    assert text.startswith("".join(finished))  # the finished lines were kept, not redone
    ids = Counter(r["custom_id"] for r in read_jsonl(out))
    assert ids == Counter(f"req-{i}" for i in range(12))


@pytest.mark.slow  # a subprocess or a second server start: about 20 s
async def test_kill_9_half_way_then_resume(serving, tiny_qwen3, tmp_path):
    n = 120
    src = write_input(tmp_path / "in.jsonl", n, max_tokens=8)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    cmd = [sys.executable, "-m", "app.cli", "batch", str(src), str(out), "--errors", str(err)]
    cmd += ["--model", str(tiny_qwen3), "--device", "cpu", "--dtype", "float32", "--max-model-len", "1024"]
    # 8 sequences at a time: lines finish in waves, so the kill lands between some of them
    cmd += ["--num-kv-blocks", "512", "--max-num-seqs", "8", "--no-progress", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while len(read_jsonl(out)) < 16:  # two waves answered
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the batch answered nothing in time"
            await asyncio.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    before = finished_keys(out)
    assert 16 <= len(before) < n  # killed half-way

    summary = await run_file(serving, src, out, err, progress=False)
    assert summary.skipped == len(before) and summary.completed == n - len(before)
    ids = Counter(r["custom_id"] for r in read_jsonl(out))
    assert ids == Counter(f"req-{i}" for i in range(n))  # every line exactly once
    assert read_jsonl(err) == []
