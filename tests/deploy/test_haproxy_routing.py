"""deploy/haproxy.cfg.template's routing, on three stub replicas (no model): where a session id is
read from and in which order, consistent hashing, least connections without a session, health
checks, retries to another replica, and streaming passed through as it comes."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from soak.server import free_port
from tests.deploy.haproxy import HAProxy

pytestmark = [
    pytest.mark.skipif(
        shutil.which("haproxy") is None,
        reason="haproxy is not installed: `apt-get install haproxy` (Debian's package; .ci/run installs "
        "it where it can) to test the HAProxy configuration",
    ),
    pytest.mark.slow,  # about 20 s, most of it waiting for health checks to mark a replica down and up
]


class Stub(ThreadingHTTPServer):
    """A replica stand-in: /health is 200 while `healthy`, /stream sends 4 chunks 0.4 s apart,
    anything else answers {"replica": name}. kill(): what a dead process does to HAProxy, its
    connections refused and the open ones closed without an answer."""

    daemon_threads = True

    def __init__(self, name: str) -> None:
        self.name, self.healthy, self.dead = name, True, False
        super().__init__(("127.0.0.1", free_port()), StubHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def kill(self) -> None:
        self.dead = True
        self.shutdown()
        self.server_close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Stub

    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        if self.server.dead:  # a kept-alive connection HAProxy reuses: closed, nothing sent
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path == "/health":
            status, body = (200, b"{}") if self.server.healthy else (503, b'{"status": "loading"}')
        elif self.path.startswith("/stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(4):
                data = f"data: {i}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                time.sleep(0.4)
            self.wfile.write(b"0\r\n\r\n")
            return
        else:
            status, body = 200, json.dumps({"replica": self.server.name}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    stubs = {name: Stub(name) for name in ("r1", "r2", "r3")}
    proxy = HAProxy(tmp_path_factory.mktemp("haproxy"), {n: s.address for n, s in stubs.items()})
    try:
        proxy.start().wait_status({n: "UP" for n in stubs}, timeout=30)
        with httpx.Client(base_url=proxy.url, timeout=30) as client:
            yield proxy, stubs, client
    finally:
        proxy.stop()
        for stub in stubs.values():
            stub.shutdown()
            stub.server_close()


def served_by(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    # HAProxy's X-Served-By names the replica the stub says it is
    assert r.headers["x-served-by"] == r.json()["replica"]
    return r.headers["x-served-by"]


def by_header(client: httpx.Client, sid: str) -> str:
    return served_by(client.post("/v1/chat/completions", json={}, headers={"X-Session-Id": sid}))


def test_a_session_lands_on_one_replica_whichever_field_names_it(stack):
    _, stubs, client = stack
    homes = {}
    for i in range(30):
        sid = f"session-{i}"
        homes[sid] = home = by_header(client, sid)
        assert by_header(client, sid) == home
        # n8n's chat protocol: sessionId in the JSON body
        n8n = {"action": "sendMessage", "sessionId": sid, "chatInput": "hi"}
        assert served_by(client.post("/webhook/default/chat", json=n8n)) == home
        # OpenAI clients: session_id in the JSON body, or in the query
        assert (
            served_by(client.post("/v1/chat/completions", json={"session_id": sid, "messages": []})) == home
        )
        assert (
            served_by(client.get(f"/webhook/default/chat?action=loadPreviousSession&sessionId={sid}")) == home
        )
        assert served_by(client.post(f"/v1/chat/completions?session_id={sid}", json={})) == home
    assert set(homes.values()) == set(stubs)  # 30 sessions spread over the three


def test_the_header_wins_over_the_body(stack):
    _, _, client = stack
    for i in range(10):
        a, b = f"header-{i}", f"body-{i}"
        if by_header(client, a) == by_header(client, b):
            continue
        r = client.post("/webhook/default/chat", json={"sessionId": b}, headers={"X-Session-Id": a})
        assert served_by(r) == by_header(client, a)
        return
    pytest.fail("ten pairs of sessions all hashed together")


def test_requests_without_a_session_spread_over_the_replicas(stack):
    _, stubs, client = stack
    seen = Counter(served_by(client.post("/v1/chat/completions", json={"messages": []})) for _ in range(30))
    assert set(seen) == set(stubs)
    # a body that is not JSON, or JSON without a session, is not hashed either
    seen = Counter(served_by(client.post("/v1/completions", content=b"prompt=hi")) for _ in range(12))
    assert len(seen) > 1


def test_streams_pass_through_as_they_come(stack):
    _, _, client = stack
    arrived = []
    t0 = time.monotonic()
    with client.stream("GET", "/stream", headers={"X-Session-Id": "stream-1"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrived.append(time.monotonic() - t0)
    assert len(arrived) == 4
    # the first event is there long before the stub has written the last (1.2 s later)
    assert arrived[0] < 0.6 and arrived[-1] - arrived[0] > 0.8, arrived


def test_a_failing_replica_loses_only_its_own_sessions(stack):
    proxy, stubs, client = stack
    homes = {f"move-{i}": by_header(client, f"move-{i}") for i in range(40)}
    sick = Counter(homes.values()).most_common(1)[0][0]
    stubs[sick].healthy = False  # /health 503: loading, or its store is down
    try:
        proxy.wait_status({sick: "DOWN"}, timeout=20)
        now = {sid: by_header(client, sid) for sid in homes}
        # its sessions go elsewhere; consistent hashing keeps every other session where it was
        assert all(now[sid] != sick for sid in homes)
        assert all(now[sid] == homes[sid] for sid in homes if homes[sid] != sick)
    finally:
        stubs[sick].healthy = True
    proxy.wait_status({sick: "UP"}, timeout=20)
    assert {sid: by_header(client, sid) for sid in homes} == homes  # and come back


def test_a_dead_replica_s_requests_are_retried_on_another(stack):
    proxy, stubs, client = stack
    homes = {f"dead-{i}": by_header(client, f"dead-{i}") for i in range(40)}
    dead = "r3"
    stubs[dead].kill()
    # before the health checks notice: a connection refused, or closed with no answer, is tried
    # again on another replica
    moved = [sid for sid, home in homes.items() if home == dead]
    assert moved
    for sid in moved:
        assert by_header(client, sid) != dead
    proxy.wait_status({dead: "DOWN"}, timeout=20)
