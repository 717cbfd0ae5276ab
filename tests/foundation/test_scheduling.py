"""core.scheduling: a woken reader runs ahead of work that was ready before it (wake_first, yield_to_readers)."""
from __future__ import annotations

import asyncio

import pytest

from core.scheduling import wake_first, yield_to_readers


async def _order(wake) -> list[str]:
    """A reader waits on an event; a producer step queues other work, then wakes the reader."""
    order: list[str] = []
    event = asyncio.Event()

    async def reader() -> None:
        await event.wait()
        order.append("reader")

    def producer() -> None:
        loop = asyncio.get_running_loop()
        for name in ("other-1", "other-2"):
            loop.call_soon(order.append, name)
        wake(event)
        loop.call_soon(order.append, "after")

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)  # the reader is waiting
    asyncio.get_running_loop().call_soon(producer)
    await asyncio.wait_for(task, 5)
    await asyncio.sleep(0)
    return order


async def test_the_woken_reader_runs_before_work_queued_ahead_of_it():
    assert await _order(wake_first) == ["reader", "other-1", "other-2", "after"]


async def test_a_plain_set_is_first_in_first_out():
    # What wake_first changes: the same steps with Event.set keep the queue's order.
    assert await _order(asyncio.Event.set) == ["other-1", "other-2", "reader", "after"]


async def test_several_woken_readers_keep_their_order():
    order: list[str] = []
    shared = asyncio.Event()

    async def reader(name: str) -> None:
        await shared.wait()
        order.append(name)

    tasks = [asyncio.create_task(reader(f"r{i}")) for i in range(3)]
    await asyncio.sleep(0)

    def producer() -> None:
        asyncio.get_running_loop().call_soon(order.append, "other")
        wake_first(shared)

    asyncio.get_running_loop().call_soon(producer)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    await asyncio.sleep(0)
    assert order == ["r0", "r1", "r2", "other"]


async def test_off_switch_restores_first_in_first_out(settings):
    settings.LOOP_OUTPUT_FIRST = False
    assert await _order(wake_first) == ["other-1", "other-2", "reader", "after"]


def test_without_a_running_loop_it_is_a_plain_set():
    event = asyncio.Event()
    wake_first(event)
    assert event.is_set()


@pytest.mark.parametrize("readers", [0, 1])
async def test_an_event_nobody_waits_for_is_set(readers):
    event = asyncio.Event()
    waiting = [asyncio.create_task(event.wait()) for _ in range(readers)]
    await asyncio.sleep(0)
    wake_first(event)
    assert event.is_set()
    await asyncio.wait_for(asyncio.gather(*waiting), 5)


async def _publish_then_go_on(settings, on: bool) -> list[str]:
    """A run publishes its first output (waking its stream), yields to readers, then reads on."""
    settings.LOOP_OUTPUT_FIRST = on
    order: list[str] = []
    output = asyncio.Event()

    async def stream() -> None:
        await output.wait()
        order.append("stream writes the first text")

    async def run() -> None:
        await asyncio.sleep(0)  # the stream is waiting
        wake_first(output)
        await yield_to_readers()
        order.append("run reads its next event")

    await asyncio.wait_for(asyncio.gather(stream(), run()), 5)
    return order


async def test_yield_to_readers_lets_the_woken_stream_write_before_the_run_reads_on(settings):
    assert await _publish_then_go_on(settings, True) == ["stream writes the first text", "run reads its next event"]


async def test_yield_to_readers_is_a_no_op_when_output_first_is_off(settings):
    assert await _publish_then_go_on(settings, False) == ["run reads its next event", "stream writes the first text"]
