"""bench.host_step runs the real engine step with the device work stubbed: a short run completes,
keeps its batch full and reports the host parts it timed."""

from __future__ import annotations

import pytest

from bench import host_step as bench_host


@pytest.mark.slow
def test_bench_host_smoke():
    (r,) = bench_host.main(["--batch", "4", "--steps", "5"])
    assert r["batch"] == 4 and r["prefill_steps"] >= 1
    assert r["cpu_median_us"] > 0 and {"prepare", "finish (accept, detokenize)"} <= set(r["parts_us"])


@pytest.mark.slow
def test_bench_host_speculative_steps_accept_every_proposal():
    """--spec: the stub model continues the prompts' period, so each verification step yields k + 1."""
    (r,) = bench_host.main(["--spec", "3", "--batch", "2", "--steps", "6"])
    assert r["tokens_per_step"] == pytest.approx(2 * 4)
    assert {"propose", "prepare", "verify (accept, detokenize)"} <= set(r["parts_us"])
