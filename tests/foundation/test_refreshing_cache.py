"""The config caches of the run-start burst: an expired entry is served while it reloads in the background."""
from __future__ import annotations

import threading
import time

import pytest

from core.refreshing_cache import RefreshingCache


def _wait_for(condition, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


class _Source:
    """A loader that counts its calls, optionally held until released, optionally failing."""

    def __init__(self, value: str = "v1"):
        self.value = value
        self.calls = 0
        self.threads: list[str] = []
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.error: Exception | None = None

    def load(self) -> str:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return self.value


def _expire(cache: RefreshingCache, key) -> None:
    cache._entries[key] = (time.monotonic() - 1, cache._entries[key][1])


def test_a_fresh_entry_is_served_without_loading():
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    assert cache.get("k", source.load) == "v1"
    assert cache.get("k", source.load) == "v1"
    assert source.calls == 1


def test_ttl_zero_loads_every_time():
    cache, source = RefreshingCache("t", ttl=lambda: 0), _Source()
    cache.get("k", source.load)
    cache.get("k", source.load)
    assert source.calls == 2


def test_an_expired_entry_is_served_while_one_background_load_replaces_it():
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    cache.get("k", source.load)
    _expire(cache, "k")
    source.value, source.gate = "v2", threading.Event()
    source.started.clear()
    # Expired: the old value at once (no wait on the held loader), and only one reload however many ask.
    assert [cache.get("k", source.load) for _ in range(5)] == ["v1"] * 5
    assert source.started.wait(10)
    source.gate.set()
    cache.drain()
    assert cache.get("k", source.load) == "v2"
    assert source.calls == 2
    assert source.threads[-1].startswith("orchestrator-cache")


def test_a_clear_during_a_background_load_keeps_its_older_result_out():
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    cache.get("k", source.load)
    _expire(cache, "k")
    source.gate = threading.Event()
    source.started.clear()
    cache.get("k", source.load)  # starts the background load, which reads "v1" from the source...
    assert source.started.wait(10)
    cache.clear()  # ...and the data changes meanwhile (a save in this process clears the cache)
    source.gate.set()
    cache.drain()
    source.gate, source.value = None, "v2"
    assert cache.get("k", source.load) == "v2"


def test_a_failed_background_load_drops_the_entry_so_the_next_request_sees_the_error():
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    cache.get("k", source.load)
    _expire(cache, "k")
    source.error = LookupError("gone")
    assert cache.get("k", source.load) == "v1"
    cache.drain()
    with pytest.raises(LookupError):
        cache.get("k", source.load)


def test_an_invalid_entry_is_loaded_now():
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    cache.get("k", source.load)
    source.value = "v2"
    assert cache.get("k", source.load, valid=lambda value: value == "v2") == "v2"


@pytest.mark.django_db(transaction=True)
def test_an_agent_edited_elsewhere_is_served_once_more_then_reloaded(settings, agents):
    """Another process's edit (a queryset update: no signal here) shows after the TTL without a
    request ever waiting for the database read."""
    from agents_app.models import Agent
    from agents_app.selectors import _SPECS, agent_for_run

    settings.AGENT_CACHE_SECONDS = 60
    _SPECS.clear()
    _, spec = agent_for_run(role="coder")
    Agent.objects.filter(role="coder").update(system_prompt="You are edited elsewhere.")
    assert agent_for_run(role="coder")[1] is spec  # within the TTL: cached
    _expire(_SPECS, "coder")
    assert agent_for_run(role="coder")[1] is spec  # expired: served once more, reloading behind
    _SPECS.drain()
    assert agent_for_run(role="coder")[1].system_prompt.startswith("You are edited elsewhere.")
    Agent.objects.filter(role="coder").update(enabled=False)
    _expire(_SPECS, "coder")
    agent_for_run(role="coder")
    _SPECS.drain()
    from core.errors import NotFound

    with pytest.raises(NotFound):  # disabled elsewhere: the reload failed, so the next start says so
        agent_for_run(role="coder")
    _SPECS.clear()


def test_a_background_load_waits_while_the_process_is_busy_starting_streams(monkeypatch):
    from core import refreshing_cache

    busy = threading.Event()
    busy.set()
    asked = threading.Semaphore(0)

    def starting() -> bool:
        asked.release()
        return busy.is_set()

    monkeypatch.setattr(refreshing_cache, "_BUSY", [])
    monkeypatch.setattr(refreshing_cache, "REFRESH_DELAY", 0.0)
    refreshing_cache.defer_loads_while(starting)
    refreshing_cache.defer_loads_while(starting)  # once, however often it is registered
    assert refreshing_cache._BUSY == [starting]
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    cache.get("k", source.load)
    _expire(cache, "k")
    source.value = "v2"
    assert cache.get("k", source.load) == "v1"
    for _ in range(3):  # the loader asked, and asked again: it is waiting, not loading
        assert asked.acquire(timeout=10)
    assert source.calls == 1
    busy.clear()
    cache.drain()
    assert source.calls == 2 and cache.get("k", source.load) == "v2"


def test_a_background_load_waits_for_a_busy_process_at_most_refresh_max_delay(monkeypatch):
    from core import refreshing_cache

    monkeypatch.setattr(refreshing_cache, "_BUSY", [lambda: True])
    monkeypatch.setattr(refreshing_cache, "REFRESH_DELAY", 0.0)
    monkeypatch.setattr(refreshing_cache, "REFRESH_MAX_DELAY", 0.05)
    cache, source = RefreshingCache("t", ttl=lambda: 60), _Source()
    cache.get("k", source.load)
    _expire(cache, "k")
    source.value = "v2"
    cache.get("k", source.load)
    cache.drain()
    assert source.calls == 2 and cache.get("k", source.load) == "v2"


def test_the_run_executor_defers_background_loads_while_a_run_awaits_its_first_output():
    from chat_app.executor import get_executor
    from core import refreshing_cache

    executor = get_executor()
    assert executor._bursting in refreshing_cache._BUSY
    executor._starting.add("a-run")
    try:
        assert refreshing_cache._busy()
    finally:
        executor._starting.discard("a-run")
