"""CHAT-030 / 040 / 060 / 080 on the seed-001 dialect: order, persistence, pings, reconnect, cancel, timeline."""
from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from chat_app.executor import get_executor
from chat_app.models import Conversation, Message, Run
from tests.agent_chat.conftest import WRITE_TOOL, events_of, merged_run_events, parse_sse, run_events_of, tool_states
from tests.conftest import wait_for
from tools_app.models import ToolRule

pytestmark = pytest.mark.django_db(transaction=True)


def _names(frames) -> list[str]:
    return [f.event for f in events_of(frames)]


def _collapse(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        if not (out and out[-1] == name == "agent.delta"):
            out.append(name)
    return out


# --- CHAT-030: the stream ------------------------------------------------------------------------

async def test_chat030_successful_run_streams_start_delta_message_end(chat):
    reader = await chat.chat({"input": "/drip 3 0.05\nhello there my good friend", "agentRole": "coder"})
    response = reader.response
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"].startswith("no-cache")
    frames = await reader.rest()
    names = _names(frames)
    assert _collapse(names) == ["conversation.created", "agent.start", "agent.delta", "agent.message", "agent.end"]
    assert names.count("agent.delta") >= 2

    created, *logged = events_of(frames)
    # conversation.created is not in the run's log: id 0, so a resume from it replays everything.
    assert created.id == "0" and created.payload == {"conversationId": response["X-Conversation-Id"]}
    # Every logged message: `id: <seq>` and data {"event", "data", "id"}, seq 1..n without gaps.
    assert [int(f.id) for f in logged] == list(range(1, len(logged) + 1))
    for frame in logged:
        assert set(frame.json) == {"event", "data", "id"} and frame.json["id"] == int(frame.id)

    start = logged[0].payload
    assert start["runId"] == response["X-Run-Id"]
    assert start["conversationId"] == response["X-Conversation-Id"]
    assert (start["agentRole"], start["engine"], start["model"]) == ("coder", "mock", "mock-1")
    text = "".join(f.payload["text"] for f in logged if f.event == "agent.delta")
    message = next(f.payload for f in logged if f.event == "agent.message")
    assert message["role"] == "assistant" and message["content"] == text == "Mock reply from coder: hello there my good friend"
    end = logged[-1].payload
    assert end["status"] == "succeeded" and end["messageId"] == message["messageId"]
    assert end["usage"]["output_tokens"] > 0


async def test_chat030_raw_wire_format(chat):
    reader = await chat.chat({"input": "wire", "agentRole": "coder"})
    await reader.rest()
    blocks = reader.raw.split("\n\n")
    assert blocks[0].startswith("id: 0\ndata: {\"event\":\"conversation.created\"")
    assert blocks[1].startswith("id: 1\ndata: {\"event\":\"agent.start\",\"data\":{")
    assert reader.raw.endswith("\n\n")


async def test_chat030_failure_ends_with_failed_status_and_readable_error(chat):
    reader = await chat.chat({"input": "/fail the model provider is down", "agentRole": "coder"})
    frames = events_of(await reader.rest())
    assert _collapse(_names(frames)) == ["conversation.created", "agent.start", "error", "agent.end"]
    error = frames[-2].payload
    assert error["code"] == "mock_failure" and "the model provider is down" in error["message"]
    end = frames[-1].payload
    assert end["status"] == "failed" and "the model provider is down" in end["error"]
    assert "coder" in end["error"]  # the message says which agent/engine failed


async def test_chat030_existing_conversation_is_not_announced(chat, user):
    conversation = await Conversation.objects.acreate(owner=user, title="existing")
    reader = await chat.chat({"conversationId": str(conversation.id), "input": "again", "agentRole": "coder"})
    frames = events_of(await reader.rest())
    assert frames[0].event == "agent.start"
    assert frames[0].payload["conversationId"] == str(conversation.id)
    assert reader.response["X-Conversation-Id"] == str(conversation.id)


async def test_chat030_default_agent_is_conversations_agent_then_configured_default(chat, user, agents, settings):
    conversation = await Conversation.objects.acreate(owner=user, agent=agents["researcher"])
    frames = events_of(await (await chat.chat({"conversationId": str(conversation.id), "input": "hi"})).rest())
    assert frames[0].payload["agentRole"] == "researcher"
    frames = events_of(await (await chat.chat({"input": "hi"})).rest())
    assert frames[1].payload["agentRole"] == settings.DEFAULT_AGENT_ROLE


async def test_chat030_accepts_event_stream_accept_header(chat):
    reader = await chat.chat({"input": "hi", "agentRole": "coder"}, Accept="text/event-stream")
    assert _names(await reader.rest())[-1] == "agent.end"


@pytest.mark.parametrize("body, status, code", [
    ({}, 400, "invalid_input"),
    ({"input": 5}, 400, "invalid_input"),
    ({"input": ""}, 400, "invalid_input"),
    ({"input": "   "}, 400, "invalid_input"),
    ({"input": None}, 400, "invalid_input"),
    ({"input": ["a"]}, 400, "invalid_input"),
    ({"input": "hi", "agentRole": 3}, 400, "invalid_input"),
    ({"input": "hi", "conversationId": {"x": 1}}, 400, "invalid_input"),
    ({"input": "hi", "engine": True}, 400, "invalid_input"),
    (["input", "hi"], 400, "invalid_input"),
    ("just text", 400, "invalid_input"),
    ({"input": "hi", "conversationId": "00000000-0000-0000-0000-000000000000"}, 404, "conversation_not_found"),
    ({"input": "hi", "conversationId": "nope"}, 404, "conversation_not_found"),
    ({"input": "hi", "engine": "warp-drive"}, 400, "unknown_engine"),
    ({"input": "hi", "agentRole": "nobody"}, 404, "agent_not_found"),
])
async def test_chat030_bad_request_is_json_error_before_stream(chat, body, status, code):
    response = await chat.post_json("/v1/agent/chat", body)
    assert response.status_code == status
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["code"] == code
    assert response.json()["message"]
    assert not await Run.objects.aexists()


async def test_chat030_malformed_json_unknown_format_and_no_auth(chat):
    response = await chat.post_json("/v1/agent/chat", b"{not json")
    assert response.status_code == 400 and response.json()["code"] == "malformed_json"
    response = await chat.post_json("/v1/agent/chat?format=carrier-pigeon", {"input": "hi"})
    assert response.status_code == 400 and response.json()["code"] == "unknown_format"
    response = await chat.client.request("POST", "/v1/agent/chat", body=b'{"input": "hi"}',
                                         headers={"Content-Type": "application/json"})
    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"


async def test_chat030_other_users_conversation_is_404(chat, other_chat, user):
    conversation = await Conversation.objects.acreate(owner=user)
    response = await other_chat.post_json("/v1/agent/chat", {"conversationId": str(conversation.id), "input": "hi"})
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"


# --- the run belongs to the server: disconnect, reconnect, cancel --------------------------------

async def test_chat030_client_disconnect_does_not_stop_the_run(chat):
    reader = await chat.chat({"input": "/sleep 0.3\nstill here", "agentRole": "coder"})
    await reader.until(lambda f: f.event == "agent.start")
    run_id = reader.response["X-Run-Id"]
    await reader.close()
    await wait_for(lambda: Run.objects.filter(id=run_id, status="succeeded").aexists(), timeout=10)
    assert await Message.objects.filter(run_id=run_id, role="assistant", content__contains="still here").aexists()


async def test_chat030_reconnect_with_last_event_id_has_no_gap_and_no_duplicate(chat, settings):
    settings.SSE_PING_INTERVAL = 0.05
    reader = await chat.chat({"input": f"{WRITE_TOOL}\nafter the tool", "agentRole": "coder"})
    run_id = reader.response["X-Run-Id"]
    await reader.until(lambda f: f.event == "agent.start")
    first_part = run_events_of(reader.frames)
    last_id = first_part[-1].id
    await reader.close()  # gone while the run goes on and then waits for a person

    from tools_app.models import ToolConfirmation

    confirmation = await wait_for(lambda: ToolConfirmation.objects.filter(run_id=run_id).afirst())
    again = await chat.events(run_id, **{"Last-Event-ID": last_id})
    awaiting = await again.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    assert awaiting.payload["confirmationId"] == str(confirmation.id)
    status, _ = await chat.json("POST", f"/v1/tool-confirmations/{confirmation.id}/approve")
    assert status == 200
    second_part = run_events_of(await again.rest())
    ids = [int(f.id) for f in first_part + second_part]
    assert ids == list(range(1, ids[-1] + 1)), ids
    assert second_part[-1].event == "agent.end" and second_part[-1].payload["status"] == "succeeded"
    assert again.response["X-Run-Id"] == run_id


async def test_chat030_reconnect_replays_from_the_database_after_the_run_left_memory(chat):
    reader = await chat.chat({"input": "one two three four", "agentRole": "coder"})
    streamed = run_events_of(await reader.rest())
    run_id = reader.response["X-Run-Id"]
    get_executor().live.pop(run_id, None)  # as if served by another process or after a restart
    expected = merged_run_events(streamed)
    for query, headers in [("", {"Last-Event-ID": "1"}), ("?after=1", {})]:
        replay = await chat.events(run_id, query=query, **headers)
        assert merged_run_events(await replay.rest()) == expected[1:]
    full = await chat.events(run_id)
    assert merged_run_events(await full.rest()) == expected


async def test_chat030_events_endpoint_errors(chat, other_chat):
    reader = await chat.chat({"input": "hi", "agentRole": "coder"})
    await reader.rest()
    run_id = reader.response["X-Run-Id"]
    response = await other_chat.get(f"/v1/agent/runs/{run_id}/events")
    assert response.status_code == 404 and response.json()["code"] == "run_not_found"
    response = await chat.get(f"/v1/agent/runs/{uuid.uuid4()}/events")
    assert response.status_code == 404 and response.json()["code"] == "run_not_found"
    last = (await chat.json("GET", f"/v1/agent/runs/{run_id}/timeline"))[1]["events"][-1]["seq"]
    done = await chat.get(f"/v1/agent/runs/{run_id}/events", **{"Last-Event-ID": str(last)})
    assert done.status_code == 204  # an ended run with nothing after: EventSource stops reconnecting
    for bad in ["abc", "-1"]:
        response = await chat.get(f"/v1/agent/runs/{run_id}/events", **{"Last-Event-ID": bad})
        assert response.status_code == 400 and response.json()["code"] == "invalid_last_event_id"


async def test_chat030_cancel_ends_run_cancelled(chat, other_chat):
    reader = await chat.chat({"input": "/sleep 30", "agentRole": "coder"})
    await reader.until(lambda f: f.event == "agent.start")
    run_id = reader.response["X-Run-Id"]
    status, body = await other_chat.json("POST", f"/v1/agent/runs/{run_id}/cancel")
    assert status == 404 and body["code"] == "run_not_found"
    status, body = await chat.json("POST", f"/v1/agent/runs/{run_id}/cancel")
    assert status == 200 and body == {"runId": run_id, "status": "cancelled"}
    frames = events_of(await reader.rest(timeout=5))
    end = frames[-1]
    assert end.event == "agent.end" and end.payload["status"] == "cancelled" and end.payload["error"]
    status, body = await chat.json("POST", f"/v1/agent/runs/{run_id}/cancel")
    assert status == 409 and body["code"] == "run_not_active"
    assert not await Message.objects.filter(run_id=run_id, role="assistant").aexists()


# --- CHAT-040: persistence -----------------------------------------------------------------------

async def test_chat040_user_message_visible_while_run_is_going(chat):
    reader = await chat.chat({"input": "/sleep 30\nkeep me", "agentRole": "coder"})
    await reader.until(lambda f: f.event == "agent.start")
    conversation_id = reader.response["X-Conversation-Id"]
    status, messages = await chat.json("GET", f"/v1/conversations/{conversation_id}/messages")
    assert status == 200
    assert [(m["role"], m["content"]) for m in messages] == [("user", "/sleep 30\nkeep me")]
    assert messages[0]["runId"] == reader.response["X-Run-Id"]
    await chat.json("POST", f"/v1/agent/runs/{reader.response['X-Run-Id']}/cancel")
    await reader.rest()


async def test_chat040_assistant_output_persisted_and_updated_at_moves(chat, user):
    conversation = await Conversation.objects.acreate(owner=user, title="t")
    before = conversation.updated_at
    reader = await chat.chat({"conversationId": str(conversation.id), "input": "persist this", "agentRole": "coder"})
    frames = events_of(await reader.rest())
    final = next(f.payload for f in frames if f.event == "agent.message")
    status, messages = await chat.json("GET", f"/v1/conversations/{conversation.id}/messages")
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "persist this"), ("assistant", "Mock reply from coder: persist this")]
    assert messages[1]["id"] == final["messageId"] and messages[1]["content"] == final["content"]
    status, listed = await chat.json("GET", "/v1/conversations")
    assert listed[0]["id"] == str(conversation.id) and listed[0]["updatedAt"] > before.isoformat().replace("+00:00", "Z")


async def test_chat040_tool_calls_are_stored_as_tool_messages(chat, user, agents):
    await ToolRule.objects.acreate(scope="agent", agent=agents["coder"], effect="allow", tool="write_file")
    reader = await chat.chat({"input": WRITE_TOOL, "agentRole": "coder"})
    frames = events_of(await reader.rest())
    assert tool_states(frames) == ["pending", "running", "succeeded"]
    status, messages = await chat.json("GET", f"/v1/conversations/{reader.response['X-Conversation-Id']}/messages")
    assert [m["role"] for m in messages] == ["user", "tool", "assistant"]
    tool = messages[1]
    assert tool["metadata"]["name"] == "write_file" and tool["metadata"]["status"] == "succeeded"
    assert tool["metadata"]["input"] == {"path": "notes.txt", "content": "hello from the tool"}
    assert tool["metadata"]["toolCallId"] == next(f.payload["toolCallId"] for f in frames if f.event == "tool.state")


# --- CHAT-060: pings -----------------------------------------------------------------------------

async def test_chat060_ping_while_model_is_slow(chat, settings):
    settings.SSE_PING_INTERVAL = 0.05
    # The stream is set up at the first output or after STREAM_OPENING_HOLD (0.25 s): pings from then on.
    reader = await chat.chat({"input": "/sleep 0.6\nslow", "agentRole": "coder"})
    frames = await reader.rest()
    pings = [f for f in frames if f.data and f.event == "ping"]
    assert len(pings) >= 3
    for ping in pings:
        # A ping repeats the last seq sent (0 before any), so a reconnect after it misses nothing.
        assert ping.id is not None and set(ping.json) == {"event", "data"} and "at" in ping.payload
    # Pings only while the run is open: none after agent.end.
    assert _names(frames)[-1] == "agent.end"


async def test_chat060_pings_are_periodic_while_events_flow(chat, settings):
    """CHAT-060: a ping every interval even while the answer streams steadily (never a silence)."""
    settings.SSE_PING_INTERVAL = 0.2
    reader = await chat.chat({"input": "/drip 40 0.02\nsteady", "agentRole": "coder"})
    frames = events_of(await reader.rest())
    names = [f.event for f in frames]
    first, last = names.index("agent.delta"), len(names) - 1 - names[::-1].index("agent.delta")
    assert names[first:last].count("ping") >= 2, names


async def test_chat060_ping_while_waiting(chat, settings):
    settings.SSE_PING_INTERVAL = 0.05
    reader = await chat.chat({"input": WRITE_TOOL, "agentRole": "coder"})
    awaiting = await reader.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    for _ in range(3):
        await reader.until(lambda f: f.event == "ping", timeout=2)
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting.payload['confirmationId']}/deny")
    assert _names(await reader.rest())[-1] == "agent.end"


# --- CHAT-080: timeline --------------------------------------------------------------------------

async def test_chat080_timeline_is_complete_and_ordered(chat):
    reader = await chat.chat({"input": f"{WRITE_TOOL}\ndone", "agentRole": "coder"})
    awaiting = await reader.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting.payload['confirmationId']}/approve")
    streamed = run_events_of(await reader.rest())
    status, timeline = await chat.json("GET", f"/v1/agent/runs/{reader.response['X-Run-Id']}/timeline")
    assert status == 200
    assert timeline["runId"] == reader.response["X-Run-Id"]
    assert timeline["status"] == "succeeded" and timeline["startedAt"] and timeline["endedAt"]
    events = timeline["events"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [(e["seq"], e["event"], e["payload"]) for e in events] == [
        (int(f.id), f.event, f.payload) for f in streamed]
    assert all(e["at"] for e in events)
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    assert {"agent.start", "agent.delta", "tool.state", "agent.message", "agent.end"} <= {e["event"] for e in events}


async def test_chat080_unknown_run_returns_not_found_code(chat, other_chat):
    reader = await chat.chat({"input": "hi", "agentRole": "coder"})
    await reader.rest()
    for client, run_id in [(chat, str(uuid.uuid4())), (chat, "not-a-run"), (other_chat, reader.response["X-Run-Id"])]:
        status, body = await client.json("GET", f"/v1/agent/runs/{run_id}/timeline")
        assert status == 404
        assert body["code"] == "run_timeline_not_found" and body["message"]


def test_sse_parser_handles_comments_and_multiline_data():
    frames = parse_sse(": ping\n\nid: 3\ndata: {\"a\":\ndata: 1}\n\n")
    assert frames[0].comment == "ping" and frames[1].id == "3" and frames[1].json == {"a": 1}


async def _run_with_events(user, status: str, names: list[str]) -> Run:
    from django.utils import timezone

    from chat_app.models import RunEvent

    conversation = await Conversation.objects.acreate(owner=user)
    run = await Run.objects.acreate(conversation=conversation, engine="mock", status=status)
    for seq, name in enumerate(names, start=1):
        await RunEvent.objects.acreate(run=run, seq=seq, event=name, at=timezone.now(), payload={})
    return run


async def test_chat030_reader_in_another_process_is_woken_by_the_ring_not_a_timer(user, monkeypatch):
    """A reader of a run executing elsewhere wakes on each recorded batch's ring (the database
    re-read on a timer is only the safety net, made too slow to matter here)."""
    from django.utils import timezone

    from chat_app import eventlog
    from chat_app.models import RunEvent
    from chat_app.services import run_subscribe
    from core.doorbell import ring

    monkeypatch.setattr(eventlog, "SAFETY_NET_SECONDS", 60.0)
    run = await _run_with_events(user, "running", ["agent.start"])
    events = run_subscribe(run_id=str(run.id))
    assert (await asyncio.wait_for(anext(events), 5)).event == "agent.start"
    next_event = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.2)  # the reader is waiting now
    await RunEvent.objects.acreate(run=run, seq=2, event="agent.delta", at=timezone.now(), payload={"text": "hi"})
    await ring(str(run.id), "events")
    assert (await asyncio.wait_for(next_event, 5)).event == "agent.delta"
    # The end: the final status and agent.end commit together, then the ring.
    await RunEvent.objects.acreate(run=run, seq=3, event="agent.end", at=timezone.now(), payload={"status": "succeeded"})
    await Run.objects.filter(id=run.id).aupdate(status="succeeded")
    await ring(str(run.id), "events")
    rest = await asyncio.wait_for(_collect(events), 5)
    assert [e.event for e in rest] == ["agent.end"]


async def test_chat030_reader_of_a_run_that_died_without_agent_end_stops_at_once(user):
    """Terminal status with nothing after the last event: there is nothing more to wait for."""
    from chat_app.services import run_subscribe

    run = await _run_with_events(user, "failed", ["agent.start"])
    events = await asyncio.wait_for(_collect(run_subscribe(run_id=str(run.id))), 5)
    assert [e.event for e in events] == ["agent.start"]


async def _collect(iterator) -> list:
    return [e async for e in iterator]
