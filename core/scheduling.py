"""Output first: a run's readers run ahead of other ready work on the event loop.

asyncio runs ready callbacks first in, first out, one pass over what was ready at a time. Under a
burst of concurrent streams every pass holds one step of every stream: each run task reading
its provider's response, then, a pass later, each stream task writing what its run published.
So no stream wrote its first text before every run of the burst had read its response: the
median stream waited for all of that work, where a bare relay (reading the provider and
writing the client in one task) writes each first text as its response is read.

:func:`wake_first` sets an :class:`asyncio.Event` and moves the callbacks that woke (the
readers' task steps) to the front of the loop's ready queue: a reader runs right after the step
that published to it, in the same pass. Nothing else changes order between themselves; the
callbacks it overtakes run in the same pass or first thing in the next.

It reads the ready queue of CPython's own event loop (``BaseEventLoop._ready``, a deque, the
same since Python 3.4); on any other loop (uvloop, say) it is a plain ``set()``.
``LOOP_OUTPUT_FIRST=0`` turns it off.

Measured side by side (``bench/stream_bench.py``'s first-delta rounds at c=50, 14 rounds): the
median first text from 1.42x to 1.29x the bare relay's on SQLite, from 1.51x to 1.28x on
PostgreSQL + Redis (``bench/RESULTS.md``).
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Awaitable

from django.conf import settings


def wake_first(event: asyncio.Event) -> None:
    """``event.set()``, and the tasks it wakes run next on this loop, ahead of other ready work."""
    ready = _ready_queue()
    if ready is None:
        event.set()
        return
    before = len(ready)
    event.set()
    woken = len(ready) - before
    if woken > 0:
        # extendleft reverses what it is given, and the pops come last-first: order kept.
        ready.extendleft([ready.pop() for _ in range(woken)])


async def yield_to_readers() -> None:
    """Let readers just woken by :func:`wake_first` run before the calling task goes on.

    A run that published its first output would otherwise go straight on to read its provider's
    next event (several generator layers down to the socket, and back up when nothing is there
    yet) before its stream task gets to write that output: ~0.1 ms before every first text,
    traced in-process. One extra pass of the loop for the run, once. A no-op with
    ``LOOP_OUTPUT_FIRST=0``."""
    if getattr(settings, "LOOP_OUTPUT_FIRST", True):
        await asyncio.sleep(0)


def _ready_queue() -> deque | None:
    if not getattr(settings, "LOOP_OUTPUT_FIRST", True):
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    ready = getattr(loop, "_ready", None)
    return ready if type(ready) is deque else None


_DETACHED: set[asyncio.Task] = set()


def detach(coroutine: Awaitable[None]) -> None:
    """Run ``coroutine`` in a task of its own that nothing awaits (a clean-up a cancelled stream
    must not cut short, a check a callback starts), kept referenced until it ends; given a task
    (a cancelled listener still finishing), keep it referenced until it ends."""
    task = asyncio.ensure_future(coroutine)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
