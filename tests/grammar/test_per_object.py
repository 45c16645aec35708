"""grammar.per_object: one value per live object and key, built once even when asked concurrently."""

from __future__ import annotations

import threading
import time

from grammar.per_object import PerObjectCache


class _Thing:
    pass


def test_built_once_per_object_and_key():
    cache: PerObjectCache[list] = PerObjectCache()
    builds = []
    a, b = _Thing(), _Thing()

    def build(tag):
        builds.append(tag)
        return [tag]

    first = cache.get(a, (1,), lambda: build("a1"))
    assert cache.get(a, (1,), lambda: build("again")) is first
    assert cache.get(a, (2,), lambda: build("a2")) == ["a2"]
    assert cache.get(b, (1,), lambda: build("b1")) == ["b1"]
    assert builds == ["a1", "a2", "b1"] and len(cache) == 3


def test_an_entry_is_never_served_to_another_object_with_the_same_id():
    cache: PerObjectCache[str] = PerObjectCache()
    a = _Thing()
    cache.get(a, (), lambda: "a")
    impostor = _Thing()
    cache._entries[(id(impostor),)] = (a, "a")  # as if impostor had taken a's id
    assert cache.get(impostor, (), lambda: "impostor") == "impostor"


def test_concurrent_requests_build_once():
    cache: PerObjectCache[int] = PerObjectCache()
    obj, calls, got = _Thing(), [], []

    def build():
        calls.append(1)
        time.sleep(0.05)
        return 7

    threads = [threading.Thread(target=lambda: got.append(cache.get(obj, (), build))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [7] * 8 and len(calls) == 1
