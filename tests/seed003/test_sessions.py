"""Seed 003 "Claude Agent SDK Integration": a prompt's answer and session id; resuming a session."""
from __future__ import annotations

import pytest

from chat_app import services
from chat_app.models import Conversation, Message
from tests.fakes.anthropic_server import text_reply

from .conftest import ANALYST

pytestmark = pytest.mark.django_db(transaction=True)


async def _run(**kwargs):
    created = await services.run_start(**kwargs)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    return created, events


async def test_execute_prompt_returns_response_and_session_id(user, claude):
    claude.script(text_reply(["Hel", "lo ", "Ada"]))
    created, events = await _run(user=user, input="hi", agent_role=ANALYST)
    assert created.run.engine == "claude"
    deltas = [e.payload["text"] for e in events if e.event == "agent.delta"]
    assert deltas == ["Hel", "lo ", "Ada"]
    end = events[-1].payload
    assert end["status"] == "succeeded"
    assert end["text"] == "Hello Ada"  # the aggregated response
    assert end["sessionId"]
    conversation = await Conversation.objects.aget(id=created.conversation.id)
    assert conversation.engine_session_id == end["sessionId"]
    message = await Message.objects.aget(id=end["messageId"])
    assert message.content == "Hello Ada" and message.metadata["sessionId"] == end["sessionId"]
    assert end["usage"]["output_tokens"] == 3


async def test_execute_prompt_mock_engine_also_returns_session_id(user):
    created, events = await _run(user=user, input="hi", agent_role="coder")
    assert created.run.engine == "mock"
    assert events[-1].payload["sessionId"].startswith("mock-")


async def test_resume_existing_session_carries_context(user, claude):
    claude.script(text_reply("Nice to meet you, Ada."), text_reply("Your name is Ada."))
    first, first_events = await _run(user=user, input="My name is Ada.", agent_role=ANALYST)
    session_id = first_events[-1].payload["sessionId"]

    second, events = await _run(user=user, input="What is my name?", conversation_id=str(first.conversation.id))
    assert events[0].payload["sessionId"] == session_id  # the run starts from the stored session
    assert events[-1].payload["sessionId"] == session_id  # and keeps it
    assert events[-1].payload["text"] == "Your name is Ada."
    # What the model received on the second turn: the first turn's user and assistant messages.
    request = claude.requests_to("/v1/messages")[-1].json
    assert request["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "What is my name?"},
    ]


async def test_resume_after_failed_turn_does_not_replay_it(user, claude):
    """A failed turn leaves only its user message; the next turn's context stays well-formed."""
    from tests.fakes.anthropic_server import http_error

    claude.script(text_reply("One."), http_error(400, "bad"), text_reply("Three."))
    first, _ = await _run(user=user, input="one", agent_role=ANALYST)
    cid = str(first.conversation.id)
    _, failed = await _run(user=user, input="two", conversation_id=cid)
    assert failed[-1].payload["status"] == "failed"
    _, events = await _run(user=user, input="three", conversation_id=cid)
    assert events[-1].payload["status"] == "succeeded"
    sent = claude.requests_to("/v1/messages")[-1].json["messages"]
    assert [m["role"] for m in sent][:2] == ["user", "assistant"] and sent[-1] == {"role": "user", "content": "three"}
