"""A small TTL cache that serves an expired entry while one background load replaces it.

The run-start burst reads an agent's spec, its MCP links and the provider registry. They change
rarely, so each is cached for ``AGENT_CACHE_SECONDS``; with a plain TTL, the first request after
every expiry paid the database reads (and, on the event loop, a hop to a thread): one chat start
in every few was several milliseconds slower (measured: c=1 first-delta p95 12.6 ms against
8.4 ms with the cache never expiring). Here an expired entry is still returned, and one load
per key runs on a background thread to replace it ("stale while revalidate"), so the request
path reads the database only for a key it has never seen (or one a check says is invalid).

What this costs in freshness: an edit made in another process is seen within the TTL plus the
time to the next request and its background load (which starts ``REFRESH_DELAY`` after that
request, so as not to compete with it); an edit in this process still clears the cache
at once (the callers connect :meth:`RefreshingCache.clear` to the models' save and delete
signals), and a load that started before a clear never installs its older result. A background
load that fails drops the entry, so the next request loads it itself and sees the error (an
agent deleted elsewhere answers ``agent_not_found`` then, not the stale agent forever).

The background thread keeps no database connection between loads (each load closes its own):
the loads are rare, and an idle connection per process is not worth keeping for them.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Generic, Hashable, TypeVar

logger = logging.getLogger("orchestrator.cache")

V = TypeVar("V")

_LOADER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orchestrator-cache")
# A background load starts this long after the request that found the entry expired: that
# request's own start (its burst, its provider call) comes first. Run at once, the load's ORM work
# took the GIL from it: measured side by side (50 rounds at c=1), first-delta p95 13.8 ms against
# 11.2 ms with this delay and 10.9 ms with a cache that never expires.
REFRESH_DELAY = 0.05
# Then it waits while the process is busy starting streams (``defer_loads_while``; the run
# executor says so while a run it started has not yet had its first output), checked every
# BUSY_RECHECK seconds, at most REFRESH_MAX_DELAY seconds in all: a load's ORM work holds the GIL
# for milliseconds, and under a burst of starts every start of the burst waited for it (py-spy
# over 40 rounds of 10 concurrent chat starts: the loads took ~7% of the event loop's busy time,
# landing in one round in three or four).
REFRESH_MAX_DELAY = 1.0
BUSY_RECHECK = 0.01
_BUSY: list[Callable[[], bool]] = []


def defer_loads_while(busy: Callable[[], bool]) -> None:
    """Background loads (of every cache) wait while ``busy()`` is true (see REFRESH_MAX_DELAY).
    ``busy`` is called from the loader thread: it must only read (a set's length, a flag)."""
    if busy not in _BUSY:
        _BUSY.append(busy)


def _busy() -> bool:
    return any(busy() for busy in _BUSY)


def seconds_setting(name: str) -> Callable[[], float]:
    """A ``ttl`` that reads the Django setting ``name`` (seconds; unset or 0: no caching) at each use,
    so tests and ``override_settings`` take effect at once."""
    from django.conf import settings

    return lambda: float(getattr(settings, name, 0) or 0)


def _close_connections() -> None:
    from django.db import connections

    connections.close_all()


class RefreshingCache(Generic[V]):
    """``key -> value`` for ``ttl()`` seconds, then served stale while it reloads; see the module."""

    def __init__(self, name: str, *, ttl: Callable[[], float], max_entries: int = 10_000, secret_keys: bool = False):
        self.name = name
        self._secret_keys = secret_keys  # keys are credentials: never in a log line
        self._ttl = ttl
        self._max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, V]] = {}
        self._refreshing: set[Hashable] = set()
        self._generation = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, load: Callable[[], V], *, valid: Callable[[V], bool] | None = None) -> V:
        """The cached value of ``key``, else ``load()`` (cached when the TTL is above 0).

        ``valid(value)`` may reject a cached value (e.g. a file changed under it): it is then
        loaded now, as if it had never been cached. ``load`` may raise; nothing is cached then.
        """
        ttl = self._ttl()
        if ttl <= 0:
            return load()
        hit = self._entries.get(key)
        if hit is not None and (valid is None or valid(hit[1])):
            if hit[0] <= time.monotonic():
                self._refresh(key, load, ttl)
            return hit[1]
        generation = self._generation
        value = load()
        self._store(key, value, ttl, generation)
        return value

    def clear(self) -> None:
        """Forget every entry; loads already running do not install their (older) results."""
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def drain(self, timeout: float = 10.0) -> None:
        """Wait for the background loads queued so far (tests)."""
        _LOADER.submit(lambda: None).result(timeout)

    # --- internals -----------------------------------------------------------------------------
    def _store(self, key: Hashable, value: V, ttl: float, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return  # cleared while loading: what was loaded may predate the change
            if len(self._entries) >= self._max_entries and key not in self._entries:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + ttl, value)

    def _refresh(self, key: Hashable, load: Callable[[], V], ttl: float) -> None:
        with self._lock:
            if key in self._refreshing:
                return
            self._refreshing.add(key)
            generation = self._generation
        try:
            _LOADER.submit(self._load_in_background, key, load, ttl, generation)
        except RuntimeError:  # the interpreter is shutting down: serve the stale value
            with self._lock:
                self._refreshing.discard(key)

    def _load_in_background(self, key: Hashable, load: Callable[[], Any], ttl: float, generation: int) -> None:
        time.sleep(REFRESH_DELAY)
        deadline = time.monotonic() + REFRESH_MAX_DELAY
        while _busy() and time.monotonic() < deadline:
            time.sleep(BUSY_RECHECK)
        try:
            value = load()
        except Exception:  # noqa: BLE001 - the next request loads it itself and sees the error
            logger.warning("reloading %s %s failed; the next request loads it", self.name,
                           "(a key not logged)" if self._secret_keys else repr(key), exc_info=True)
            with self._lock:
                if generation == self._generation:
                    self._entries.pop(key, None)
        else:
            self._store(key, value, ttl, generation)
        finally:
            with self._lock:
                self._refreshing.discard(key)
            _close_connections()
