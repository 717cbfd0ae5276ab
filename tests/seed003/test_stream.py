"""Seed 003 "SSE Streaming for Interactive Chat": POST /conversations/:id/messages/stream."""
from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async

from chat_app.transports.message_stream import MessageStreamDialect
from core.events import RecordedEvent
from chat_app.models import Conversation, Message, Run
from tests.conftest import wait_for

from .conftest import open_stream, parse_frame, stream_path

pytestmark = pytest.mark.django_db(transaction=True)


async def _conversation(user, role: str = "coder") -> Conversation:
    from agents_app.models import Agent

    agent = await Agent.objects.aget(role=role)
    return await Conversation.objects.acreate(owner=user, title="t", agent=agent)


def render_all(events) -> list[str]:
    dialect = MessageStreamDialect(run_id="r1", conversation_id="c1")
    return [frame for event in events for frame in dialect.translate(event)]


async def test_stream_chat_response_event_sequence(user, token):
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token,
                               body={"content": "/drip 3 0.05\nhello there friend"})
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.headers["cache-control"].startswith("no-cache")
    events = await stream.events()
    await stream.close()
    names = [e.event for e in events]
    assert names[0] == "init" and names[-1] == "done"
    assert set(names) == {"init", "assistant", "done"}
    assert names.count("assistant") >= 3  # each paced delta as it arrives (fast ones may be merged)
    init = events[0].data
    assert init["conversationId"] == str(conversation.id)
    assert init["sessionId"] is None  # the conversation's first turn: no session to resume yet
    run = await Run.objects.aget(id=init["runId"])
    assert run.conversation_id == conversation.id
    text = "".join(e.data["text"] for e in events if e.event == "assistant")
    assert text == "Mock reply from coder: hello there friend"
    assert events[-1].data["text"] == text
    # The raw frames are exactly "event: <type>\ndata: <json>\n\n".
    assert stream.body.decode().startswith("event: init\ndata: {")


async def test_stream_chat_tool_use_events_report_each_state(user, token, agents):
    conversation = await _conversation(user)
    body = {"content": '/tool read_file {"path": "missing.txt"}'}
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body=body)
    events = await stream.events()
    await stream.close()
    tool_events = [e.data for e in events if e.event == "tool_use"]
    assert [t["status"] for t in tool_events] == ["pending", "running", "failed"]
    assert all(t["name"] == "read_file" and t["input"] == {"path": "missing.txt"} for t in tool_events)
    assert len({t["id"] for t in tool_events}) == 1
    assert tool_events[-1]["error"]
    assert events[-1].event == "done"


async def test_stream_chat_engine_error_sends_error_event(user, token):
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "/fail boom"})
    events = await stream.events()
    await stream.close()
    assert [e.event for e in events] == ["init", "error"]
    assert events[-1].data["code"] == "mock_failure"
    assert "boom" in events[-1].data["message"]


async def test_persist_streamed_response_updates_session(user, token):
    conversation = await _conversation(user)
    path = stream_path(str(conversation.id))
    first = await open_stream(path, token=token, body={"content": "first turn"})
    events = await first.events()
    await first.close()
    done = events[-1].data
    message = await Message.objects.aget(id=done["messageId"])
    assert message.role == "assistant" and message.content == done["text"] == "Mock reply from coder: first turn"
    await conversation.arefresh_from_db()
    assert done["sessionId"] and conversation.engine_session_id == done["sessionId"]
    assert message.metadata["sessionId"] == done["sessionId"]

    # The next turn starts from (init) and keeps (done) the stored session.
    second = await open_stream(path, token=token, body={"content": "/recall"})
    events = await second.events()
    await second.close()
    assert events[0].data["sessionId"] == done["sessionId"]
    assert events[-1].data["sessionId"] == done["sessionId"]
    assert "user: first turn" in events[-1].data["text"]
    roles = await sync_to_async(list)(conversation.messages.order_by("created_at").values_list("role", flat=True))
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_client_disconnect_saves_no_partial_response(user, token, caplog):
    caplog.set_level(logging.INFO, logger="orchestrator.sse")
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "/sleep 30\nslow answer"})
    init = await stream.next_event()
    assert init.event == "init"
    run_id = init.data["runId"]
    await stream.disconnect()

    async def cancelled():
        return await Run.objects.filter(id=run_id, status=Run.Status.CANCELLED).aexists()

    await wait_for(cancelled, timeout=10)
    await stream.close()
    # Logged once the cancel returned, which is just after the cancelled status is committed.
    await wait_for(lambda: any("closed early: run cancelled" in r.getMessage() for r in caplog.records), timeout=10)
    run = await Run.objects.aget(id=run_id)
    assert run.cancel_requested and run.ended_at is not None
    assert not await Message.objects.filter(conversation=conversation, role="assistant").aexists()
    user_messages = await sync_to_async(list)(Message.objects.filter(conversation=conversation, role="user"))
    assert [m.content for m in user_messages] == ["/sleep 30\nslow answer"]

    # The turn can be retried on the same conversation.
    retry = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "again"})
    events = await retry.events()
    await retry.close()
    assert events[-1].event == "done"


async def test_client_disconnect_before_the_first_output_cancels_the_run(user, token, settings):
    # The response is set up at the run's first output: a client gone before that still cancels.
    settings.STREAM_OPENING_HOLD = 30.0  # the run stays silent; the response stays unset meanwhile
    from asgiref.testing import ApplicationCommunicator

    from chat_app.executor import get_executor
    from orchestrator_site.asgi import application

    conversation = await _conversation(user)
    before = set(get_executor().live)
    path = stream_path(str(conversation.id))
    payload = b'{"content": "/sleep 30\\nslow answer"}'
    communicator = ApplicationCommunicator(application, {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80), "headers": [
            (b"host", b"testserver"), (b"content-type", b"application/json"), (b"accept", b"text/event-stream"),
            (b"content-length", str(len(payload)).encode()), (b"authorization", f"Token {token}".encode())]})
    await communicator.send_input({"type": "http.request", "body": payload, "more_body": False})

    async def started():
        return set(get_executor().live) - before

    run_id = (await wait_for(started, timeout=10)).pop()
    assert communicator.output_queue.empty()  # nothing of the response yet: the run has no output
    await communicator.send_input({"type": "http.disconnect"})

    async def cancelled():
        return await Run.objects.filter(id=run_id, status=Run.Status.CANCELLED).aexists()

    await wait_for(cancelled, timeout=10)
    await communicator.wait(timeout=10)
    assert not await Message.objects.filter(conversation=conversation, role="assistant").aexists()


async def test_client_disconnect_after_done_cancels_nothing(user, token):
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "quick"})
    events = await stream.events()
    await stream.disconnect()
    await stream.close()
    run = await Run.objects.aget(id=events[0].data["runId"])
    assert run.status == "succeeded" and not run.cancel_requested


async def test_stream_chat_unknown_or_foreign_conversation_is_404_json(user, token, other_user):
    foreign = await _conversation(other_user)
    for conversation_id in (str(foreign.id), "00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        stream = await open_stream(stream_path(conversation_id), token=token, body={"content": "hi"}, accept="*/*")
        assert stream.status == 404
        assert stream.headers["content-type"].startswith("application/json")
        assert (await stream.json())["code"] == "conversation_not_found"
        await stream.close()
    assert not await Message.objects.filter(conversation=foreign).aexists()


@pytest.mark.parametrize("body", [{}, {"content": ""}, {"content": "   "}, {"content": 5}, {"content": None},
                                  ["content"], {"content": "hi", "mcpServers": [{"name": "a b"}]},
                                  {"content": "hi", "mcpServers": [5]}, {"content": "hi", "mcpServers": [{"name": 5}]},
                                  {"content": "hi", "mcpServers": "nope"}])
async def test_stream_chat_bad_body_is_400_json(user, token, body):
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body=body, accept="application/json")
    assert stream.status == 400
    payload = await stream.json()
    assert payload["code"] == "invalid_input" and payload["message"]
    await stream.close()
    assert not await Run.objects.filter(conversation=conversation).aexists()


async def test_stream_chat_malformed_json_and_no_auth(user, token):
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token, raw=b"{nope", accept="application/json")
    assert stream.status == 400 and (await stream.json())["code"] == "malformed_json"
    await stream.close()
    stream = await open_stream(stream_path(str(conversation.id)), token=None, body={"content": "hi"}, accept="application/json")
    assert stream.status == 401
    await stream.close()


async def test_stream_chat_v1_alias_works(user, token):
    conversation = await _conversation(user)
    stream = await open_stream(f"/v1/conversations/{conversation.id}/messages/stream", token=token, body={"content": "x"})
    events = await stream.events()
    await stream.close()
    assert events[-1].event == "done"


def test_seed003_dialect_maps_recorded_sequence():
    def rec(seq, event, payload):
        return RecordedEvent.from_payload("r1", seq, event, payload)

    events = [
        rec(1, "agent.start", {"runId": "r1", "conversationId": "c1", "agentRole": "coder", "engine": "mock",
                               "model": "m", "sessionId": "s0"}),
        rec(2, "agent.delta", {"text": "Hi "}),
        rec(3, "tool.state", {"toolCallId": "t1", "name": "bash", "status": "awaiting_input", "input": {"c": 1},
                              "confirmationId": "k1"}),
        rec(4, "tool.state", {"toolCallId": "t1", "name": "bash", "status": "succeeded", "input": {"c": 1}, "output": "ok"}),
        rec(5, "context.patch", {"kind": "step", "data": {}}),
        rec(6, "agent.message", {"messageId": "m1", "content": "Hi there", "role": "assistant"}),
        rec(7, "agent.end", {"status": "succeeded", "messageId": "m1", "sessionId": "s1", "text": "Hi there",
                             "usage": {"output_tokens": 2}}),
    ]
    frames = [parse_frame(f.strip("\n")) for f in render_all(events)]
    assert [(f.event, f.data) for f in frames] == [
        ("init", {"sessionId": "s0", "conversationId": "c1", "runId": "r1", "agentRole": "coder", "engine": "mock", "model": "m"}),
        ("assistant", {"text": "Hi "}),
        ("tool_use", {"id": "t1", "name": "bash", "input": {"c": 1}, "status": "awaiting_input", "confirmationId": "k1"}),
        ("tool_use", {"id": "t1", "name": "bash", "input": {"c": 1}, "status": "succeeded", "output": "ok"}),
        ("done", {"messageId": "m1", "sessionId": "s1", "text": "Hi there", "usage": {"output_tokens": 2}}),
    ]
    failed = [events[0], rec(2, "error", {"code": "run_timeout", "message": "late"}),
              rec(3, "agent.end", {"status": "failed", "error": "late", "errorCode": "run_timeout"})]
    assert [parse_frame(f.strip("\n")).event for f in render_all(failed)] == ["init", "error"]
    cancelled = [events[0], rec(2, "agent.end", {"status": "cancelled", "error": "Run was cancelled.", "errorCode": "cancelled"})]
    last = parse_frame(render_all(cancelled)[-1].strip("\n"))
    assert (last.event, last.data["code"]) == ("error", "cancelled")


async def test_stream_chat_sends_keepalive_comments_while_quiet(user, token, settings):
    settings.SSE_PING_INTERVAL = 0.05
    conversation = await _conversation(user)
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "/sleep 0.4\nok"})
    events = await stream.events()
    await stream.close()
    assert ": ping\n\n" in stream.body.decode()  # a comment: EventSource clients ignore it
    assert [e.event for e in events][0] == "init" and events[-1].event == "done"
