"""The one thread that does an engine's torch work: it loads the model and runs every step.

On the CPU torch runs its parallel regions on an OpenMP team that belongs to the thread that starts
them. A model loaded on one thread and stepped on another left two teams on the machine, and the
same decode steps took 1.5-2x as long on the 2-core host (docs/performance.md, session 4, issue 45).
So LLM and AsyncEngine build their EngineCore on the thread that steps it.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class StepThread:
    """A daemon thread running submitted calls in order (a daemon: an engine never started or
    never shut down must not keep the interpreter from exiting). It also stops when `owner` (the
    engine) is collected."""

    def __init__(self, name: str, owner: object) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()
        weakref.finalize(owner, self.stop)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        if self._stopped:  # a call queued behind the stop would never run, and its waiter never wake
            raise RuntimeError(f"{self._thread.name} is stopped")
        fut: Future = Future()
        self._jobs.put((fn, args, fut))
        return fut

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the thread, waited for; its exception is raised here."""
        return self.submit(fn, *args).result()

    def stop(self) -> None:
        """Ends the thread once the calls already submitted are done."""
        if not self._stopped:
            self._stopped = True
            self._jobs.put(None)

    def join(self, timeout: float | None = None) -> None:
        """Waits for the thread to end (after stop)."""
        self._thread.join(timeout)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, fut = job
            del job  # the finished call's references (the engine) must not outlive it here
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # delivered to the caller
                    fut.set_exception(e)
            del fn, args, fut
