"""The two dialect mappings on a recorded event sequence: exact frames, exact UI chunks."""
from __future__ import annotations

import asyncio
import json

import pytest

from chat_app.transports import agent_chat, vercel_ai
from chat_app.transports.agent_chat import AgentChatDialect
from chat_app.transports.vercel_ai import VercelAiDialect
from core.errors import InvalidInput
from core.events import RecordedEvent
from tests.agent_chat.conftest import parse_with_ai_sdk, render

RUN, CONV = "run-1", "conv-1"
_TOOL = {"toolCallId": "t1", "name": "write_file", "input": {"path": "a.txt"}}
RECORDED = [
    ("agent.start", {"runId": RUN, "conversationId": CONV, "agentRole": "coder", "engine": "mock", "model": "mock-1"}),
    ("agent.delta", {"text": "Let me ", "agent": ""}),
    ("agent.delta", {"text": "write.", "agent": ""}),
    ("tool.state", {**_TOOL, "status": "pending"}),
    ("tool.state", {**_TOOL, "status": "awaiting_input", "confirmationId": "c1"}),
    ("tool.state", {**_TOOL, "status": "running", "confirmationId": "c1"}),
    ("tool.state", {**_TOOL, "status": "succeeded", "output": "Wrote a.txt", "confirmationId": "c1"}),
    ("context.patch", {"kind": "step", "data": {"step": 1}}),
    ("agent.delta", {"text": "Done.", "agent": ""}),
    ("agent.message", {"messageId": "m1", "content": "Let me write.Done.", "role": "assistant"}),
    ("agent.end", {"status": "succeeded", "usage": {"output_tokens": 3}, "messageId": "m1", "sessionId": "", "text": ""}),
]


def _recorded(items=RECORDED) -> list[RecordedEvent]:
    return [RecordedEvent.from_payload(RUN, i, name, payload) for i, (name, payload) in enumerate(items, start=1)]


async def _aiter(items):
    for item in items:
        yield item


def test_agent_chat_frames_are_exact():
    first = _recorded()[0]
    assert agent_chat.event_frame(first) == (
        'id: 1\ndata: {"event":"agent.start","data":{"runId":"run-1","conversationId":"conv-1","agentRole":"coder",'
        '"engine":"mock","model":"mock-1"},"id":1}\n\n')
    assert agent_chat.conversation_created_frame(CONV) == (
        'id: 0\ndata: {"event":"conversation.created","data":{"conversationId":"conv-1"}}\n\n')
    ping = agent_chat.ping_frame(7)
    assert ping.startswith('id: 7\ndata: {"event":"ping","data":{"at":"')


async def test_agent_chat_render_announces_conversation_first():
    frames = await render(AgentChatDialect, _recorded(), conversation_created=True)
    assert json.loads(frames[0].split("data: ", 1)[1])["event"] == "conversation.created"
    assert len(frames) == len(RECORDED) + 1


async def test_stream_coalesces_deltas_for_a_slow_reader_without_losing_text():
    """Deltas that piled up while the reader was busy go out as one frame, text intact, in order."""
    frames = await render(AgentChatDialect, _recorded(), batch=True)
    events = [json.loads(f.split("data: ", 1)[1]) for f in frames]
    names = [e["event"] for e in events]
    assert names == ["agent.start", "agent.delta", "tool.state", "tool.state", "tool.state", "tool.state",
                     "context.patch", "agent.delta", "agent.message", "agent.end"]
    assert events[1]["data"]["text"] == "Let me write." and events[1]["id"] == 3  # the last merged seq
    assert [e["id"] for e in events] == sorted(e["id"] for e in events)


def test_vercel_translation_is_exact():
    translator = vercel_ai.UiMessageStreamTranslator(message_id=RUN, conversation_id=CONV)
    parts = translator.begin(conversation_created=True)
    for event in _recorded():
        parts += translator.translate(event)
    state = lambda status, **extra: {"type": "data-tool-state", "id": "t1",  # noqa: E731
                                     "data": {**_TOOL, "status": status, **extra}}
    assert parts == [
        {"type": "start", "messageId": RUN, "messageMetadata": {"runId": RUN, "conversationId": CONV}},
        {"type": "data-conversation", "data": {"conversationId": CONV}},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "Let me "},
        {"type": "text-delta", "id": "text-1", "delta": "write."},
        {"type": "text-end", "id": "text-1"},
        {"type": "tool-input-start", "toolCallId": "t1", "toolName": "write_file", "dynamic": True},
        {"type": "tool-input-available", "toolCallId": "t1", "toolName": "write_file", "input": {"path": "a.txt"},
         "dynamic": True},
        state("pending"),
        {"type": "tool-approval-request", "approvalId": "c1", "toolCallId": "t1"},
        state("awaiting_input", confirmationId="c1"),
        state("running", confirmationId="c1"),
        {"type": "tool-output-available", "toolCallId": "t1", "output": "Wrote a.txt", "dynamic": True},
        state("succeeded", output="Wrote a.txt", confirmationId="c1"),
        {"type": "finish-step"},
        {"type": "data-context-patch", "data": {"kind": "step", "data": {"step": 1}}, "transient": True},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "Done."},
        {"type": "text-end", "id": "text-2"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop",
         "messageMetadata": {"runId": RUN, "conversationId": CONV, "status": "succeeded",
                             "usage": {"output_tokens": 3}, "messageId": "m1"}},
    ]


async def test_vercel_render_is_accepted_by_the_ai_package(ai_sdk):
    raw = "".join(await render(VercelAiDialect, _recorded(), conversation_created=True))
    assert raw.endswith("data: [DONE]\n\n")
    result = parse_with_ai_sdk(ai_sdk, ": ping\n\n" + raw)  # a comment ping is skipped by the SDK
    assert result["invalid"] == [] and result["errors"] == [] and result["done"]
    message = result["message"]
    assert [p["type"] for p in message["parts"]] == [
        "data-conversation", "step-start", "text", "dynamic-tool", "data-tool-state", "step-start", "text"]
    assert message["parts"][2]["text"] + message["parts"][6]["text"] == "Let me write.Done."
    assert message["parts"][3]["state"] == "output-available" and message["parts"][3]["approval"] == {"id": "c1"}


def test_vercel_message_without_deltas_is_sent_whole():
    translator = vercel_ai.UiMessageStreamTranslator(message_id=RUN, conversation_id=CONV)
    parts = []
    for event in _recorded([RECORDED[0], ("agent.message", {"messageId": "m", "content": "whole", "role": "assistant"})]):
        parts += translator.translate(event)
    assert [p["type"] for p in parts] == ["start-step", "text-start", "text-delta", "text-end"]
    assert translator.close()[-1] == {"type": "finish"}


def test_vercel_resumed_stream_does_not_repeat_known_tool_calls():
    translator = vercel_ai.UiMessageStreamTranslator(message_id=RUN, conversation_id=CONV,
                                                     known_tool_calls={"t1"}, step_open=True)
    parts = []
    for event in _recorded(RECORDED[5:7]):
        parts += translator.translate(event)
    assert [p["type"] for p in parts] == ["data-tool-state", "tool-output-available", "data-tool-state", "finish-step"]


def test_parse_chat_request_reads_text_history_and_approvals():
    body = {"id": "chat", "messages": [
        {"id": "1", "role": "user", "parts": [{"type": "text", "text": "first"}]},
        {"id": "2", "role": "assistant", "parts": [{"type": "step-start"}, {"type": "text", "text": "answer"}]},
        {"id": "3", "role": "user", "parts": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]},
    ]}
    parsed = vercel_ai.parse_chat_request(body)
    assert parsed.chat_id == "chat" and parsed.input == "line one\nline two" and parsed.approvals == []
    assert parsed.history == [{"role": "user", "content": "first"}, {"role": "assistant", "content": "answer"}]

    body["messages"].append({"id": "4", "role": "assistant", "parts": [
        {"type": "tool-write_file", "toolCallId": "t9", "state": "approval-responded", "input": {},
         "approval": {"id": "c9", "approved": False, "reason": "no"}}]})
    parsed = vercel_ai.parse_chat_request(body)
    assert parsed.input is None
    assert parsed.approvals == [vercel_ai.ApprovalResponse("c9", False, "no", "t9")]


@pytest.mark.parametrize("approval", [None, {"id": 1, "approved": True}, {"id": "c", "approved": "yes"}])
def test_parse_chat_request_rejects_malformed_approval(approval):
    body = {"messages": [{"role": "assistant", "parts": [
        {"type": "dynamic-tool", "toolName": "x", "toolCallId": "t", "state": "approval-responded", "approval": approval}]}]}
    with pytest.raises(InvalidInput):
        vercel_ai.parse_chat_request(body)


class _TimedSubscription:
    """Batches that become readable at given loop times (seconds after the first ``next``)."""

    def __init__(self, timed_batches):
        self.timed = list(timed_batches)
        self.t0 = None

    async def next(self, deadline=None):
        loop = asyncio.get_running_loop()
        self.t0 = self.t0 if self.t0 is not None else loop.time()
        if not self.timed:
            return None
        at, batch = self.timed[0]
        ready = self.t0 + at
        if deadline is not None and deadline < ready:
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            raise TimeoutError
        await asyncio.sleep(max(0.0, ready - loop.time()))
        self.timed.pop(0)
        return batch

    async def close(self):
        return None


async def _yields(subscription, *, hold, **options):
    """Each list stream_run yields, with the loop time (since start) it was yielded at."""
    from chat_app.transports import stream_run

    loop = asyncio.get_running_loop()
    start = loop.time()
    dialect = AgentChatDialect(run_id=RUN, conversation_id=CONV, **options)
    return [(loop.time() - start, frames)
            async for frames in stream_run(dialect, subscription, ping_interval=60, hold=hold)]


async def test_a_held_stream_opens_with_its_first_output_in_one_write():
    """With ``hold``, the opening frames and agent.start wait for the run's next event and go out
    with it (a relay's order: the provider request first, then the response head and text)."""
    events = _recorded()
    timed = [(0.0, [events[0]]), (0.05, [events[1]]), (0.06, [events[2]])] + [(0.06, [e]) for e in events[3:]]
    held = await _yields(_TimedSubscription(timed), hold=5, conversation_created=True)
    plain = await _yields(_TimedSubscription(timed), hold=0, conversation_created=True)
    assert [f for _, frames in held for f in frames] == [f for _, frames in plain for f in frames]
    first_at, first = held[0]
    assert first_at >= 0.05  # nothing before the first output
    names = [json.loads(f.split("data: ", 1)[1])["event"] for f in first]
    assert names == ["conversation.created", "agent.start", "agent.delta"]
    assert plain[0][0] < 0.05 and len(plain[0][1]) == 1  # without it the opening goes out at once


async def test_a_held_stream_opens_after_the_hold_when_the_run_is_silent():
    """A model slow to start: the head and opening frames go out when the hold runs out."""
    events = _recorded()
    timed = [(0.0, [events[0]]), (1.0, [events[1]])] + [(1.0, [e]) for e in events[2:]]
    held = await _yields(_TimedSubscription(timed), hold=0.1)
    first_at, first = held[0]
    assert 0.1 <= first_at < 0.9
    assert [json.loads(f.split("data: ", 1)[1])["event"] for f in first] == ["agent.start"]
    assert held[1][0] >= 1.0  # the rest as it comes


async def test_a_held_stream_of_a_run_that_ends_at_once_still_sends_everything():
    events = [RecordedEvent.from_payload(RUN, 1, *RECORDED[0]),
              RecordedEvent.from_payload(RUN, 2, "agent.end", {"status": "failed", "error": "no", "errorCode": "internal_error"})]
    held = await _yields(_TimedSubscription([(0.0, events)]), hold=5)
    assert len(held) == 1 and held[0][0] < 1
    assert [json.loads(f.split("data: ", 1)[1])["event"] for f in held[0][1]] == ["agent.start", "agent.end"]
