"""The full hostile-input and fault soak (`make soak`): starts its own servers on 127.0.0.1 and prints
the figures issue 42 asks for.

1. load: `--streams` streams for `--stream-seconds` with random cancellations while hostile
   requests (soak.cases, `--hostile` in all) run beside them: 0 x 5xx, 0 stream errors, KV blocks
   back to the baseline afterwards (/metrics); cross-principal reads and writes through the public
   webhook (0 may succeed); SSRF through assistants' webhook tools aimed at private addresses (0
   may reach the loopback listener this script runs)
2. kill -9 under load, SQLite then PostgreSQL: every acknowledged turn is found after a restart
3. a PostgreSQL outage (pg_ctlcluster stop, restarted in a `finally`, < 30 s): 503s, not 500s,
   and every acknowledged turn kept

    python -m soak.run [--model embedded|tiny|PATH] [--quick] [--skip-postgres]
Exit status 0 only when every figure is what the issue asks."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import random
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from soak.cases import ASSISTANT, CASES, prepare, send, verdict
from soak.server import Server, tiny_checkpoint
from soak.streams import stream_chat

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- 1. load: streams with cancellations beside hostile requests --------------------------------


class StreamLoad:
    def __init__(self, server: Server, width: int, seconds: float, seed: int = 0) -> None:
        self.server, self.width, self.seconds = server, width, seconds
        self.rng = random.Random(seed)
        self.completed = self.cancelled = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def _one(self, client: httpx.Client, rng: random.Random, i: int) -> str:
        cancel_after = rng.randint(1, 30) if rng.random() < 0.3 else None
        body = {
            "messages": [{"role": "user", "content": f"stream {i}: write about the sea {rng.random()}"}],
            "max_tokens": rng.randint(16, 96),
            "stream": True,
        }
        return stream_chat(client, body, cancel_after)

    def _worker(self, i: int, deadline: float) -> None:
        rng = random.Random(self.rng.random())
        with httpx.Client(base_url=self.server.url, headers=self.server.headers, timeout=300) as client:
            while time.monotonic() < deadline:
                try:
                    outcome = self._one(client, rng, i)
                except httpx.HTTPError as exc:
                    outcome = f"error: {type(exc).__name__}: {exc}"
                with self.lock:
                    if outcome == "completed":
                        self.completed += 1
                    elif outcome == "cancelled":
                        self.cancelled += 1
                    else:
                        self.errors.append(outcome)
                if outcome.startswith("error"):
                    time.sleep(0.5)

    def run(self) -> list[threading.Thread]:
        deadline = time.monotonic() + self.seconds
        threads = [
            threading.Thread(target=self._worker, args=(i, deadline), daemon=True) for i in range(self.width)
        ]
        for t in threads:
            t.start()
        return threads


# cases that generate or build a grammar (seconds each on two cores): sent one round in COSTLY_EVERY,
# so that thousands of hostile requests fit beside the streams; every case still runs many times
COSTLY = {
    "min_length_1e6",
    "min_items_1e5",
    "pattern_a_1e6",
    "arrays_nested_20",
    "tool_pattern_catastrophic_auto",
    "tool_pattern_catastrophic_auto_stream",
    "top_k_vocab_plus_1",
    "list_content_session",
    "prompt_1mb",
}
COSTLY_EVERY = 4


def hostile_order(total: int) -> list:
    order: list = []
    rnd = 0
    while len(order) < total:
        order += [c for c in CASES if c.name not in COSTLY or rnd % COSTLY_EVERY == 0]
        rnd += 1
    return order[:total]


def hostile_load(
    server: Server, total: int, seconds: float, width: int = 4
) -> tuple[int, Counter, list[str]]:
    """total hostile requests from `width` threads, or as many as fit in `seconds`."""
    sent, statuses, bad = 0, Counter(), []
    lock = threading.Lock()
    order = hostile_order(total)
    deadline = time.monotonic() + seconds

    def worker() -> None:
        nonlocal sent
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=300) as client:
            while True:
                with lock:
                    if sent >= total or time.monotonic() > deadline:
                        return
                    case = order[sent]
                    sent += 1
                try:
                    status, text = send(client, case)
                    problem = verdict(status, text, case)
                except httpx.HTTPError as exc:
                    status, problem = 0, f"{type(exc).__name__}: {exc}"
                with lock:
                    statuses[status] += 1
                    if problem is not None:
                        bad.append(f"{case.name}: {problem}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent, statuses, bad


def kv_used(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", headers=server.headers, timeout=30).text
    m = re.search(r"^chatloom_kv_blocks_used (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def cross_principal(server: Server, attempts: int = 10) -> dict[str, int]:
    """The key holder's sessions, read and written by anonymous webhook callers by id."""
    figures = Counter()
    with (
        httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as owner,
        httpx.Client(base_url=server.url, timeout=120) as anon,
    ):
        for i in range(attempts):
            sid, secret = f"soak-private-{i}-{secrets.token_hex(4)}", f"secret-{secrets.token_hex(6)}"
            r = owner.post(
                "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": secret}], "max_tokens": 4},
                headers={"X-Session-Id": sid},
            )
            if r.status_code != 200:
                figures["setup_failed"] += 1
                continue
            read = anon.post(
                f"/webhook/{ASSISTANT}/chat", json={"action": "loadPreviousSession", "sessionId": sid}
            )
            figures["reads"] += 1
            figures["reads_leaked"] += int(secret in read.text)
            injected = f"injected-{secrets.token_hex(6)}"
            anon.post(
                f"/webhook/{ASSISTANT}/chat",
                json={"action": "sendMessage", "sessionId": sid, "chatInput": injected},
            )
            figures["writes"] += 1
            seen = owner.get(f"/v1/sessions/{sid}/messages")
            figures["writes_leaked"] += int(injected in seen.text)
    return dict(figures)


class _Listener(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def _hit(self) -> None:
        _Listener.hits.append(f"{self.command} {self.path} auth={self.headers.get('Authorization')}")
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/secret")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    do_GET = do_POST = _hit

    def log_message(self, *args) -> None:
        pass


def ssrf(server: Server) -> dict[str, int]:
    """Assistants whose webhook tool targets a private address, their tool forced (tool_choice
    required): no request may reach the loopback listener."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    targets = [
        f"http://127.0.0.1:{port}/hook",
        f"http://localhost:{port}/hook",
        f"http://127.0.0.1:{port}/redirect",
        f"http://[::1]:{port}/hook",
        f"http://0.0.0.0:{port}/hook",
        f"http://2130706433:{port}/hook",  # 127.0.0.1 as one integer
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
    ]
    figures = Counter()
    try:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as client:
            for i, url in enumerate(targets):
                aid = f"ssrf{i}-{secrets.token_hex(3)}"
                tool = {
                    "type": "function",
                    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
                    "webhook": {"url": url, "headers": {"Authorization": "Bearer tool-secret"}},
                }
                r = client.post(
                    "/v1/assistants",
                    json={"id": aid, "name": aid, "tools": [tool], "tool_choice": "required"},
                )
                figures["attempts"] += 1
                if r.status_code >= 400:
                    figures["refused_at_creation"] += 1
                    continue
                for anonymous in (False, True):
                    headers = {"Authorization": ""} if anonymous else {}
                    try:
                        client.post(
                            f"/webhook/{aid}/chat",
                            json={
                                "action": "sendMessage",
                                "sessionId": f"ssrf-{i}",
                                "chatInput": "look it up",
                            },
                            headers=headers,
                            timeout=60,
                        )
                    except httpx.TimeoutException:
                        # a forced tool whose every call is refused keeps the turn going: not a leak
                        figures["turns_timed_out"] += 1
    finally:
        httpd.shutdown()
    figures["reached_private"] = len(_Listener.hits)
    return dict(figures)


# ---- 2. kill -9 / 3. database outage ----------------------------------------------------------


class Turns:
    """Workers sending session turns (non-streaming); records the acknowledged ones."""

    def __init__(self, server: Server, tag: str, width: int = 6) -> None:
        self.server, self.tag, self.width = server, tag, width
        self.acked: list[tuple[str, str, str]] = []  # (session id, user text, reply text)
        self.statuses: Counter = Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._worker, args=(w,), daemon=True) for w in range(width)]

    def start(self) -> Turns:
        for t in self.threads:
            t.start()
        return self

    def _worker(self, w: int) -> None:
        i = 0
        with httpx.Client(base_url=self.server.url, headers=self.server.headers, timeout=60) as client:
            while not self.stop.is_set():
                sid, text = f"{self.tag}-{w}-{i % 3}", f"{self.tag} turn {w}.{i} {secrets.token_hex(3)}"
                i += 1
                try:
                    r = client.post(
                        "/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": text}], "max_tokens": 8},
                        headers={"X-Session-Id": sid},
                    )
                    status = r.status_code
                except httpx.HTTPError:
                    status = 0
                with self.lock:
                    self.statuses[status] += 1
                    if status == 200:
                        self.acked.append((sid, text, r.json()["choices"][0]["message"]["content"] or ""))
                if status != 200:
                    time.sleep(0.2)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)

    def lost(self, server: Server) -> int:
        """Acknowledged turns whose user message or reply is not in the store."""
        missing = 0
        stored: dict[str, list[dict]] = {}
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client:
            for sid, text, reply in self.acked:
                if sid not in stored:
                    r = client.get(f"/v1/sessions/{sid}/messages")
                    stored[sid] = r.json().get("data", []) if r.status_code == 200 else []
                msgs = stored[sid]
                idx = next(
                    (k for k, m in enumerate(msgs) if m.get("role") == "user" and m.get("content") == text),
                    None,
                )
                if idx is None:
                    missing += 1
                    continue
                after = msgs[idx + 1] if idx + 1 < len(msgs) else None
                if after is None or after.get("role") != "assistant" or (after.get("content") or "") != reply:
                    missing += 1
        return missing


def kill9(model: Path | None, workdir: Path, database_url: str, name: str, seconds: float) -> dict:
    srv = Server(model, workdir, database_url=database_url, log_name=f"{name}.log").start()
    turns = Turns(srv, f"kill-{name}-{secrets.token_hex(2)}").start()
    try:
        time.sleep(seconds)
        srv.kill()  # kill -9 with requests in flight
        turns.join()
    finally:
        srv.stop()
    srv2 = Server(model, workdir, database_url=database_url, log_name=f"{name}-restart.log").start()
    try:
        lost = turns.lost(srv2)
    finally:
        srv2.stop()
    return {"acknowledged": len(turns.acked), "lost": lost, "statuses": dict(turns.statuses)}


def pg_outage(model: Path | None, workdir: Path, database_url: str, outage_s: float) -> dict:
    cluster = _pg_cluster()
    srv = Server(model, workdir, database_url=database_url, log_name="pg-outage.log").start()
    turns = Turns(srv, f"outage-{secrets.token_hex(2)}").start()
    during: Counter = Counter()
    health: Counter = Counter()
    try:
        time.sleep(5)
        before = dict(turns.statuses)
        try:
            subprocess.run(["pg_ctlcluster", *cluster, "stop", "-m", "fast"], check=True, timeout=30)
            t0 = time.monotonic()
            while time.monotonic() - t0 < outage_s:
                with contextlib.suppress(httpx.HTTPError):
                    health[httpx.get(srv.url + "/health", timeout=5).status_code] += 1
                time.sleep(1)
        finally:
            subprocess.run(["pg_ctlcluster", *cluster, "start"], check=False, timeout=60)
        during = Counter(turns.statuses) - Counter(before)
        time.sleep(8)  # the store comes back
        turns.join()
        lost = turns.lost(srv)
    finally:
        turns.stop.set()
        srv.stop()
    return {
        "acknowledged": len(turns.acked),
        "lost": lost,
        "statuses_during_outage": dict(during),
        "health_during_outage": dict(health),
        "statuses": dict(turns.statuses),
    }


def _pg_cluster() -> list[str]:
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout
    ver, name = out.split()[:2]
    return [ver, name]


@contextlib.contextmanager
def pg_database():
    import psycopg

    name = f"chatloom_soak_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        for _ in range(10):  # the cluster may still be starting after the outage
            try:
                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.Error:
                time.sleep(2)


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m soak.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="embedded (the server's default), tiny, or a path")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--stream-seconds", type=float, default=300)
    ap.add_argument("--hostile", type=int, default=5000)
    ap.add_argument(
        "--hostile-extra-seconds", type=float, default=300, help="time for hostile requests past the streams"
    )
    ap.add_argument("--kill-seconds", type=float, default=15)
    ap.add_argument("--outage-seconds", type=float, default=10)
    ap.add_argument("--skip-postgres", action="store_true")
    ap.add_argument("--rss-limit-gib", type=float, default=2.0, help="the load server is killed past it")
    ap.add_argument("--quick", action="store_true", help="a short run: 16 streams x 30 s, 300 hostile")
    args = ap.parse_args(argv)
    if args.quick:
        args.streams, args.stream_seconds, args.hostile, args.kill_seconds = 16, 30, 300, 8
    args.outage_seconds = min(args.outage_seconds, 25)  # the cluster is shared: keep it short
    workdir = Path(tempfile.mkdtemp(prefix="chatloom-soak-"))
    if args.model == "embedded":
        model = None
    elif args.model == "tiny":
        model = tiny_checkpoint(workdir / "tiny")
    else:
        model = Path(args.model)
    figures: dict[str, object] = {"model": args.model, "workdir": str(workdir)}
    ok = True
    t_start = time.monotonic()
    rss_limit = int(args.rss_limit_gib * (1 << 30))

    def phase(name: str, fn) -> None:
        nonlocal ok
        seen = set(figures)
        try:
            ok &= bool(fn())
        except Exception as exc:  # report it and go on with the next phase
            figures[name + "_aborted"] = f"{type(exc).__name__}: {exc}"
            ok = False
        # each phase's figures as soon as it ends: a run cut short still shows what it measured
        new = {k: v for k, v in figures.items() if k not in seen and not isinstance(v, Server)}
        log(f"{name}: {json.dumps(new)}")

    def load_phase() -> bool:
        log(f"load: {args.streams} streams x {args.stream_seconds:.0f} s beside {args.hostile} hostile ones")
        srv = Server(model, workdir / "load", rss_limit=rss_limit)
        figures["load_server"] = srv
        srv.start()
        try:
            with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=60) as client:
                prepare(client)
            baseline = kv_used(srv)
            load = StreamLoad(srv, args.streams, args.stream_seconds)
            threads = load.run()
            sent, statuses, bad = hostile_load(
                srv, args.hostile, args.stream_seconds + args.hostile_extra_seconds
            )
            for t in threads:
                t.join(args.stream_seconds + 300)
            deadline = time.monotonic() + 60
            after = kv_used(srv)
            while after != baseline and time.monotonic() < deadline:
                time.sleep(0.5)
                after = kv_used(srv)
            five = sum(n for s, n in statuses.items() if s >= 500)
            figures["hostile"] = {
                "requests": sent,
                "5xx": five,
                "unacceptable": len(bad),
                "statuses": dict(sorted(statuses.items())),
                "examples": bad[:5],
            }
            figures["streams"] = {
                "width": args.streams,
                "seconds": args.stream_seconds,
                "completed": load.completed,
                "cancelled": load.cancelled,
                "errors": len(load.errors),
                "error_examples": load.errors[:5],
                "kv_blocks_used_before": baseline,
                "kv_blocks_used_after": after,
            }
            good = five == 0 and not bad and not load.errors and after == baseline
            figures["cross_principal"] = cross = cross_principal(srv)
            good &= cross.get("reads_leaked", 0) == 0 and cross.get("writes_leaked", 0) == 0
            figures["ssrf"] = s = ssrf(srv)
            return good and s["reached_private"] == 0
        finally:
            srv.stop()

    def kill_phase(name: str, url: str, folder: str) -> bool:
        figures[name] = k = kill9(model, workdir / folder, url, name, args.kill_seconds)
        return k["lost"] == 0 and k["acknowledged"] > 0

    def outage_phase(url: str) -> bool:
        log(f"PostgreSQL outage of {args.outage_seconds:.0f} s")
        figures["pg_outage"] = o = pg_outage(model, workdir / "pg", url, args.outage_seconds)
        bad = [s for s in o["statuses_during_outage"] if int(s) >= 500 and int(s) != 503]
        return o["lost"] == 0 and not bad

    phase("load", load_phase)
    srv = figures.pop("load_server", None)
    if isinstance(srv, Server):
        figures["load_server_start_mib"] = srv.start_rss >> 20
        figures["load_server_peak_mib"] = srv.peak_rss >> 20
        figures["load_server_killed_for_memory"] = srv.killed_for_memory
        ok &= not srv.killed_for_memory
    log("kill -9 under load: SQLite")
    phase(
        "kill9_sqlite",
        lambda: kill_phase("kill9_sqlite", f"sqlite:///{workdir / 'kill' / 'chatloom.db'}", "kill"),
    )
    if not args.skip_postgres:
        with pg_database() as url:
            log("kill -9 under load: PostgreSQL")
            phase("kill9_postgres", lambda: kill_phase("kill9_postgres", url, "pg"))
            phase("pg_outage", lambda: outage_phase(url))
    figures["seconds"] = round(time.monotonic() - t_start)
    figures["ok"] = bool(ok)
    print(json.dumps(figures, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
