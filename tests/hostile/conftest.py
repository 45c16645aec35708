"""One chatloom server subprocess on 127.0.0.1 over the tiny random Qwen3 checkpoint for the hostile
suite, killed if its RSS passes 2 GiB (soak.server), and 4 streams kept in flight beside it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from soak.server import Server
from soak.streams import stream_chat


@pytest.fixture(scope="session")
def server(tiny_qwen3, tmp_path_factory) -> Iterator[Server]:
    env = {
        "CHATLOOM_MAX_MODEL_LEN": "1024",
        "CHATLOOM_NUM_KV_BLOCKS": "2048",
        "CHATLOOM_GRAMMAR_TIMEOUT_S": "10",
        # replies of requests that name no max_tokens (schemathesis's): 64 tokens, not 1,024; each
        # such reply took ~16 s on the 2-core host, and the cases name their own
        "CHATLOOM_DEFAULT_MAX_TOKENS": "64",
    }
    srv = Server(tiny_qwen3, tmp_path_factory.mktemp("hostile-server"), env=env)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as c:
        yield c


class Streams:
    """`width` threads, each streaming chat completions back to back until stopped; any stream
    that does not end with a finish reason, [DONE] and no error is recorded as a failure."""

    def __init__(self, server: Server, width: int = 4, max_tokens: int = 48) -> None:
        self.server = server
        self.width = width
        self.max_tokens = max_tokens
        self.failures: list[str] = []
        self.completed = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(width)]
        self._lock = threading.Lock()

    def start(self) -> Streams:
        for t in self._threads:
            t.start()
        return self

    def _one(self, client: httpx.Client, i: int) -> str | None:
        body = {
            "messages": [{"role": "user", "content": f"stream {i}: tell me a story"}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        outcome = stream_chat(client, body)
        return None if outcome == "completed" else outcome

    def _run(self, i: int) -> None:
        with httpx.Client(base_url=self.server.url, headers=self.server.headers, timeout=300) as client:
            while not self._stop.is_set():
                try:
                    problem = self._one(client, i)
                except httpx.HTTPError as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    if problem is None:
                        self.completed += 1
                    else:
                        self.failures.append(f"stream {i}: {problem}")
                        time.sleep(0.5)  # a dead server: do not spin

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)


@pytest.fixture(scope="session")
def streams(server) -> Iterator[Streams]:
    s = Streams(server).start()
    try:
        yield s
    finally:
        s.stop()
