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

    def replace(self, owner, name: str, make: Callable) -> None:
        """Replaces owner.name by make(the current owner.name); restore() puts the current one back."""
        fn = getattr(owner, name)
        self._saved.append((owner, name, fn))
        setattr(owner, name, make(fn))

    def around(self, owner, name: str, before=None, after=None) -> None:
        """Replaces owner.name by a call of it between before() and after(); restore() undoes it."""

        def make(fn):
            def wrapped(*args, **kwargs):
                if before is not None:
                    before()
                try:
                    return fn(*args, **kwargs)
                finally:
                    if after is not None:
                        after()

            return wrapped

        self.replace(owner, name, make)

    def wrap(self, owner, name: str, label: str) -> None:
        """Sums the wall time of owner.name's calls under label."""
        totals, clock = self.totals, self.clock
        start: list[float] = []

        def stop() -> None:
            totals[label] = totals.get(label, 0.0) + clock() - start.pop()

        self.around(owner, name, lambda: start.append(clock()), stop)

    def restore(self) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()
