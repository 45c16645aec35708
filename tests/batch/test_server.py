"""The Files and Batches APIs through the official openai SDK (strict response validation) against
the app with the real tiny engine, on SQLite and PostgreSQL; a restart mid-batch resumes it."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from app.deps import require_api_key
from app.main import create_app
from app.principal import Principal
from app.settings import Settings
from tests.app.conftest import run_server
from tests.batch.conftest import BAD_BODY, request_line
from tests.memory.conftest import db_url  # noqa: F401  (SQLite, and PostgreSQL when reachable)


def chat_lines(n: int, max_tokens: int = 6) -> list[dict]:
    return [request_line(3 * i, max_tokens) | {"custom_id": f"c-{i}"} for i in range(n)]


def jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in items).encode()


def app_for(model, database_url: str, **settings):
    config = Settings(
        model=str(model),
        served_model_name="tiny",
        device="cpu",
        dtype="float32",
        max_model_len=1024,
        num_kv_blocks=512,
        database_url=database_url,
        **settings,
    )
    return create_app(config)


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base, api_key="none", _strict_response_validation=True, max_retries=0
    )


def wait_for(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch stuck in {batch.status}: {batch.request_counts}"
        time.sleep(0.1)


def test_sdk_flow(tiny_qwen3, db_url):  # noqa: F811
    gen = run_server(app_for(tiny_qwen3, db_url))
    server = next(gen)
    try:
        with sdk(server) as client:
            lines = [*chat_lines(8), BAD_BODY]
            uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
            assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
            assert client.files.retrieve(uploaded.id).filename == "requests.jsonl"
            assert client.files.content(uploaded.id).content == jsonl(lines)

            batch = client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"job": "nightly"},
            )
            assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
            done = wait_for(client, batch.id, ("completed", "failed"))
            assert done.status == "completed", done.errors
            assert done.request_counts.model_dump() == {"total": 9, "completed": 8, "failed": 1}
            assert done.completed_at >= done.in_progress_at >= done.created_at

            output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
            assert Counter(r["custom_id"] for r in output) == Counter(f"c-{i}" for i in range(8))
            for r in output:
                assert r["response"]["status_code"] == 200 and r["error"] is None
                completion = ChatCompletion.model_validate(r["response"]["body"])
                assert completion.model == "tiny" and completion.id == r["response"]["request_id"]
            errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
            assert [e["custom_id"] for e in errors] == ["bad-body"]
            assert errors[0]["response"]["status_code"] == 400
            assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
            assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
            assert batch.id in [b.id for b in client.batches.list()]

            # what the API refuses, with the field named
            with pytest.raises(openai.BadRequestError) as bad:
                client.batches.create(
                    input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
                )
            assert bad.value.body["param"] == "endpoint"
            with pytest.raises(openai.NotFoundError):
                client.batches.create(
                    input_file_id="file-nope", endpoint="/v1/responses", completion_window="24h"
                )
            with pytest.raises(openai.BadRequestError) as bad:
                client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
            assert bad.value.body["param"] == "purpose"
            with pytest.raises(openai.APIStatusError) as conflict:
                client.batches.cancel(batch.id)
            assert conflict.value.status_code == 409

        # another principal sees none of it
        server.app.dependency_overrides[require_api_key] = lambda: Principal(
            "key:other", frozenset({"key:other"})
        )
        try:
            for path in (f"/files/{uploaded.id}", f"/files/{uploaded.id}/content", f"/batches/{batch.id}"):
                resp = httpx.get(server.base + path)
                assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
            assert httpx.get(server.base + "/batches").json()["data"] == []
            assert httpx.post(server.base + f"/batches/{batch.id}/cancel").status_code == 404
        finally:
            server.app.dependency_overrides.clear()
    finally:
        gen.close()


def test_cancel(tiny_qwen3, tmp_path):
    gen = run_server(app_for(tiny_qwen3, f"sqlite:///{tmp_path}/db.sqlite", max_num_seqs=2))
    server = next(gen)
    try:
        with sdk(server) as client:
            uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(200, 32))), purpose="batch")
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_for(client, batch.id, ("in_progress",))
            assert client.batches.cancel(batch.id).status == "cancelling"
            done = wait_for(client, batch.id, ("cancelled",))
            assert done.cancelled_at is not None and done.request_counts.completed < 200
            if done.output_file_id is not None:
                text = client.files.content(done.output_file_id).text
                assert len(text.splitlines()) == done.request_counts.completed
    finally:
        gen.close()


@pytest.mark.slow  # a subprocess or a second server start: about 20 s
def test_restart_mid_batch_resumes(tiny_qwen3, tmp_path):
    path = tmp_path / "db.sqlite"
    n = 60
    # max_num_seqs 4: the batch keeps 2 lines in flight, so it is still running when the server stops
    gen = run_server(app_for(tiny_qwen3, f"sqlite:///{path}", max_num_seqs=4))
    server = next(gen)
    try:
        with sdk(server) as client:
            uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(n, 16))), purpose="batch")
            batch = client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            deadline = time.monotonic() + 120
            while client.batches.retrieve(batch.id).request_counts.completed < 6:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        gen.close()  # the server stops mid-batch

    with sqlite3.connect(path) as conn:
        before = dict(conn.execute("SELECT key, line FROM batch_results WHERE batch_id = ?", (batch.id,)))
        row = conn.execute("SELECT status, completed FROM batches WHERE id = ?", (batch.id,)).fetchone()
    status, completed = row
    assert status == "in_progress" and 6 <= len(before) == completed < n

    gen = run_server(app_for(tiny_qwen3, f"sqlite:///{path}"))
    server = next(gen)
    try:
        with sdk(server) as client:
            done = wait_for(client, batch.id, ("completed",))
            assert done.request_counts.model_dump() == {"total": n, "completed": n, "failed": 0}
            lines = client.files.content(done.output_file_id).text.splitlines()
    finally:
        gen.close()
    by_key = {json.loads(x)["custom_id"]: x for x in lines}
    assert len(lines) == n and set(by_key) == {f"c-{i}" for i in range(n)}  # each line exactly once
    assert all(by_key[key] == line for key, line in before.items())  # answered before: kept as they were
