"""Regenerate and edit-and-resend the last turn: ``POST /v1/agent/chat {conversationId, regenerate: true, input?}``."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat_app.models import Conversation, Message, Run
from tests.agent_chat.conftest import WRITE_TOOL

pytestmark = pytest.mark.django_db(transaction=True)


async def _turn(chat, body) -> tuple[dict, str]:
    reader = await chat.chat(body)
    end = await reader.until(lambda f: f.event == "agent.end")
    return end.payload, reader.response["x-conversation-id"]


async def test_regenerate_answers_again_without_the_superseded_turn(chat):
    _, conversation_id = await _turn(chat, {"input": "first question", "agentRole": "coder"})
    await _turn(chat, {"conversationId": conversation_id, "input": "second question"})
    # Regenerating "second question": the model sees only the first turn as history.
    end, _ = await _turn(chat, {"conversationId": conversation_id, "regenerate": True, "input": "/recall\nsecond, again"})
    assert end["status"] == "succeeded"
    assert "user: first question" in end["text"]
    assert "second question" not in end["text"]
    messages = await sync_to_async(lambda: list(Message.objects.filter(conversation_id=conversation_id)
                                                .order_by("created_at", "id").values_list("role", "content", "metadata")))()
    superseded = [(role, content) for role, content, md in messages if md.get("superseded")]
    assert [role for role, _ in superseded] == ["user", "assistant"]
    assert superseded[0][1] == "second question"
    # The next ordinary turn's history leaves the superseded turn out too.
    end, _ = await _turn(chat, {"conversationId": conversation_id, "input": "/recall"})
    assert "second question" not in end["text"] and "second, again" in end["text"]
    # Every run, superseded or not, keeps its timeline.
    assert await sync_to_async(Run.objects.filter(conversation_id=conversation_id).count)() == 4


async def test_regenerate_without_input_repeats_the_last_message(chat):
    _, conversation_id = await _turn(chat, {"input": "say it twice", "agentRole": "coder"})
    end, _ = await _turn(chat, {"conversationId": conversation_id, "regenerate": True})
    assert end["text"] == "Mock reply from coder: say it twice"
    users = await sync_to_async(lambda: list(Message.objects.filter(conversation_id=conversation_id, role="user")
                                             .values_list("content", "metadata")))()
    assert [c for c, _ in users] == ["say it twice", "say it twice"]
    assert sum(1 for _, md in users if md.get("superseded")) == 1


async def test_regenerate_while_a_run_is_going_is_409(chat):
    reader = await chat.chat({"input": WRITE_TOOL, "agentRole": "coder"})
    await reader.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    response = await chat.post_json("/v1/agent/chat", {"conversationId": reader.response["x-conversation-id"],
                                                       "regenerate": True})
    assert response.status_code == 409 and response.json()["code"] == "conversation_busy"
    await chat.post_json(f"/v1/agent/runs/{reader.response['x-run-id']}/cancel")


@pytest.mark.parametrize("body, code", [
    ({"regenerate": True}, "invalid_input"),                          # no conversation
    ({"regenerate": "yes please", "conversationId": "x"}, "invalid_input"),
    ({"regenerate": False}, "invalid_input"),                         # then input is required
    ({"regenerate": True, "conversationId": "CONV", "input": "   "}, "invalid_input"),
])
async def test_regenerate_bad_input_is_400(chat, user, body, code):
    conversation = await sync_to_async(Conversation.objects.create)(owner=user)
    await sync_to_async(Message.objects.create)(conversation=conversation, role="user", content="hi")
    if body.get("conversationId") == "CONV":
        body = {**body, "conversationId": str(conversation.id)}
    response = await chat.post_json("/v1/agent/chat", body)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code


async def test_regenerate_empty_conversation_is_400(chat, user):
    conversation = await sync_to_async(Conversation.objects.create)(owner=user)
    response = await chat.post_json("/v1/agent/chat", {"conversationId": str(conversation.id), "regenerate": True})
    assert response.status_code == 400 and response.json()["code"] == "nothing_to_regenerate"


async def test_regenerate_other_users_conversation_is_404(chat, other_user):
    theirs = await sync_to_async(Conversation.objects.create)(owner=other_user)
    await sync_to_async(Message.objects.create)(conversation=theirs, role="user", content="secret")
    response = await chat.post_json("/v1/agent/chat", {"conversationId": str(theirs.id), "regenerate": True})
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"
    assert await sync_to_async(Run.objects.count)() == 0
