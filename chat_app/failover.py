"""Failover: run the engine on the router's candidates in turn, one retry loop for the run.

The router (``agents_app.router.route_run``) chose a provider and model and listed fallbacks on
other providers. A candidate that fails *before anything reached the client* — no event
yielded, no tool called — with a retryable error (connection refused or dropped, timeout, 5xx,
529 overloaded, 429 rate limited; not a 429 that means an exhausted quota, not a 4xx) hands the
run to the next candidate. Once output went out there is no failover: the run fails with a
readable error rather than send a second, different beginning of the answer.

When a failover candidate exists the SDK's own retries are off for that attempt
(``max_retries=0``): a 529 moves on at once instead of being retried three times with backoff
on the provider that is overloaded. The last candidate keeps the configured retries.

Every attempt feeds the provider's passive health (cooldowns, ``/v1/providers``). When the run
failed over, each attempt is on the timeline as a ``provider.attempt`` event (provider, model,
status, error code, duration, where it went next).

A route without candidates (engines without providers, the mock fallback) runs the engine once,
as before.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from agents_app.engines import EngineContext, EngineResult, get_engine
from agents_app.providers import health
from core.errors import EngineError, ErrorCode
from core.events import ProviderAttempt, RunEventBase

if TYPE_CHECKING:
    from .executor import RunLaunch


# Failures that say something about the provider (not about this request): they count towards
# its health. A 400 or a missing model is this request's problem and cools nothing down.
_PROVIDER_SIDE = frozenset({ErrorCode.AUTHENTICATION_FAILED, ErrorCode.PERMISSION_DENIED, ErrorCode.BILLING_ERROR,
                            ErrorCode.QUOTA_EXHAUSTED})


class _Progress:
    output = False


class _WatchedTools:
    """The run's tool port, noting that a tool was called (a side effect: no failover after it)."""

    def __init__(self, inner: Any, progress: _Progress):
        self._inner = inner
        self._progress = progress

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def call(self, **kwargs: Any) -> Any:
        self._progress.output = True
        return await self._inner.call(**kwargs)


async def engine_attempts(launch: "RunLaunch", ctx: EngineContext, *,
                          record: Callable[[RunEventBase], Awaitable[Any]]) -> AsyncIterator[RunEventBase | EngineResult]:
    """The engine's items for this run, failing over between candidates as described above."""
    candidates = list(getattr(launch.route, "candidates", ()) or ())
    if not candidates:
        engine_cls = get_engine(launch.engine)
        if engine_cls is None:
            raise EngineError(f"Engine {launch.engine!r} is not installed.", code=ErrorCode.UNKNOWN_ENGINE)
        async for item in engine_cls().run(ctx):
            yield item
        return
    progress = _Progress()
    tools = _WatchedTools(ctx.tools, progress)
    failed = 0
    for index, (info, model) in enumerate(candidates):
        last = index == len(candidates) - 1
        engine_cls = get_engine(info.engine or launch.engine)
        if engine_cls is None:
            raise EngineError(f"Engine {info.engine!r} is not installed.", code=ErrorCode.UNKNOWN_ENGINE)
        ctx.spent_on = (info.name, model)  # where tokens reported from here on were spent
        attempt_ctx = dataclasses.replace(ctx, provider=info.target(max_retries=None if last else 0), model=model,
                                          tools=tools)
        started = time.monotonic()
        first_item: float | None = None
        try:
            async for item in engine_cls().run(attempt_ctx):
                if first_item is None:
                    first_item = time.monotonic()
                if isinstance(item, EngineResult):
                    item.provider, item.model = info.name, model
                else:
                    progress.output = True
                yield item
        except EngineError as exc:
            ms = round((time.monotonic() - started) * 1000, 1)
            if exc.retryable or exc.code in _PROVIDER_SIDE:
                health.provider_failure(name=info.name, code=exc.code, message=exc.message,
                                        retry_after=exc.retry_after)
            moving_on = exc.retryable and not progress.output and not last
            if failed or moving_on:
                nxt = candidates[index + 1] if moving_on else None
                await record(ProviderAttempt(
                    attempt=index + 1, provider=info.name, model=model, status="failed", duration_ms=ms,
                    error_code=exc.code, error=exc.message[:500], retry_after=exc.retry_after,
                    next=f"{nxt[0].name}/{nxt[1]}" if nxt else None))
            if moving_on:
                failed += 1
                continue
            if progress.output and exc.retryable and not last:
                exc.message += " (No failover: part of the answer had already been sent.)"
            if failed:  # the run's recorded provider was the first choice: say where this happened
                exc.message += f" (attempt {index + 1} of {len(candidates)}, on {info.name}/{model})"
            exc.args = (exc.message,)
            raise
        ms = round((time.monotonic() - started) * 1000, 1)
        # Latency as /v1/providers shows it: until the provider's first answer, not the whole run.
        health.provider_success(name=info.name, latency_ms=((first_item or time.monotonic()) - started) * 1000)
        if failed:
            await record(ProviderAttempt(attempt=index + 1, provider=info.name, model=model, status="succeeded",
                                         duration_ms=ms))
        return
