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
