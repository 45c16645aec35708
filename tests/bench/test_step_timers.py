"""StepTimers (benchmarks' --timeline): wall time summed per label, hooks around calls, restore."""

from __future__ import annotations

import pytest

from bench.step_timers import StepTimers


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Part:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def work(self, seconds: float, inner=None) -> str:
        self.clock.now += seconds
        if inner is not None:
            inner()
        return "done"


def test_wrap_sums_nested_calls_and_restore_puts_methods_back():
    clock = _Clock()
    part = _Part(clock)
    original = part.work
    timers = StepTimers(clock)
    timers.wrap(part, "work", "part.work")
    assert part.work(2.0) == "done"
    # a nested call: the outer one counts the inner one's time too, each under its own start
    assert part.work(1.0, inner=lambda: part.work(0.5)) == "done"
    assert timers.totals == {"part.work": 2.0 + 1.5 + 0.5}
    timers.restore()
    assert part.work == original


def test_around_hooks_run_in_order_even_when_the_call_raises():
    seen: list[str] = []
    part = _Part(_Clock())
    timers = StepTimers()
    timers.around(part, "work", lambda: seen.append("before"), lambda: seen.append("after"))
    part.work(0.0, inner=lambda: seen.append("call"))
    with pytest.raises(ZeroDivisionError):
        part.work(0.0, inner=lambda: 1 / 0)
    assert seen == ["before", "call", "after", "before", "after"]
    timers.restore()
    part.work(0.0)
    assert seen[-1] == "after"  # no hooks once restored
