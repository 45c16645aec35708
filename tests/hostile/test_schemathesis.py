"""Schemathesis over the server's own OpenAPI document: generated requests (valid and not) for every
operation, with the API key, against the real server (tiny model). None may be answered with a 5xx.
Bounded: EXAMPLES per operation (a few hundred requests in all)."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

schemathesis = pytest.importorskip("schemathesis")

EXAMPLES = 8


def _operations(server) -> list:
    r = httpx.get(server.url + "/openapi.json", headers=server.headers, timeout=30)
    assert r.status_code == 200
    spec = r.json()
    schema = schemathesis.openapi.from_dict(spec)
    return [result.ok() for result in schema.get_all_operations()]


def test_no_generated_request_gets_a_5xx(server, client):
    from soak.cases import prepare

    prepare(client)
    operations = _operations(server)
    assert len(operations) >= 8
    failures: list[str] = []
    calls = 0
    for op in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=op.as_strategy())
        def check(case) -> None:
            nonlocal calls
            calls += 1
            response = case.call(base_url=server.url, headers=server.headers, timeout=120)
            if response.status_code >= 500:
                where = f"{case.method.upper()} {case.formatted_path}"
                failures.append(f"{where}: {response.status_code} {response.text[:200]}")

        check()
        assert server.alive, f"the server died:\n{server.log_tail()}"
    assert calls >= 4 * len(operations)
    assert failures == []
    assert not server.killed_for_memory
