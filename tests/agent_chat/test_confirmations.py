"""CHAT-050: tool confirmation signals, the REST decisions, expiry, conflicts and isolation."""
from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from chat_app.models import Message
from tests.agent_chat.conftest import WRITE_TOOL, events_of, tool_states
from tools_app.models import ToolConfirmation

pytestmark = pytest.mark.django_db(transaction=True)


def _awaiting(frame) -> bool:
    return frame.event == "tool.state" and frame.payload["status"] == "awaiting_input"


async def _start_waiting_run(chat, text: str = WRITE_TOOL):
    reader = await chat.chat({"input": text, "agentRole": "coder"})
    awaiting = await reader.until(_awaiting)
    return reader, awaiting.payload


async def test_chat050_tool_requires_confirmation(chat, agents):
    reader, awaiting = await _start_waiting_run(chat)
    assert awaiting["name"] == "write_file"
    assert awaiting["input"] == {"path": "notes.txt", "content": "hello from the tool"}
    assert awaiting["confirmationId"] and awaiting["toolCallId"]
    assert tool_states(reader.frames) == ["pending", "awaiting_input"]

    status, pending = await chat.json("GET", "/v1/tool-confirmations?status=pending")
    assert status == 200
    assert [c["id"] for c in pending] == [awaiting["confirmationId"]]
    item = pending[0]
    assert item["runId"] == reader.response["X-Run-Id"]
    assert item["conversationId"] == reader.response["X-Conversation-Id"]
    assert (item["tool"], item["toolCallId"], item["status"]) == ("write_file", awaiting["toolCallId"], "pending")
    assert item["input"] == awaiting["input"] and item["expiresAt"]

    status, decided = await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve")
    assert status == 200 and decided["status"] == "approved" and decided["decidedBy"] == "alice"
    frames = events_of(await reader.rest())
    assert tool_states(frames) == ["pending", "awaiting_input", "running", "succeeded"]
    done = [f.payload for f in frames if f.event == "tool.state"][-1]
    assert done["confirmationId"] == awaiting["confirmationId"] and "notes.txt" in done["output"]
    assert (agents["coder"].workspace_path / "notes.txt").read_text() == "hello from the tool"
    assert frames[-1].payload["status"] == "succeeded"
    status, pending = await chat.json("GET", "/v1/tool-confirmations?status=pending")
    assert pending == []
    status, approved = await chat.json("GET", "/v1/tool-confirmations?status=approved")
    assert [c["id"] for c in approved] == [awaiting["confirmationId"]] and approved[0]["output"]


async def test_chat050_tool_state_progresses_to_failed_with_error_after_confirmation(chat):
    # write_file outside the workspace is refused by the tool: approved, run, failed with an error.
    reader, awaiting = await _start_waiting_run(chat, '/tool write_file {"path": "../escape.txt", "content": "x"}')
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve")
    frames = events_of(await reader.rest())
    assert tool_states(frames) == ["pending", "awaiting_input", "running", "failed"]
    failed = [f.payload for f in frames if f.event == "tool.state"][-1]
    assert failed["error"] and "output" not in failed
    assert frames[-1].payload["status"] == "succeeded"  # a tool failure does not end the run


async def test_chat050_deny_path_tells_the_model_and_run_continues(chat, agents):
    reader, awaiting = await _start_waiting_run(chat)
    status, decided = await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/deny",
                                      {"reason": "not today"})
    assert status == 200 and decided["status"] == "denied" and decided["reason"] == "not today"
    frames = events_of(await reader.rest())
    assert tool_states(frames) == ["pending", "awaiting_input", "denied"]
    final = next(f.payload["content"] for f in frames if f.event == "agent.message")
    assert "denied" in final  # the model was told
    assert frames[-1].payload["status"] == "succeeded"
    assert not (agents["coder"].workspace_path / "notes.txt").exists()
    tool_message = await Message.objects.aget(run_id=reader.response["X-Run-Id"], role="tool")
    assert tool_message.metadata["status"] == "denied"


async def test_chat050_second_decision_gets_409(chat):
    reader, awaiting = await _start_waiting_run(chat)
    confirmation_id = awaiting["confirmationId"]
    status, _ = await chat.json("POST", f"/v1/tool-confirmations/{confirmation_id}/deny")
    assert status == 200
    for action in ("approve", "deny"):
        status, body = await chat.json("POST", f"/v1/tool-confirmations/{confirmation_id}/{action}")
        assert status == 409 and body["code"] == "confirmation_already_decided" and body["status"] == "denied"
    await reader.rest()


async def test_chat050_other_users_confirmation_is_404(chat, other_chat):
    reader, awaiting = await _start_waiting_run(chat)
    for action in ("approve", "deny"):
        status, body = await other_chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/{action}")
        assert status == 404 and body["code"] == "confirmation_not_found"
    status, listed = await other_chat.json("GET", "/v1/tool-confirmations?status=pending")
    assert status == 200 and listed == []
    status, listed = await other_chat.json("GET", "/v1/tool-confirmations")
    assert listed == []
    # Still pending for its owner: the other user's attempts changed nothing.
    status, pending = await chat.json("GET", "/v1/tool-confirmations?status=pending")
    assert [c["id"] for c in pending] == [awaiting["confirmationId"]]
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/deny")
    await reader.rest()


@pytest.mark.parametrize("confirmation_id", [str(uuid.uuid4()), "not-a-uuid"])
async def test_chat050_unknown_confirmation_is_404(chat, confirmation_id):
    status, body = await chat.json("POST", f"/v1/tool-confirmations/{confirmation_id}/approve")
    assert status == 404 and body["code"] == "confirmation_not_found"


async def test_chat050_list_rejects_unknown_status(chat):
    status, body = await chat.json("GET", "/v1/tool-confirmations?status=maybe")
    assert status == 400 and body["code"] == "invalid_status"


async def test_chat050_decision_body_must_be_valid(chat):
    reader, awaiting = await _start_waiting_run(chat)
    status, body = await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve",
                                   {"reason": 42})
    assert status == 400 and body["code"] == "invalid_input"
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/deny")
    await reader.rest()


async def test_chat050_confirmation_expires_and_tool_is_not_run(chat, settings, agents):
    settings.CONFIRMATION_TIMEOUT = 0.4
    settings.CONFIRMATION_RECHECK_INTERVAL = 0.05
    reader, awaiting = await _start_waiting_run(chat)
    frames = events_of(await reader.rest())
    assert tool_states(frames) == ["pending", "awaiting_input", "failed"]
    failed = [f.payload for f in frames if f.event == "tool.state"][-1]
    assert failed["error"] == "confirmation expired" and failed["confirmationId"] == awaiting["confirmationId"]
    assert frames[-1].payload["status"] == "succeeded"
    assert not (agents["coder"].workspace_path / "notes.txt").exists()
    confirmation = await ToolConfirmation.objects.aget(id=awaiting["confirmationId"])
    assert confirmation.status == "expired"
    status, body = await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve")
    assert status == 409 and body["status"] == "expired"
    status, pending = await chat.json("GET", "/v1/tool-confirmations?status=pending")
    assert pending == []


async def test_chat050_pending_list_leaves_out_confirmations_of_ended_runs(chat):
    reader, awaiting = await _start_waiting_run(chat)
    await chat.json("POST", f"/v1/agent/runs/{reader.response['X-Run-Id']}/cancel")
    await reader.rest()
    status, pending = await chat.json("GET", "/v1/tool-confirmations?status=pending")
    assert pending == []
    # The row itself is closed too, so nothing can approve a call whose run is gone.
    confirmation = await ToolConfirmation.objects.aget(id=awaiting["confirmationId"])
    assert confirmation.status == "expired" and confirmation.reason == "run cancelled"
    status, body = await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve")
    assert status == 409


# --- approvals cannot outlive their run -----------------------------------------------------------

async def test_confirmation_past_expires_at_is_409_expired(chat):
    from datetime import timedelta

    from django.utils import timezone

    reader, awaiting = await _start_waiting_run(chat)
    cid = awaiting["confirmationId"]
    await ToolConfirmation.objects.filter(id=cid).aupdate(expires_at=timezone.now() - timedelta(seconds=1))
    for action in ("approve", "deny"):
        status, body = await chat.json("POST", f"/v1/tool-confirmations/{cid}/{action}")
        assert status == 409 and body["code"] == "confirmation_expired" and body["message"], body
    row = await ToolConfirmation.objects.aget(id=cid)
    assert row.status == "expired" and row.decided_by_id is None
    await chat.json("POST", f"/v1/agent/runs/{reader.response['X-Run-Id']}/cancel")


async def test_confirmation_of_a_run_whose_server_stopped_is_409_expired(chat, user):
    """A run left 'running' by a process that died (its lease ran out) cannot be approved."""
    from datetime import timedelta

    from django.utils import timezone

    from chat_app.models import Conversation, Run

    conversation = await Conversation.objects.acreate(owner=user, title="ghost")
    run = await Run.objects.acreate(conversation=conversation, engine="mock", status="running",
                                    lease_expires_at=timezone.now() - timedelta(seconds=5))
    ghost = await ToolConfirmation.objects.acreate(run=run, tool_call_id="t1", tool="bash", input={"command": "ls"},
                                                   expires_at=timezone.now() + timedelta(minutes=5))
    status, listed = await chat.json("GET", "/v1/tool-confirmations?status=pending")
    status, body = await chat.json("POST", f"/v1/tool-confirmations/{ghost.id}/approve")
    assert status == 409 and body["code"] == "confirmation_expired"
    assert (await ToolConfirmation.objects.aget(id=ghost.id)).status == "expired"


async def test_run_reap_orphans_ends_ghost_runs_and_expires_their_confirmations(user):
    from datetime import timedelta

    from django.utils import timezone

    from chat_app import services
    from chat_app.models import Conversation, Run, RunEvent

    conversation = await Conversation.objects.acreate(owner=user, title="ghost")
    ghost = await Run.objects.acreate(conversation=conversation, engine="mock", status="running",
                                      lease_expires_at=timezone.now() - timedelta(seconds=5))
    alive = await Run.objects.acreate(conversation=conversation, engine="mock", status="running",
                                      lease_expires_at=timezone.now() + timedelta(seconds=30))
    await RunEvent.objects.acreate(run=ghost, seq=1, event="agent.start", at=timezone.now(), payload={})
    pending = await ToolConfirmation.objects.acreate(run=ghost, tool_call_id="t1", tool="bash", input={})

    assert await services.run_reap_orphans() == 1
    ghost = await Run.objects.aget(id=ghost.id)
    assert ghost.status == "failed" and ghost.ended_at is not None and "stopped" in ghost.error
    assert (await Run.objects.aget(id=alive.id)).status == "running"
    assert (await ToolConfirmation.objects.aget(id=pending.id)).status == "expired"
    # A reader of the timeline (or a reconnecting stream) sees it end, with a stable code.
    events = [e async for e in services.run_subscribe(run_id=str(ghost.id))]
    assert [e.event for e in events] == ["agent.start", "error", "agent.end"]
    assert events[1].payload["code"] == "run_lost" and events[2].payload["status"] == "failed"
    assert await services.run_reap_orphans() == 0  # idempotent


async def _until(condition, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_cancel_while_awaiting_input_is_recorded_expires_the_confirmation(user, agents, monkeypatch, settings):
    """awaiting_input reaches subscribers before its commit: a cancel in that moment (the run is
    still recording the event) must expire the confirmation too, not leave it pending."""
    from chat_app import services
    from chat_app.executor import get_executor
    from chat_app.group_commit import WRITER
    from tools_app import runner

    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        # SQLite has one writer at a time: the cancel's own update waits behind the held writer,
        # so the cancel cannot arrive while awaiting_input is being recorded.
        pytest.skip("needs a database with concurrent writers (PostgreSQL)")
    gate = threading.Event()
    held: list = []
    create = runner._confirmation_create

    async def create_then_hold_the_writer(**kwargs):
        row = await create(**kwargs)
        held.append(WRITER.write(lambda: gate.wait(20)))  # awaiting_input's commit waits behind this
        return row

    monkeypatch.setattr(runner, "_confirmation_create", create_then_hold_the_writer)
    created = await services.run_start(user=user, input=WRITE_TOOL, agent_role="coder")
    run_id = str(created.run.id)
    try:
        async for event in services.run_subscribe(run_id=run_id):
            if event.event == "tool.state" and event.payload["status"] == "awaiting_input":
                confirmation_id = event.payload["confirmationId"]
                break
        live = get_executor().live[run_id]
        cancel = asyncio.ensure_future(services.run_cancel(user=user, run_id=run_id))
        await _until(lambda: live.task.cancelling() > 0 or live.task.done())
    finally:
        gate.set()
    await held[0]
    await asyncio.wait_for(cancel, 15)
    events = [e async for e in services.run_subscribe(run_id=run_id)]
    assert events[-1].event == "agent.end" and events[-1].payload["status"] == "cancelled"
    confirmation = await ToolConfirmation.objects.aget(id=confirmation_id)
    assert confirmation.status == "expired" and confirmation.reason == "run cancelled"
