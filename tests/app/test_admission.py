"""Per-caller back-pressure (app.admission): sequences and prompt tokens in flight per principal,
429 rate_limit_exceeded with Retry-After beyond them, the share given back when a response ends."""

from __future__ import annotations

import gc
import json
import threading

import httpx
import pytest

from app.admission import Admission, RateLimited
from app.main import create_app
from app.settings import Settings
from tests.app.conftest import run_server
from tests.app.fake_engine import FakeEngine


def test_limits_per_principal_and_release():
    adm = Admission(max_seqs=4, max_tokens=100, retry_after_s=3)
    a = adm.acquire("alice", 3, 50)
    with pytest.raises(RateLimited) as err:
        adm.acquire("alice", 2, 10)
    assert err.value.status_code == 429 and err.value.code == "rate_limit_exceeded"
    assert "sequences" in err.value.message and err.value.retry_after_s == 3
    with pytest.raises(RateLimited, match="prompt tokens"):
        adm.acquire("alice", 1, 51)
    b = adm.acquire("bob", 4, 100)  # another caller has its own share
    assert adm.usage("alice") == (3, 50) and adm.usage("bob") == (4, 100)
    a.release()
    a.release()  # twice is once
    assert adm.usage("alice") == (0, 0)
    adm.acquire("alice", 4, 100)
    b.release()
    assert adm.usage("bob") == (0, 0)


def test_default_share_is_half_the_seats(monkeypatch):
    monkeypatch.delenv("CHATLOOM_MAX_SEQS_PER_PRINCIPAL", raising=False)
    assert Admission.from_settings(256).max_seqs == 128
    monkeypatch.setenv("CHATLOOM_MAX_SEQS_PER_PRINCIPAL", "7")
    assert Admission.from_settings(256).max_seqs == 7


@pytest.fixture(scope="module")
def limited(qwen_tokenizer, tmp_path_factory):
    engine = FakeEngine(qwen_tokenizer)
    db = tmp_path_factory.mktemp("db-admission") / "chatloom.db"
    app = create_app(Settings(database_url=f"sqlite:///{db}"), engine=engine)
    servers = run_server(app)
    live = next(servers)
    live.app.state.serving.admission = Admission(max_seqs=4, max_tokens=10_000, retry_after_s=2)
    yield live, engine
    next(servers, None)


def _chat(n: int, stream: bool = False) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "n": n, "max_tokens": 40, "stream": stream}


def test_a_caller_over_its_share_gets_429_with_retry_after(limited):
    live, engine = limited
    engine.delay = 0.01
    first_chunk = threading.Event()
    statuses = []

    def stream_n4() -> None:
        with httpx.stream("POST", live.base + "/chat/completions", json=_chat(4, True), timeout=60) as r:
            statuses.append(r.status_code)
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    first_chunk.set()

    t = threading.Thread(target=stream_n4)
    t.start()
    try:
        assert first_chunk.wait(30)
        r = httpx.post(live.base + "/chat/completions", json=_chat(1), timeout=30)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "2"
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
        assert "limit is 4" in err["message"]
    finally:
        t.join(60)
        engine.delay = 0.0
    assert statuses == [200]
    gc.collect()
    assert live.app.state.serving.admission.usage("default") == (0, 0)
    r = httpx.post(live.base + "/chat/completions", json=_chat(4), timeout=30)
    assert r.status_code == 200 and len(r.json()["choices"]) == 4
    assert live.app.state.serving.admission.usage("default") == (0, 0)  # released without gc
    r = httpx.post(live.base + "/chat/completions", json=_chat(5), timeout=30)
    assert r.status_code == 429 and json.loads(r.text)["error"]["param"] is None
