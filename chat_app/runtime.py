"""Live runs in this process: the ordered event log, its fan-out and its batched recording.

A run's events go to subscribers first (in memory, no disk wait) and to the database in batches:
on a short timer (``RUN_EVENT_FLUSH_INTERVAL``) and at once for every state change (any event
class with ``durable = True``), so a 5,000-token reply is a handful of inserts, not 5,000. A
subscriber in another process (or after the run left memory) reads the database instead.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from django.conf import settings
from django.utils import timezone

from .events import RecordedEvent, RunEventBase
from .models import Run, RunEvent

logger = logging.getLogger("orchestrator.runs")

LIVE_RUNS: dict[str, "LiveRun"] = {}
# How long a finished run stays in memory for late subscribers before they read the database.
_LINGER_SECONDS = 30.0
_DB_POLL_SECONDS = 0.3
# How long a database reader waits for agent.end after it sees the run's terminal status.
_TERMINAL_GRACE_SECONDS = 3.0


class LiveRun:
    def __init__(self, run_id: str, *, next_seq: int = 1):
        self.run_id = str(run_id)
        self.events: list[RecordedEvent] = []
        self.first_seq = next_seq
        self.done = False
        self.task: asyncio.Task | None = None
        # Cancelling the task is only safe while it runs the engine: before that its setup would
        # die without recording an end, after that its end is being recorded.
        self.cancellable = False
        self.cancel_requested = False
        self._changed = asyncio.Event()
        self._pending: list[RunEvent] = []
        self._flush_lock = asyncio.Lock()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._next_seq = next_seq

    async def emit(self, event: RunEventBase) -> RecordedEvent:
        now = timezone.now()
        recorded = RecordedEvent(run_id=self.run_id, seq=self._next_seq, event=event.event,
                                 at=now.isoformat(), payload=event.to_dict())
        self._next_seq += 1
        self.events.append(recorded)
        self._pending.append(RunEvent(run_id=self.run_id, seq=recorded.seq, event=recorded.event, at=now,
                                      payload=recorded.payload))
        self._notify()
        if event.durable:
            await self.flush()
        elif self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(float(settings.RUN_EVENT_FLUSH_INTERVAL), self._flush_soon)
        return recorded

    def _flush_soon(self) -> None:
        self._flush_handle = None
        task = asyncio.ensure_future(self.flush())
        task.add_done_callback(lambda t: t.cancelled() or t.exception() and logger.error(
            "event flush failed for run %s", self.run_id, exc_info=t.exception()))

    async def flush(self) -> None:
        async with self._flush_lock:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
                self._flush_handle = None
            if not self._pending:
                return
            rows, self._pending = self._pending, []
            await RunEvent.objects.abulk_create(rows)

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def request_cancel(self) -> None:
        self.cancel_requested = True
        if self.cancellable and self.task is not None and not self.task.done():
            self.task.cancel()

    def finish(self) -> None:
        self.done = True
        self._notify()

    async def subscribe(self, after_seq: int = 0) -> AsyncIterator[RecordedEvent]:
        index = max(0, after_seq - self.first_seq + 1)
        while True:
            changed = self._changed
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.done:
                return
            await changed.wait()


def register(live: LiveRun) -> None:
    LIVE_RUNS[live.run_id] = live


def linger_then_forget(live: LiveRun) -> None:
    loop = asyncio.get_running_loop()
    loop.call_later(_LINGER_SECONDS, lambda: LIVE_RUNS.pop(live.run_id, None) if LIVE_RUNS.get(live.run_id) is live else None)


async def subscribe(run_id: str, after_seq: int = 0) -> AsyncIterator[RecordedEvent]:
    """Every event of a run after ``after_seq``, in order, then live ones until the run ends."""
    run_id = str(run_id)
    live = LIVE_RUNS.get(run_id)
    if live is not None:
        async for item in live.subscribe(after_seq):
            yield item
        return
    last = after_seq
    ended_at: float | None = None
    while True:
        status = await Run.objects.filter(id=run_id).values_list("status", flat=True).afirst()
        rows = [r async for r in RunEvent.objects.filter(run_id=run_id, seq__gt=last).order_by("seq")]
        for row in rows:
            last = row.seq
            yield RecordedEvent(run_id=run_id, seq=row.seq, event=row.event, at=row.at.isoformat(), payload=row.payload)
            if row.event == "agent.end":
                return
        if status is None:
            return
        if status in Run.TERMINAL:
            # The status is committed a moment before the run's last events (agent.message,
            # agent.end) are flushed: keep reading until agent.end, but not forever (a process
            # that died mid-run never writes it).
            if await RunEvent.objects.filter(run_id=run_id, event="agent.end").aexists():
                if not await RunEvent.objects.filter(run_id=run_id, seq__gt=last).aexists():
                    return
                continue
            ended_at = ended_at if ended_at is not None else asyncio.get_running_loop().time()
            if asyncio.get_running_loop().time() - ended_at > _TERMINAL_GRACE_SECONDS:
                return
        live = LIVE_RUNS.get(run_id)
        if live is not None:  # the run started here meanwhile
            async for item in live.subscribe(last):
                yield item
            return
        await asyncio.sleep(_DB_POLL_SECONDS)


async def cancel_local(run_id: str) -> bool:
    live = LIVE_RUNS.get(str(run_id))
    if live is None or live.task is None or live.task.done():
        return False
    live.request_cancel()
    await asyncio.wait({live.task}, timeout=10)
    return True
