"""Cached reachability probes for providers that may or may not be running (a local Ollama).

The router asks "can this engine run here?" on every run, and ``/health`` asks on every call;
neither may wait on the network each time. A :class:`CachedProbe` runs one cheap check (for
Ollama: ``GET /api/tags``) at most once per ``ttl`` seconds per target, shares the answer
between threads (one probe in flight per target; the others reuse the last answer), and keeps
what it learned (ok, reason, latency, when) for ``/health``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from core.blocking import refuse_on_event_loop


# Bumped whenever what the probes (or the providers' passive health) say may have changed: a
# probe's answer differs from its last, a cache was cleared, a provider failed. The router
# remembers a decision only while this stays the same (agents_app/router.py).
_GENERATION = [0]


def health_generation() -> int:
    return _GENERATION[0]


def health_changed() -> None:
    _GENERATION[0] += 1


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    reason: str = ""
    latency_ms: float = 0.0
    checked_at: float = 0.0  # time.time() of the check


class CachedProbe:
    """``check(target)`` → reason string when down, ``None`` when up; cached per target for ``ttl`` s."""

    def __init__(self, check: Callable[[str], str | None], *, ttl: Callable[[], float]):
        self._check = check
        self._ttl = ttl
        self._results: dict[str, tuple[float, ProbeResult]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def result(self, target: str) -> ProbeResult:
        now = time.monotonic()
        cached = self._results.get(target)
        if cached is not None and now - cached[0] < self._ttl():
            return cached[1]
        # A probe waits on the network (and on another thread's probe): never on the event loop.
        refuse_on_event_loop("A provider probe waits on the network; call it from a thread.")
        with self._guard:
            lock = self._locks.setdefault(target, threading.Lock())
        if not lock.acquire(blocking=cached is None):
            return cached[1]  # another thread is probing: the last answer stands meanwhile
        try:
            cached = self._results.get(target)
            if cached is not None and time.monotonic() - cached[0] < self._ttl():
                return cached[1]
            started = time.monotonic()
            try:
                reason = self._check(target)
            except Exception as exc:  # noqa: BLE001 - a broken check means "not reachable", readably
                reason = f"{type(exc).__name__}: {exc}"
            result = ProbeResult(ok=reason is None, reason=reason or "",
                                 latency_ms=round((time.monotonic() - started) * 1000, 1), checked_at=time.time())
            previous = self._results.get(target)
            self._results[target] = (time.monotonic(), result)
            if previous is None or (previous[1].ok, previous[1].reason) != (result.ok, result.reason):
                health_changed()
            return result
        finally:
            lock.release()

    def clear(self) -> None:
        self._results.clear()
        health_changed()

    def forget(self, target: str) -> None:
        """Drop one target's cached answer: the next ``result`` checks again."""
        self._results.pop(target, None)
        health_changed()
