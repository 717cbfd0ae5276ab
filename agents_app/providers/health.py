"""Provider health: active probes (cached) and passive health from real traffic.

Active: one cheap request per provider — ``GET /v1/models`` for an Anthropic-compatible API,
``GET /api/tags`` for Ollama — at most once per ``PROVIDER_HEALTH_TTL`` seconds (a
:class:`~agents_app.health.CachedProbe`), never on every request. Implicit ``anthropic`` is not
probed (as before providers existed: its first real request tells).

Passive (LiteLLM's cooldowns, stricter): every failed attempt is counted. A 429 with
``Retry-After``/``retry-after-ms`` cools the provider down for that long (capped by
``PROVIDER_COOLDOWN_MAX``); an unreachable provider, or ``PROVIDER_FAILURE_THRESHOLD`` failures
in a row, cools it down for ``PROVIDER_COOLDOWN_SECONDS``. A success clears the streak. A cooling
or unhealthy provider is skipped while a healthy candidate exists; when none does, it is tried
anyway (the state may be stale) and the rationale says so.

The state is per process (each server learns from its own traffic); ``/v1/providers`` shows it.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import requests
from django.conf import settings

from agents_app.health import CachedProbe, ProbeResult, health_changed

from .registry import ProviderInfo

_RECENT_WINDOW = 300.0  # seconds of errors /v1/providers counts as "recent"


@dataclass
class _State:
    streak: int = 0
    errors: deque = field(default_factory=lambda: deque(maxlen=50))  # (time.time(), code)
    cooldown_until: float = 0.0  # time.time()
    cooldown_reason: str = ""
    rate_limited_until: float = 0.0
    last_error: str = ""
    last_success: float = 0.0
    last_latency_ms: float | None = None


_STATES: dict[str, _State] = {}
_LOCK = threading.Lock()
_TARGETS: dict[str, ProviderInfo] = {}


def _state(name: str) -> _State:
    with _LOCK:
        return _STATES.setdefault(name, _State())


def provider_success(*, name: str, latency_ms: float | None = None) -> None:
    s = _state(name)
    s.streak = 0
    s.last_success = time.time()
    if latency_ms is not None:
        s.last_latency_ms = round(latency_ms, 1)


def provider_failure(*, name: str, code: str, message: str = "", retry_after: float | None = None) -> float | None:
    """Count a failed attempt; returns the cooldown end (``time.time()``) when it started one."""
    now = time.time()
    s = _state(name)
    health_changed()  # a cooldown may start (and the router's remembered decisions go)
    s.streak += 1
    s.errors.append((now, code))
    s.last_error = f"{code}: {message}"[:300]
    seconds: float | None = None
    if code == "rate_limited":
        seconds = retry_after if retry_after is not None else float(settings.PROVIDER_COOLDOWN_SECONDS)
        s.rate_limited_until = now + min(seconds, float(settings.PROVIDER_COOLDOWN_MAX))
        reason = f"rate limited (Retry-After {retry_after:g} s)" if retry_after is not None else "rate limited"
    elif code == "provider_unreachable":
        seconds, reason = float(settings.PROVIDER_COOLDOWN_SECONDS), "unreachable"
    elif s.streak >= int(settings.PROVIDER_FAILURE_THRESHOLD):
        seconds, reason = float(settings.PROVIDER_COOLDOWN_SECONDS), f"{s.streak} failures in a row"
    if seconds is None:
        return None
    until = now + min(max(seconds, 0.0), float(settings.PROVIDER_COOLDOWN_MAX))
    if until > s.cooldown_until:
        s.cooldown_until, s.cooldown_reason = until, reason
    return s.cooldown_until


def cooldown_until(name: str) -> float | None:
    s = _STATES.get(name)
    return s.cooldown_until if s is not None and s.cooldown_until > time.time() else None


def reset_health() -> None:
    """Forget everything learned (tests; an admin saving a provider)."""
    with _LOCK:
        _STATES.clear()
    PROBE.clear()  # (which counts as a health change)


# --- active probes -----------------------------------------------------------------------------

def _check(name: str) -> str | None:
    info = _TARGETS.get(name)
    if info is None:
        return None
    timeout = float(settings.PROVIDER_PROBE_TIMEOUT)
    base = (info.resolved_base_url() or "").rstrip("/")
    if info.kind == "ollama":
        url, headers = base + "/api/tags", {}
    elif info.kind == "anthropic":
        url = (base or "https://api.anthropic.com") + "/v1/models"
        headers = {"anthropic-version": "2023-06-01", **info.auth_headers()}
    else:
        return None
    try:
        response = requests.get(url, headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        return f"unreachable ({type(exc).__name__})"
    # Up is what counts: an Anthropic-compatible API without a models list (404/405) is reachable;
    # a rejected key (401/403) or a server error means runs would fail too.
    if response.status_code in (401, 403) or response.status_code >= 500:
        path = "/api/tags" if info.kind == "ollama" else "/v1/models"
        return f"GET {path} answered HTTP {response.status_code}"
    return None


PROBE = CachedProbe(_check, ttl=lambda: float(settings.PROVIDER_HEALTH_TTL))


def probe(info: ProviderInfo) -> ProbeResult | None:
    """The cached probe of a provider (None: not probed — implicit anthropic, mock, or disabled)."""
    if not info.health_check or info.kind not in ("anthropic", "ollama") or info.unavailable_reason():
        return None
    if info.implicit and info.kind == "ollama":
        from agents_app.engines.ollama import OLLAMA_PROBE

        return OLLAMA_PROBE.result(settings.OLLAMA_URL)
    _TARGETS[info.name] = info
    return PROBE.result(info.name)


def skip_reason(info: ProviderInfo) -> str | None:
    """Why routing should pass this provider over while another is healthy, or None."""
    until = cooldown_until(info.name)
    if until is not None:
        s = _STATES[info.name]
        return f"cooling down until {_iso(until)} ({s.cooldown_reason})"
    result = probe(info)
    if result is not None and not result.ok:
        return f"unhealthy: {result.reason}"
    return None


def provider_status(info: ProviderInfo, *, check: bool = True) -> dict[str, Any]:
    """Status for ``/v1/providers`` and ``/health``; never the key."""
    now = time.time()
    s = _STATES.get(info.name) or _State()
    unavailable = info.unavailable_reason()
    result = probe(info) if check and not unavailable else None
    until = s.cooldown_until if s.cooldown_until > now else None
    if unavailable:
        status = "unavailable"
    elif until is not None:
        status = "cooling_down"
    elif result is not None and not result.ok:
        status = "unhealthy"
    else:
        status = "healthy" if (result is not None or s.last_success) else "unknown"
    out: dict[str, Any] = {
        "status": status,
        "latencyMs": result.latency_ms if result is not None else s.last_latency_ms,
        "checkedAt": _iso(result.checked_at) if result is not None else None,
        "recentErrors": sum(1 for t, _ in s.errors if now - t <= _RECENT_WINDOW),
        "lastError": s.last_error or None,
        "rateLimited": s.rate_limited_until > now,
        "rateLimitedUntil": _iso(s.rate_limited_until) if s.rate_limited_until > now else None,
        "cooldownUntil": _iso(until) if until else None,
        "cooldownReason": s.cooldown_reason if until else None,
    }
    if unavailable:
        out["reason"] = unavailable
    elif result is not None and not result.ok:
        out["reason"] = result.reason
    return out


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()
