"""The run doorbell: the channel layer wakes a waiting run; the database stays the truth.

Each live run listens on its own channel in the group ``run.<id>``. A decision on a tool
confirmation (or a cancel request) updates the database first, then rings the group. The
listener turns rings into asyncio events that waiting code awaits with a timeout, and waiting
code always re-reads the row afterwards, so a lost ring (channels-redis drops messages when a
channel is full) only delays a run by one recheck interval. With ``REDIS_URL`` set this works
across processes unchanged.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.layers import get_channel_layer

logger = logging.getLogger("orchestrator.doorbell")


# Rings of this kind (a new batch of events is recorded) go to their own group, joined only by
# readers in other processes: the executing run does not receive its own (a receive and a
# dispatch per batch), and with no such reader a ring costs two Redis round trips, not four.
EVENTS = "events"


def run_group(run_id: str, *, events: bool = False) -> str:
    return f"run.{run_id}.events" if events else f"run.{run_id}"


async def ring(run_id: str, kind: str, **data: Any) -> None:
    """Best effort: a failed ring is logged, never raised (the waiter re-checks the row)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(run_group(str(run_id), events=kind == EVENTS),
                               {"type": "doorbell", "kind": kind, **data})
    except Exception:  # noqa: BLE001 - the recheck timer covers a lost ring
        logger.warning("could not ring run %s (%s)", run_id, kind, exc_info=True)


class RunDoorbell:
    """Listens for rings addressed to one run; ``wait(key, timeout)`` returns True when rung.

    ``events=True``: only the ``events`` rings (a reader of the run's timeline); otherwise every
    other kind (cancel, confirmation decisions: the executing run).
    """

    def __init__(self, run_id: str, *, events: bool = False):
        self.run_id = str(run_id)
        self._group = run_group(self.run_id, events=events)
        self._events: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task | None = None
        self._channel: str | None = None
        self._layer = get_channel_layer()

    def _event(self, key: str) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def poke(self, key: str) -> None:
        """Wake local waiters directly (same process, no channel layer round trip)."""
        self._event(key).set()

    async def start(self) -> None:
        if self._layer is None:
            return
        try:
            self._channel = await self._layer.new_channel()
            await self._layer.group_add(self._group, self._channel)
        except Exception:  # noqa: BLE001
            logger.warning("doorbell for run %s not listening; relying on rechecks", self.run_id, exc_info=True)
            self._channel = None
            return
        self._task = asyncio.create_task(self._listen(), name=f"doorbell-{self.run_id}")

    async def _listen(self) -> None:
        assert self._layer is not None and self._channel is not None
        while True:
            try:
                message = await self._layer.receive(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - e.g. Redis hiccup: back off, rechecks cover it
                logger.warning("doorbell receive failed for run %s", self.run_id, exc_info=True)
                await asyncio.sleep(1.0)
                continue
            key = message.get("kind", "")
            if message.get("key"):
                key = f"{key}:{message['key']}"
            self._event(key).set()

    async def wait(self, key: str, timeout: float) -> bool:
        event = self._event(key)
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
        except asyncio.TimeoutError:
            return False
        event.clear()
        return True

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._layer is not None and self._channel:
            with contextlib.suppress(Exception):
                await self._layer.group_discard(self._group, self._channel)
