"""Giving freed memory back to the system: after a phase that frees a lot at once (a GGUF conversion,
the dense weights that kernels.onednn.pack_model replaced), Python's garbage is collected and glibc
is asked to return its free heap pages (malloc_trim), which it otherwise keeps for later
allocations: the process's resident memory then shows what it really holds."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import time


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS): nothing to trim
        return None


def _trim() -> None:
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(OSError):
            libc.malloc_trim(0)


def give_back() -> None:
    gc.collect()
    _trim()


class Trimmer:
    """malloc_trim at most once per interval_s, for a loop that frees step-sized buffers all the time:
    glibc returns freed memory on its own only from the top of a heap, so the pages of buffers freed
    in the middle stay resident until a trim (a trim takes well under a millisecond)."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._last = 0.0

    def maybe(self) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        _trim()


def limit_arenas(count: int = 2) -> None:
    """Cap glibc's malloc arenas (M_ARENA_MAX, as the MALLOC_ARENA_MAX variable does) for the threads
    that allocate from now on: by default every thread may get an arena of its own (up to 8 per core),
    and each keeps the memory its thread freed, so a server's tokenizer, engine and request threads hold
    many partly empty heaps at once."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, count)


_M_ARENA_MAX = -8  # malloc.h
