"""CHAT-010 / CHAT-020: conversations and message history over REST."""
from __future__ import annotations

import pytest


pytestmark = pytest.mark.django_db(transaction=True)


def test_chat010_create_conversation(api):
    response = api.post("/v1/conversations", {}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert {"id", "title", "createdAt", "updatedAt"} <= set(body)

    titled = api.post("/v1/conversations", {"title": "Quarterly review"}, format="json").json()
    assert titled["title"] == "Quarterly review"


def test_chat010_create_conversation_with_empty_body(api):
    response = api.post("/v1/conversations")
    assert response.status_code == 200
    assert response.json()["id"]


@pytest.mark.parametrize("body", [{"title": 5}, {"title": ["x"]}, ["not", "an", "object"], {"title": "x" * 301}])
def test_chat010_create_conversation_rejects_bad_body(api, body):
    response = api.post("/v1/conversations", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"


def test_chat010_list_conversations_newest_activity_first(api, other_api):
    first = api.post("/v1/conversations", {"title": "first"}, format="json").json()
    second = api.post("/v1/conversations", {"title": "second"}, format="json").json()
    third = api.post("/v1/conversations", {"title": "third"}, format="json").json()
    other_api.post("/v1/conversations", {"title": "not yours"}, format="json")
    from chat_app.models import Conversation

    # Activity on the first one moves it to the top.
    Conversation.objects.get(id=first["id"]).save()
    listed = api.get("/v1/conversations")
    assert listed.status_code == 200
    ids = [c["id"] for c in listed.json()]
    assert ids == [first["id"], third["id"], second["id"]]
    stamps = [c["updatedAt"] for c in listed.json()]
    assert stamps == sorted(stamps, reverse=True)


def test_chat010_requires_authentication(client):
    response = client.get("/v1/conversations")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_chat020_fetch_message_history_oldest_first(api, user):
    from chat_app.models import Conversation, Message

    conversation = Conversation.objects.create(owner=user, title="history")
    for role, content in [("user", "one"), ("assistant", "two"), ("user", "three")]:
        Message.objects.create(conversation=conversation, role=role, content=content)
    response = api.get(f"/v1/conversations/{conversation.id}/messages")
    assert response.status_code == 200
    body = response.json()
    assert [m["content"] for m in body] == ["one", "two", "three"]
    assert [m["createdAt"] for m in body] == sorted(m["createdAt"] for m in body)
    assert {"id", "conversationId", "runId", "role", "content", "metadata", "createdAt"} <= set(body[0])


def test_chat020_other_users_or_unknown_conversation_is_404(api, other_api):
    conversation = api.post("/v1/conversations", {}, format="json").json()
    for client, conversation_id in [(other_api, conversation["id"]), (api, "00000000-0000-0000-0000-000000000000"),
                                    (api, "not-a-uuid")]:
        response = client.get(f"/v1/conversations/{conversation_id}/messages")
        assert response.status_code == 404
        assert response.json()["code"] == "conversation_not_found"
