"""The run doorbell's switchboard: one listening channel per process, no channel-layer call per run.

Across processes (two daphne servers on one Redis) the same paths are exercised by
``tests/agent_chat/test_two_servers.py``.
"""
from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer

from core.doorbell import SWITCHBOARD_GROUP, RunDoorbell, ring


class _Counting:
    """Counts the channel layer's calls (wrapping the real in-memory layer's methods)."""

    def __init__(self, layer, monkeypatch):
        self.calls: list[str] = []
        for name in ("new_channel", "group_add", "group_discard"):
            real = getattr(layer, name)

            async def counted(*args, _real=real, _name=name, **kwargs):
                self.calls.append(_name)
                return await _real(*args, **kwargs)

            monkeypatch.setattr(layer, name, counted)


async def test_a_ring_wakes_only_its_run_and_a_ring_for_a_run_elsewhere_is_dropped():
    first, second = RunDoorbell("run-a"), RunDoorbell("run-b")
    await first.start()
    await second.start()
    try:
        await ring("run-a", "cancel")
        assert await first.wait("cancel", 5)
        assert not await second.wait("cancel", 0.2)
        await ring("run-elsewhere", "cancel")  # executes in no doorbell of this process
        await ring("run-b", "confirmation", key="c1")
        assert await second.wait("confirmation:c1", 5)
        assert not await first.wait("confirmation:c1", 0.2)
    finally:
        await first.stop()
        await second.stop()


async def test_a_stopped_run_no_longer_receives_and_a_restarted_one_does():
    bell = RunDoorbell("run-c")
    await bell.start()
    await bell.stop()
    await ring("run-c", "cancel")
    again = RunDoorbell("run-c")
    await again.start()
    try:
        assert not await bell.wait("cancel", 0.2)
        await ring("run-c", "cancel")
        assert await again.wait("cancel", 5)
    finally:
        await again.stop()


async def test_runs_after_the_first_cost_no_channel_layer_call(monkeypatch):
    layer = get_channel_layer()
    counting = _Counting(layer, monkeypatch)
    bells = [RunDoorbell(f"run-{i}") for i in range(20)]
    await bells[0].start()
    assert counting.calls == ["new_channel", "group_add"]  # the process joins once
    for bell in bells[1:]:
        await bell.start()
    await ring("run-3", "cancel")  # through the switchboard's one group membership
    assert await bells[3].wait("cancel", 5)
    for bell in bells:
        await bell.stop()
    assert counting.calls == ["new_channel", "group_add"]
    if hasattr(layer, "groups"):  # the in-memory layer shows its groups
        assert SWITCHBOARD_GROUP in layer.groups


async def test_a_timeline_reader_listens_on_the_runs_events_group():
    reader = RunDoorbell("run-d", events=True)
    await reader.start()
    try:
        await ring("run-d", "cancel")  # not for readers
        await ring("run-d", "events")
        assert await reader.wait("events", 5)
        assert not await reader.wait("cancel", 0.2)
    finally:
        await reader.stop()


async def test_without_a_listening_layer_a_run_relies_on_rechecks(monkeypatch):
    layer = get_channel_layer()

    async def refuse(*args, **kwargs):
        raise ConnectionError("the channel layer is down")

    monkeypatch.setattr(layer, "group_add", refuse)
    bell = RunDoorbell("run-e")
    await bell.start()  # logged, not raised
    await ring("run-e", "cancel")
    assert not await bell.wait("cancel", 0.2)
    monkeypatch.undo()
    later = RunDoorbell("run-f")
    await later.start()  # the next run tries again, and the switchboard listens now
    try:
        await asyncio.sleep(0)
        await ring("run-f", "cancel")
        assert await later.wait("cancel", 5)
    finally:
        await later.stop()
        await bell.stop()


async def test_attach_now_once_the_switchboard_listens_and_callbacks_run_on_every_ring():
    first = RunDoorbell("run-g")
    await first.start()  # the process's switchboard joins (here, or by an earlier test)
    bell = RunDoorbell("run-h")
    rung: list[str] = []
    bell.on("cancel", lambda: rung.append("cancel"))
    assert bell.attach_now()  # no await: the switchboard is listening
    try:
        for expected in (1, 2):
            await ring("run-h", "cancel")
            assert await bell.wait("cancel", 5)
            assert rung == ["cancel"] * expected
        await ring("run-h", "confirmation", key="c1")  # another kind: not this callback
        assert await bell.wait("confirmation:c1", 5)
        assert rung == ["cancel", "cancel"]
    finally:
        await bell.stop()
        await first.stop()
    await ring("run-h", "cancel")  # stopped: nothing more arrives
    await asyncio.sleep(0.1)
    assert rung == ["cancel", "cancel"]


async def test_attach_now_refuses_before_the_switchboard_listens(monkeypatch):
    from core import doorbell

    monkeypatch.setattr(doorbell, "_SWITCHBOARDS", type(doorbell._SWITCHBOARDS)())  # a fresh process
    bell = RunDoorbell("run-i")
    assert not bell.attach_now()
    assert not RunDoorbell("run-j", events=True).attach_now()  # timeline readers always start()
    await bell.start()
    try:
        assert RunDoorbell("run-k").attach_now()
    finally:
        await bell.stop()


async def test_a_failing_callback_is_logged_and_the_switchboard_keeps_delivering(caplog):
    first = RunDoorbell("run-l")
    await first.start()
    bell = RunDoorbell("run-m")

    def broken():
        raise RuntimeError("listener bug")

    bell.on("cancel", broken)
    assert bell.attach_now()
    try:
        await ring("run-m", "cancel")
        assert await bell.wait("cancel", 5)  # the event is set despite the failing callback
        await ring("run-l", "cancel")
        assert await first.wait("cancel", 5)  # and the switchboard still delivers
    finally:
        await bell.stop()
        await first.stop()
    assert "listener bug" in caplog.text


async def test_a_readers_stop_does_not_wait_for_the_layer_to_finish_a_cancelled_receive(monkeypatch):
    # channels-redis can take seconds to finish a cancelled receive; a reader's stream ends its
    # response without waiting for that (on Redis, awaiting it hung the stream), and the listener
    # is kept until it ends on its own.
    from core import scheduling

    layer = get_channel_layer()
    cancelled, finish = asyncio.Event(), asyncio.Event()

    async def slow_to_cancel(channel):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await finish.wait()  # the layer's clean-up, still running after the cancel
            raise

    monkeypatch.setattr(layer, "receive", slow_to_cancel)
    reader = RunDoorbell("run-g", events=True)
    await reader.start()
    listener = reader._task
    await asyncio.sleep(0)  # the listener is inside receive
    await asyncio.wait_for(reader.stop(), 1)
    await asyncio.wait_for(cancelled.wait(), 1)
    assert not listener.done() and listener in scheduling._DETACHED
    finish.set()
    await asyncio.wait_for(asyncio.wait({listener}), 1)
    assert listener.cancelled() and listener not in scheduling._DETACHED
