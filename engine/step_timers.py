"""Timers wrapped around named methods of live engine objects (benchmarks only): the time each call
took is summed under a label; restore() puts the original methods back."""

from __future__ import annotations

import time
from collections.abc import Callable


class StepTimers:
    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.totals: dict[str, float] = {}
        self._saved: list[tuple[object, str, object]] = []

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)
        totals, clock = self.totals, self.clock

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0.0) + clock() - t0

        self._saved.append((owner, name, fn))
        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()
