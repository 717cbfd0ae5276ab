"""The run service on the mock engine: events in order, seq gapless, messages persisted."""
from __future__ import annotations

import asyncio
import logging

import pytest
from asgiref.sync import sync_to_async

from chat_app import services
from chat_app.models import Message, Run, RunEvent

pytestmark = pytest.mark.django_db(transaction=True)


async def _collect(run_id: str) -> list:
    return [e async for e in services.run_subscribe(run_id=run_id)]


async def test_run_start_mock_streams_events_in_order(user):
    created = await services.run_start(user=user, input="hello there friend", agent_role="coder")
    events = await _collect(str(created.run.id))
    names = [e.event for e in events]
    assert names[0] == "agent.start"
    assert names[-1] == "agent.end"
    assert names.count("agent.delta") >= 2
    assert names.index("agent.message") < names.index("agent.end")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    text = "".join(e.payload["text"] for e in events if e.event == "agent.delta")
    assert text == "Mock reply from coder: hello there friend"
    assert events[-1].payload["status"] == "succeeded"


async def test_run_start_records_gapless_seq_in_database(user):
    created = await services.run_start(user=user, input="one two three four five six seven", agent_role="coder")
    events = await _collect(str(created.run.id))
    rows = await sync_to_async(list)(RunEvent.objects.filter(run=created.run).order_by("seq").values_list("seq", "event"))
    assert [r[0] for r in rows] == list(range(1, len(events) + 1))
    assert [r[1] for r in rows] == [e.event for e in events]


async def test_run_start_persists_user_then_assistant_message(user):
    created = await services.run_start(user=user, input="persist me", agent_role="coder")
    user_msgs = await sync_to_async(list)(Message.objects.filter(conversation=created.conversation, role="user"))
    assert [m.content for m in user_msgs] == ["persist me"]
    await _collect(str(created.run.id))
    msgs = await sync_to_async(list)(Message.objects.filter(conversation=created.conversation).order_by("created_at"))
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == "Mock reply from coder: persist me"
    run = await Run.objects.aget(id=created.run.id)
    assert run.status == "succeeded" and run.ended_at is not None


async def test_run_start_failure_ends_failed_with_readable_error(user):
    created = await services.run_start(user=user, input="/fail the model is down", agent_role="coder")
    events = await _collect(str(created.run.id))
    assert events[-2].event == "error"
    assert events[-1].payload["status"] == "failed"
    assert "the model is down" in events[-1].payload["error"]
    assert not await Message.objects.filter(conversation=created.conversation, role="assistant").aexists()


async def test_run_start_second_turn_gets_history(user):
    first = await services.run_start(user=user, input="remember apples", agent_role="coder")
    await _collect(str(first.run.id))
    second = await services.run_start(user=user, input="/recall", agent_role="coder",
                                      conversation_id=str(first.conversation.id))
    events = await _collect(str(second.run.id))
    final = events[-1].payload["text"]
    assert "user: remember apples" in final and "assistant: Mock reply from coder: remember apples" in final


async def test_run_start_claude_without_key_falls_back_to_mock_with_warning(user, caplog):
    caplog.set_level(logging.WARNING, logger="orchestrator.router")
    created = await services.run_start(user=user, input="hi", agent_role="dev_efficiency_analyst")
    events = await _collect(str(created.run.id))
    assert created.run.engine == "mock"
    assert "claude unavailable" in events[0].payload["routeNote"]
    assert any("fall back to the mock engine" in r.getMessage() for r in caplog.records)
    # Warned once per process, not once per run.
    caplog.clear()
    again = await services.run_start(user=user, input="hi again", agent_role="dev_efficiency_analyst")
    await _collect(str(again.run.id))
    assert not any("fall back" in r.getMessage() for r in caplog.records)


async def test_run_subscribe_after_seq_replays_without_gap_or_duplicate(user):
    created = await services.run_start(user=user, input="a b c d e f g h i j k l", agent_role="coder")
    every = await _collect(str(created.run.id))
    tail = [e async for e in services.run_subscribe(run_id=str(created.run.id), after_seq=3)]
    assert [e.seq for e in tail] == [e.seq for e in every[3:]]


async def test_run_cancel_ends_cancelled_without_assistant_message(user):
    created = await services.run_start(user=user, input="/sleep 30\nslow", agent_role="coder")
    run = await services.run_cancel(user=user, run_id=str(created.run.id))
    assert run.status == "cancelled"
    events = await _collect(str(created.run.id))
    assert events[-1].payload["status"] == "cancelled"
    assert not await Message.objects.filter(conversation=created.conversation, role="assistant").aexists()


async def test_run_tool_result_is_a_context_patch_and_a_tool_message(user, agents):
    workspace = agents["coder"].workspace_path
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "facts.txt").write_text("the sky is blue")
    created = await services.run_start(user=user, input='/tool read_file {"path": "facts.txt"}\nwhat colour?',
                                       agent_role="coder")
    events = await _collect(str(created.run.id))
    names = [e.event for e in events]
    states = [e.payload["status"] for e in events if e.event == "tool.state"]
    assert states == ["pending", "running", "succeeded"]  # read_file needs no approval
    patch = next(e for e in events if e.event == "context.patch")
    assert names.index("context.patch") > max(i for i, n in enumerate(names) if n == "tool.state")
    assert patch.payload == {"kind": "tool_result", "data": {
        "toolCallId": events[names.index("tool.state")].payload["toolCallId"], "name": "read_file",
        "status": "succeeded", "isError": False, "output": "the sky is blue"}}
    tool_message = await Message.objects.aget(conversation=created.conversation, role="tool")
    assert tool_message.content == "the sky is blue" and tool_message.metadata["name"] == "read_file"


async def test_run_cancel_before_the_task_starts_still_records_the_end(user):
    from chat_app.executor import get_executor

    created = await sync_to_async(services.run_create)(user=user, input="never answered", agent_role="coder")
    get_executor().submit(created.launch)
    # No await between launch and cancel: the run's task has not begun executing yet.
    assert await get_executor().cancel(str(created.run.id))
    events = await _collect(str(created.run.id))
    assert events[-1].event == "agent.end" and events[-1].payload["status"] == "cancelled"
    run = await Run.objects.aget(id=created.run.id)
    assert run.status == "cancelled" and run.ended_at is not None


async def test_run_cancel_while_finishing_cannot_overwrite_the_answer(user, monkeypatch):
    """A cancel that lands after the engine returned is refused (409): one final status, written once."""
    import asyncio

    from core.errors import Conflict
    from tests.conftest import wait_for

    from chat_app.eventlog import LiveRun

    reached, release = asyncio.Event(), asyncio.Event()
    original = LiveRun.finish

    async def slow_finish(self, final, commit):  # the engine has returned; the end is being recorded
        reached.set()
        await release.wait()
        return await original(self, final, commit)

    monkeypatch.setattr(LiveRun, "finish", slow_finish)
    created = await services.run_start(user=user, input="finish me", agent_role="coder")
    run_id = str(created.run.id)
    await asyncio.wait_for(reached.wait(), 10)
    cancel = asyncio.create_task(services.run_cancel(user=user, run_id=run_id))
    await wait_for(lambda: Run.objects.filter(id=run_id, cancel_requested=True).aexists())
    release.set()
    with pytest.raises(Conflict) as refused:
        await asyncio.wait_for(cancel, 15)
    assert refused.value.code == "run_not_active" and refused.value.extra["status"] == "succeeded"
    events = await _collect(run_id)
    assert [e.payload["status"] for e in events if e.event == "agent.end"] == ["succeeded"]
    run = await Run.objects.aget(id=run_id)
    assert run.status == "succeeded"
    assert await Message.objects.filter(run_id=run_id, role="assistant").acount() == 1


async def test_a_finished_run_lingers_without_its_task_or_start_rows(user):
    """The linger keeps what late readers need (events, status), not the run's launch, task or
    start-row models: those would stay alive for the whole linger in the collector's oldest
    generation."""
    import gc
    import weakref

    from chat_app.executor import get_executor

    created = await sync_to_async(services.run_create)(user=user, input="linger lightly", agent_role="coder",
                                                        defer_commit=True)
    assert created.launch.record is not None  # the start rows go to the writer with the run
    launch_ref, row_ref = weakref.ref(created.launch), weakref.ref(created.launch.record.run)
    run_id = str(created.run.id)
    get_executor().submit(created.launch)
    del created
    events = await _collect(run_id)
    assert events[-1].event == "agent.end" and events[-1].payload["status"] == "succeeded"
    live = get_executor().live[run_id]  # still lingering: a late reader gets the whole run
    assert live.done and live.task is None and live.recorded is None
    assert [e.seq for e in events] == [e.seq for e in [e async for e in services.run_subscribe(run_id=run_id)]]
    # The writer thread lets go of its last batch just after resolving it: wait for that, bounded.
    deadline = asyncio.get_running_loop().time() + 5
    while (launch_ref() is not None or row_ref() is not None) and asyncio.get_running_loop().time() < deadline:
        gc.collect()
        await asyncio.sleep(0.01)
    assert launch_ref() is None and row_ref() is None


async def test_a_cancel_rung_from_another_process_cancels_the_run(user):
    """What another server does (tests/agent_chat/test_two_servers.py across two processes):
    set the flag, then ring; the executing run reads the flag and ends cancelled. A ring
    without the flag set cancels nothing (the database is the truth)."""
    from core.doorbell import ring
    from tests.conftest import wait_for

    from chat_app.executor import get_executor

    created = await services.run_start(user=user, input="/sleep 30\nslow", agent_role="coder")
    run_id = str(created.run.id)
    await wait_for(lambda: Run.objects.filter(id=run_id).aexists())
    await ring(run_id, "cancel")  # the flag is not set: the run goes on
    await asyncio.sleep(0.3)
    assert get_executor().is_live(run_id) and not get_executor().live[run_id].done
    await Run.objects.filter(id=run_id).aupdate(cancel_requested=True)
    await ring(run_id, "cancel")
    events = await asyncio.wait_for(_collect(run_id), 15)
    assert events[-1].event == "agent.end" and events[-1].payload["status"] == "cancelled"
    assert (await Run.objects.aget(id=run_id)).status == "cancelled"
