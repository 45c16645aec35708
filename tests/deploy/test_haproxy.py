"""Two `chatloom serve` replicas on one PostgreSQL behind a local HAProxy rendered from
deploy/haproxy.cfg.template, all on 127.0.0.1 (issue 49).

1. affinity: sessions x 3 turns, n8n's chat protocol (sessionId in the JSON body) and OpenAI chat
   completions (X-Session-Id; some streamed) mixed: every turn of a session is answered by one
   replica (HAProxy's X-Served-By, cross-checked with each replica's /metrics request counts), and
   turn 3's prefix-cache hit covers the replayed history (usage.prompt_tokens_details.cached_tokens);
2. failover: more sessions, turn by turn; one replica is SIGKILLed in the middle of turn 2: the
   failures clients see are requests that were in flight on it, its sessions go on on the other
   replica with their whole history (the prompt grows by it), and every acknowledged turn is in
   PostgreSQL (question and answer).

CI runs 40 sessions in each phase; CHATLOOM_DEPLOY_SESSIONS=200 is the issue's full run. The
figures are printed (pytest -s) and written to deploy-figures.json in the test's tmp folder.
Skipped with a message when haproxy is not installed (.ci/run installs Debian's package) or
PostgreSQL is not on 127.0.0.1:5432. CHATLOOM_DEPLOY_MODEL=tiny uses the tiny random checkpoint
instead of the embedded model."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from soak.server import Server, tiny_checkpoint
from tests.deploy.haproxy import HAProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SESSIONS = int(os.environ.get("CHATLOOM_DEPLOY_SESSIONS", "40"))
WORKERS = 16  # sessions in flight at once (a replica batches what it is sent together)
MAX_TOKENS = 4  # per reply: the test is about routing and memory, not generation
BLOCK = 16  # KV block size the replicas run with (prefix-cache hits come in whole blocks)
ASSISTANT = "deploy"
REPLICA_RSS_LIMIT = 3 << 30
CHAT_ENDPOINTS = ("/v1/chat/completions", "/webhook/{assistant_id}/chat")


@dataclass
class Deployment:
    replicas: dict[str, Server]
    proxy: HAProxy
    database_url: str
    workdir: Path

    def client(self) -> httpx.Client:
        server = next(iter(self.replicas.values()))
        return httpx.Client(base_url=self.proxy.url, headers=server.headers, timeout=180)

    def requests_seen(self) -> dict[str, Counter]:
        """Each live replica's finished chat requests by endpoint (its /metrics)."""
        seen: dict[str, Counter] = {}
        for name, server in self.replicas.items():
            if not server.alive:
                continue
            text = httpx.get(server.url + "/metrics", timeout=10).text
            counts: Counter = Counter()
            for endpoint, value in re.findall(
                r'chatloom_requests_total\{endpoint="([^"]+)",[^}]*\} (\S+)', text
            ):
                if endpoint in CHAT_ENDPOINTS:
                    counts[endpoint] += int(float(value))
            seen[name] = counts
        return seen

    def stored(self) -> dict[str, list[tuple[str, str]]]:
        """session id -> its (role, content) rows in PostgreSQL, in order."""
        plain = make_url(self.database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        out: dict[str, list[tuple[str, str]]] = defaultdict(list)
        with psycopg.connect(plain) as conn:
            for sid, role, content in conn.execute(
                "SELECT session_id, role, content FROM messages ORDER BY id"
            ).fetchall():
                out[sid].append((role, content))
        return out


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    if shutil.which("haproxy") is None:
        pytest.skip(
            "haproxy is not installed: `apt-get install haproxy` (Debian's package; .ci/run installs it "
            "where it can) to run the replicas-behind-HAProxy test"
        )
    from tests.deploy.conftest import PG_ADMIN, pg_available

    if not pg_available():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    workdir = tmp_path_factory.mktemp("deploy")
    model = None  # the embedded model (what `chatloom serve` runs without --model)
    if os.environ.get("CHATLOOM_DEPLOY_MODEL") == "tiny":
        model = tiny_checkpoint(workdir / "tiny")
    (workdir / "assistants.yaml").write_text(
        f"- id: {ASSISTANT}\n  name: Deploy test\n  system_prompt: Answer briefly.\n"
        f"  sampling: {{max_tokens: {MAX_TOKENS}}}\n"
    )
    name = f"chatloom_deploy_test_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    database_url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    env = {
        "CHATLOOM_ASSISTANTS_FILE": str(workdir / "assistants.yaml"),
        "CHATLOOM_BLOCK_SIZE": str(BLOCK),
        "CHATLOOM_NUM_THREADS": "1",  # two replicas share this machine's cores
        "CHATLOOM_DATABASE_POOL_SIZE": "4",
    }
    replicas = {
        f"replica{i}": Server(
            model,
            workdir / f"replica{i}",
            database_url=database_url,
            env=env,
            rss_limit=REPLICA_RSS_LIMIT,
        )
        for i in (1, 2)
    }
    proxy = HAProxy(workdir, {n: f"127.0.0.1:{s.port}" for n, s in replicas.items()})
    try:
        # both at once on the fresh database: they migrate and seed in turn (Database.startup_lock)
        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(s.start, 240.0) for s in replicas.values()]:
                future.result()
        proxy.start().wait_status({n: "UP" for n in replicas})
        yield Deployment(replicas, proxy, database_url, workdir)
    finally:
        proxy.stop()
        for server in replicas.values():
            server.stop()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ---- clients: one turn of n8n's chat protocol or of OpenAI chat completions ------------------


@dataclass
class Turn:
    sid: str
    turn: int
    kind: str  # n8n | openai | openai-stream
    text: str
    status: int | str = 0  # HTTP status, or the transport error's name
    served_by: str | None = None
    reply: str | None = None
    usage: dict = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.reply is not None


def kind_of(i: int) -> str:
    return ("n8n", "openai", "n8n", "openai-stream")[i % 4]


def send_turn(client: httpx.Client, sid: str, turn: int, kind: str) -> Turn:
    t = Turn(sid, turn, kind, f"{sid} turn {turn}: tell me one fact about the number {turn * 7}.")
    t.started = time.monotonic()
    try:
        if kind == "n8n":
            r = client.post(
                f"/webhook/{ASSISTANT}/chat",
                json={"action": "sendMessage", "sessionId": sid, "chatInput": t.text},
            )
            t.status, t.served_by = r.status_code, r.headers.get("x-served-by")
            if r.status_code == 200:
                t.reply = r.json()["output"]
        else:
            body = {
                "model": "any",
                "messages": [{"role": "user", "content": t.text}],
                "max_tokens": MAX_TOKENS,
            }
            headers = {"X-Session-Id": sid}
            if kind == "openai":
                r = client.post("/v1/chat/completions", json=body, headers=headers)
                t.status, t.served_by = r.status_code, r.headers.get("x-served-by")
                if r.status_code == 200:
                    data = r.json()
                    t.reply, t.usage = data["choices"][0]["message"]["content"] or "", data["usage"]
            else:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
                with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                    t.status, t.served_by = r.status_code, r.headers.get("x-served-by")
                    if r.status_code == 200:
                        pieces, done = [], False
                        for line in r.iter_lines():
                            if line == "data: [DONE]":
                                done = True
                            elif line.startswith("data: "):
                                chunk = json.loads(line[6:])
                                for choice in chunk.get("choices", []):
                                    pieces.append(choice.get("delta", {}).get("content") or "")
                                t.usage = chunk.get("usage") or t.usage
                        if done:
                            t.reply = "".join(pieces)
                        else:
                            t.status = "stream cut"
                    else:
                        r.read()
    except httpx.TransportError as exc:
        t.status = type(exc).__name__
    t.ended = time.monotonic()
    return t


def conversation(client_factory, sid: str, kind: str, turns: int = 3) -> list[Turn]:
    with client_factory() as client:
        return [send_turn(client, sid, k, kind) for k in range(1, turns + 1)]


def lost_turns(dep: Deployment, turns: list[Turn]) -> list[Turn]:
    """Acknowledged turns whose question, followed by the answer the client got, is not stored."""
    stored = dep.stored()
    lost = []
    for t in turns:
        if not t.ok:
            continue
        rows = stored.get(t.sid, [])
        found = any(
            rows[i] == ("user", t.text) and i + 1 < len(rows) and rows[i + 1] == ("assistant", t.reply)
            for i in range(len(rows))
        )
        if not found:
            lost.append(t)
    return lost


def report(dep: Deployment, figures: dict) -> None:
    path = dep.workdir / "deploy-figures.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(figures)
    path.write_text(json.dumps(data, indent=2))
    print(f"\n[deploy] {json.dumps(figures)}", flush=True)


# ---- 1. affinity and the prefix cache ----------------------------------------------------------


def test_sessions_stick_to_one_replica_and_reuse_its_prefix_cache(deployment):
    dep = deployment
    before = dep.requests_seen()
    sids = [(f"aff-{os.getpid()}-{i}", kind_of(i)) for i in range(SESSIONS)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(WORKERS) as pool:
        sessions = list(pool.map(lambda a: conversation(dep.client, *a), sids))
    elapsed = time.monotonic() - t0
    turns = [t for s in sessions for t in s]
    assert [(t.sid, t.turn, t.status) for t in turns if not t.ok] == []

    # every turn of a session on one replica, and both replicas serving sessions
    replicas_of = {s[0].sid: {t.served_by for t in s} for s in sessions}
    affine = sum(len(r) == 1 for r in replicas_of.values())
    assert affine == len(sessions), {sid: r for sid, r in replicas_of.items() if len(r) != 1}
    by_replica = Counter(next(iter(r)) for r in replicas_of.values())
    assert set(by_replica) == set(dep.replicas)

    # the replicas' own counts agree with what X-Served-By said
    after = dep.requests_seen()
    for name in dep.replicas:
        served = sum(t.served_by == name for t in turns)
        assert sum((after[name] - before[name]).values()) == served, name

    # turn 3 found the history it replays (turns 1-2 and their replies) in its replica's KV cache:
    # every whole block of it (the reply's last token was sampled, never fed back: it has no KV)
    cache = []
    for s in sessions:
        if s[0].kind == "n8n":
            continue
        t2, t3 = s[1].usage, s[2].usage
        history = t2["prompt_tokens"] + t2["completion_tokens"]
        cached = t3["prompt_tokens_details"]["cached_tokens"]
        cache.append((cached, history))
        assert cached >= (history - 1) // BLOCK * BLOCK, (s[0].sid, cached, history)

    assert lost_turns(dep, turns) == []
    report(
        dep,
        {
            "affinity": {
                "sessions": len(sessions),
                "requests": len(turns),
                "affinity_pct": 100.0 * affine / len(sessions),
                "sessions_by_replica": dict(by_replica),
                "turn3_cached_tokens": sum(c for c, _ in cache),
                "turn3_replayed_history_tokens": sum(h for _, h in cache),
                "seconds": round(elapsed, 1),
            }
        },
    )


# ---- 2. a replica is SIGKILLed mid-load ------------------------------------------------------


def test_a_killed_replica_loses_no_acknowledged_turn(deployment):
    dep = deployment
    victim = "replica1"
    survivor = next(n for n in dep.replicas if n != victim)
    sids = [(f"kill-{os.getpid()}-{i}", kind_of(i)) for i in range(SESSIONS)]
    turns: dict[str, list[Turn]] = {sid: [] for sid, _ in sids}
    kill_at: list[float] = []
    done_in_round = 0
    lock = threading.Lock()

    def one(sid: str, kind: str, k: int) -> None:
        nonlocal done_in_round
        with dep.client() as client:
            t = send_turn(client, sid, k, kind)
        with lock:
            turns[sid].append(t)
            done_in_round += 1
            if k == 2 and not kill_at and done_in_round >= len(sids) // 3:
                kill_at.append(time.monotonic())
                dep.replicas[victim].kill()  # SIGKILL, with turns in flight on it

    # turn by turn over all sessions, so that the victim's sessions have turns left after the kill
    for k in (1, 2, 3):
        done_in_round = 0
        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(lambda a, k=k: one(*a, k), sids))
        if k == 1:
            assert all(t.ok for ts in turns.values() for t in ts)
    assert kill_at, "the kill did not happen"
    killed = kill_at[0]
    dep.proxy.wait_status({victim: "DOWN", survivor: "UP"}, timeout=10)
    every = [t for ts in turns.values() for t in ts]

    # failures: only requests that were in flight when the replica died, on that replica
    failed = [t for t in every if not t.ok]
    in_flight = [t for t in every if t.started < killed < t.ended]
    assert all(t.started < killed and t.served_by == victim for t in failed), [
        (t.sid, t.turn, t.status, t.served_by, round(t.started - killed, 3)) for t in failed
    ]
    assert all(t.ok and t.served_by == survivor for t in every if t.started > killed + 0.05)

    # the victim's sessions went on on the survivor with their whole history
    moved = [
        sid
        for sid, ts in turns.items()
        if ts[0].served_by == victim and any(t.ok for t in ts if t.started > killed)
    ]
    assert moved, "no session of the killed replica had a turn left"
    for sid in moved:
        ts = sorted(turns[sid], key=lambda t: t.turn)
        if ts[0].kind == "n8n":
            continue  # its history is checked in PostgreSQL below
        after = [t for t in ts if t.started > killed and t.ok]
        first, prev = after[0], [t for t in ts if t.turn < after[0].turn and t.ok]
        if prev:  # the new replica replayed every earlier turn: the prompt holds them all
            last = prev[-1]
            assert (
                first.usage["prompt_tokens"] > last.usage["prompt_tokens"] + last.usage["completion_tokens"]
            )

    lost = lost_turns(dep, every)
    assert lost == [], [(t.sid, t.turn) for t in lost]
    # each stored session holds its acknowledged turns in order
    stored = dep.stored()
    for sid, ts in turns.items():
        questions = [c for role, c in stored.get(sid, []) if role == "user"]
        acked = [t.text for t in sorted(ts, key=lambda t: t.turn) if t.ok]
        positions = [max(i for i, q in enumerate(questions) if q == text) for text in acked]
        assert positions == sorted(positions), sid
    # questions stored without an answer after them: turns that died with the replica (and were
    # not retried), or the first copy of one HAProxy replayed on the survivor
    unanswered = 0
    for sid in turns:
        roles = [role for role, _ in stored.get(sid, [])] + ["end"]
        unanswered += sum(
            r == "user" and nxt != "assistant" for r, nxt in zip(roles, roles[1:], strict=False)
        )

    stats = dep.proxy.stats()
    report(
        dep,
        {
            "failover": {
                "sessions": len(sids),
                "requests": len(every),
                "acknowledged": sum(t.ok for t in every),
                "in_flight_at_kill": len(in_flight),
                "failed": len(failed),
                "failed_statuses": dict(Counter(str(t.status) for t in failed)),
                "sessions_moved": len(moved),
                "messages_lost": len(lost),
                "unanswered_questions_stored": unanswered,
                "haproxy_retries": int(stats[("by_session", "BACKEND")].get("wretr") or 0),
                "haproxy_redispatches": int(stats[("by_session", "BACKEND")].get("wredis") or 0),
                "victim_status": stats[("by_session", victim)]["status"],
            }
        },
    )
