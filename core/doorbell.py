"""The run doorbell: the channel layer wakes a waiting run; the database stays the truth.

A decision on a tool confirmation (or a cancel request) updates the database first, then rings
the run. Waiting code awaits an asyncio event with a timeout and always re-reads the row
afterwards, so a lost ring (channels-redis drops messages when a channel is full) only delays a
run by one recheck interval. With ``REDIS_URL`` set this works across processes unchanged.

Executing runs are rung through their process's **switchboard**: one channel per process (per
event loop), joined once to the group :data:`SWITCHBOARD_GROUP`; a ring for a run goes to that
group, and every process hands it to the run's doorbell if the run executes there (and drops it
otherwise). A run's start therefore costs no channel-layer call at all — with a channel and a
group membership per run it cost two Redis round trips and a listener task, ~11% of the time to
the first delta at c=10 and c=50 on PostgreSQL + Redis (bench, measured side by side). Rings are
rare (a cancel, a decision), so sending each to every process is cheap.

Readers of a run's timeline in another process (``events=True``) still join the run's own
``run.<id>.events`` group: the executing process rings it after every recorded batch, and only
processes with such a reader are in it.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import Any

from channels.layers import get_channel_layer

from core.scheduling import detach

logger = logging.getLogger("orchestrator.doorbell")


# Rings of this kind (a new batch of events is recorded) go to their own group, joined only by
# readers in other processes: the executing run does not receive its own (a receive and a
# dispatch per batch), and with no such reader a ring costs two Redis round trips, not four.
EVENTS = "events"


# Every process's switchboard channel is in this group (see the module docstring).
SWITCHBOARD_GROUP = "runs.doorbell"
# channels-redis forgets a group membership after its ``group_expiry`` (a day by default): the
# switchboard joins again when its membership is older than this.
REJOIN_SECONDS = 3600.0


def run_group(run_id: str, *, events: bool = False) -> str:
    return f"run.{run_id}.events" if events else f"run.{run_id}"


async def ring(run_id: str, kind: str, **data: Any) -> None:
    """Best effort: a failed ring is logged, never raised (the waiter re-checks the row)."""
    layer = get_channel_layer()
    if layer is None:
        return
    if kind == EVENTS:
        group, message = run_group(str(run_id), events=True), {"type": "doorbell", "kind": kind, **data}
    else:
        group, message = SWITCHBOARD_GROUP, {"type": "doorbell", "kind": kind, **data, "run": str(run_id)}
    try:
        await layer.group_send(group, message)
    except Exception:  # noqa: BLE001 - the recheck timer covers a lost ring
        logger.warning("could not ring run %s (%s)", run_id, kind, exc_info=True)


class _Switchboard:
    """This process's (this event loop's) one listening channel for the runs executing here."""

    def __init__(self, layer: Any):
        self._layer = layer
        self._doorbells: dict[str, RunDoorbell] = {}
        self._channel: str | None = None
        self._joined_at = 0.0
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    def listening(self) -> bool:
        """Joined (recently enough) and receiving: attaching a run needs no channel-layer call."""
        return self._task is not None and not self._task.done() and time.monotonic() - self._joined_at < REJOIN_SECONDS

    def attach_listening(self, doorbell: "RunDoorbell") -> bool:
        """:meth:`attach` when the switchboard listens already (no await); else False, nothing done."""
        if not self.listening():
            return False
        self._doorbells[doorbell.run_id] = doorbell
        return True

    async def attach(self, doorbell: "RunDoorbell") -> bool:
        """Route the run's rings to ``doorbell``; False when the channel layer cannot listen."""
        if self.attach_listening(doorbell):
            return True  # the common case: no channel-layer call, no await that suspends
        self._doorbells[doorbell.run_id] = doorbell
        async with self._lock:
            try:
                if self._channel is None:
                    self._channel = await self._layer.new_channel()
                if time.monotonic() - self._joined_at >= REJOIN_SECONDS or self._task is None or self._task.done():
                    await self._layer.group_add(SWITCHBOARD_GROUP, self._channel)
                    self._joined_at = time.monotonic()
            except Exception:  # noqa: BLE001 - e.g. Redis is down: rechecks cover, the next run retries
                logger.warning("the run switchboard is not listening; relying on rechecks", exc_info=True)
                return False
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._listen(), name="run-switchboard")
        return True

    def detach(self, doorbell: "RunDoorbell") -> None:
        if self._doorbells.get(doorbell.run_id) is doorbell:
            del self._doorbells[doorbell.run_id]

    async def _listen(self) -> None:
        assert self._channel is not None
        await _receive_forever(self._layer, self._channel, self._dispatch, "the run switchboard")

    def _dispatch(self, message: dict[str, Any]) -> None:
        doorbell = self._doorbells.get(str(message.get("run", "")))
        if doorbell is not None:  # else the run executes in another process
            doorbell.deliver(message)


async def _receive_forever(layer: Any, channel: str, handle: Any, who: str) -> None:
    """Hand every message on ``channel`` to ``handle``; a failing receive backs off and retries."""
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - e.g. Redis hiccup: back off, rechecks cover it
            logger.warning("%s: receive failed", who, exc_info=True)
            await asyncio.sleep(1.0)
            continue
        handle(message)


_SWITCHBOARDS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Switchboard]" = weakref.WeakKeyDictionary()


def _switchboard(layer: Any) -> _Switchboard:
    loop = asyncio.get_running_loop()
    board = _SWITCHBOARDS.get(loop)
    if board is None or board._layer is not layer:
        board = _SWITCHBOARDS[loop] = _Switchboard(layer)
    return board


class RunDoorbell:
    """Listens for rings addressed to one run; ``wait(key, timeout)`` returns True when rung.

    ``events=True``: only the ``events`` rings (a reader of the run's timeline), on the run's own
    events group; otherwise every other kind (cancel, confirmation decisions: the executing
    run), through the process's switchboard.
    """

    def __init__(self, run_id: str, *, events: bool = False):
        self.run_id = str(run_id)
        self._events_only = events
        self._group = run_group(self.run_id, events=events)
        self._events: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task | None = None
        self._channel: str | None = None
        self._board: _Switchboard | None = None
        self._layer = get_channel_layer()
        self._callbacks: dict[str, Any] = {}

    def _event(self, key: str) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def on(self, key: str, callback: Any) -> None:
        """Also call ``callback()`` (on the loop) each time ``key`` rings: for a listener that
        would otherwise be a task waiting for the ring all its life."""
        self._callbacks[key] = callback

    def poke(self, key: str) -> None:
        """Wake local waiters directly (same process, no channel layer round trip)."""
        self._rang(key)

    def deliver(self, message: dict[str, Any]) -> None:
        key = message.get("kind", "")
        if message.get("key"):
            key = f"{key}:{message['key']}"
        self._rang(key)

    def _rang(self, key: str) -> None:
        self._event(key).set()
        callback = self._callbacks.get(key)
        if callback is not None:
            try:
                callback()
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the switchboard's loop
                logger.exception("run %s: the %r ring's callback failed", self.run_id, key)

    def attach_now(self) -> bool:
        """:meth:`start` without suspending, when it can (no channel layer, or the process's
        switchboard already listening: every run start but the first); False: await
        :meth:`start` instead."""
        if self._layer is None:
            return True
        if self._events_only:
            return False
        board = _switchboard(self._layer)
        if not board.attach_listening(self):
            return False
        self._board = board
        return True

    async def start(self) -> None:
        if self._layer is None:
            return
        if not self._events_only:
            board = _switchboard(self._layer)
            if await board.attach(self):
                self._board = board
            else:
                board.detach(self)
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
        await _receive_forever(self._layer, self._channel, self.deliver, f"the doorbell of run {self.run_id}")

    async def wait(self, key: str, timeout: float) -> bool:
        event = self._event(key)
        if not event.is_set():
            try:
                # asyncio.timeout, not wait_for: no task per wait.
                async with asyncio.timeout(max(0.0, timeout)):
                    await event.wait()
            except TimeoutError:
                return False
        event.clear()
        return True

    async def stop(self) -> None:
        if self._board is not None:
            self._board.detach(self)
            self._board = None
        if self._task:
            task, self._task = self._task, None
            task.cancel()
            # Not awaited. On channels-redis, awaiting the cancelled receive could hang the
            # reader's stream: it happened on the third replay of a finished run in a row, and the
            # response never ended. Not awaited, the receive ended within milliseconds. A stream
            # must not wait on the layer's clean-up to end its response; the task is kept until
            # it ends.
            detach(task)
        if self._layer is not None and self._channel:
            with contextlib.suppress(Exception):
                await self._layer.group_discard(self._group, self._channel)
