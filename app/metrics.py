"""Prometheus metrics of one app: request counts, tokens, latency histograms, engine gauges and
the engine's prefix-cache counter.

Each app owns its CollectorRegistry, so several apps in one process (tests) do not collide."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _EngineCollector:
    """Reads engine.stats() at scrape time: running/waiting requests, KV blocks, prefix-cache hits."""

    def __init__(self, get_engine) -> None:
        self.get_engine = get_engine

    def collect(self):
        engine = self.get_engine()
        stats: dict[str, Any] = engine.stats() if engine is not None else {}

        def gauge(name: str, doc: str, value: float | None):
            family = GaugeMetricFamily(name, doc)
            if value is not None:
                family.add_metric([], float(value))
            return family

        total = stats.get("total_blocks")
        free = stats.get("free_blocks")
        yield gauge("chatloom_requests_running", "Requests being decoded.", stats.get("running"))
        yield gauge("chatloom_requests_waiting", "Requests waiting to be scheduled.", stats.get("waiting"))
        used = total - free if total is not None and free is not None else None
        yield gauge("chatloom_kv_blocks_used", "KV cache blocks in use.", used)
        yield gauge("chatloom_kv_blocks_total", "KV cache blocks in the pool.", total)
        # a running total since the engine started: a counter (exposed as ..._total), so rate()
        # and increase() work on it
        hits = CounterMetricFamily(
            "chatloom_prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache since start."
        )
        if stats.get("prefix_cache_hit_tokens") is not None:
            hits.add_metric([], float(stats["prefix_cache_hit_tokens"]))
        yield hits
        yield from _speculation(stats, gauge)


def _speculation(stats: dict, gauge):
    """Speculative decoding's counters (engine.speculative) and, since start, its acceptance rate and
    tokens a verification step keeps (accepted proposals plus the one every step samples)."""
    names = ("proposed_tokens", "accepted_tokens", "verify_steps")
    if "spec_verify_steps" not in stats:
        return
    docs = ("Tokens proposed for verification.", "Proposed tokens accepted.", "Sequence verification steps.")
    for name, doc in zip(names, docs, strict=True):
        c = CounterMetricFamily(f"chatloom_spec_{name}", doc + " Since start.")
        c.add_metric([], float(stats[f"spec_{name}"]))
        yield c
    proposed, accepted, steps = (stats[f"spec_{n}"] for n in names)
    rate = accepted / proposed if proposed else None
    yield gauge("chatloom_spec_acceptance_rate", "Accepted / proposed tokens since start.", rate)
    per = (accepted + steps) / steps if steps else None
    yield gauge("chatloom_spec_tokens_per_step", "Tokens kept per verification step since start.", per)


class Metrics:
    def __init__(self, get_engine) -> None:
        disable_created_metrics()  # no *_created series: timestamps, not measurements
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "chatloom_requests", "Finished API requests.", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("chatloom_prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("chatloom_generation_tokens", "Tokens generated.", registry=r)
        self.ttft = Histogram(
            "chatloom_time_to_first_token_seconds",
            "Time from request to its first generated token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "chatloom_inter_token_latency_seconds",
            "Time between consecutive generated tokens of one sequence.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "chatloom_request_duration_seconds",
            "Time from request to its last token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_EngineCollector(get_engine))
