"""Conversation rename, delete and search; the timeline's provider, route note and cost."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from chat_app.models import Conversation, Message, Run, RunEvent
from tests.agent_chat.conftest import WRITE_TOOL
from tests.conftest import wait_for
from tools_app.models import ToolConfirmation, ToolRule

pytestmark = pytest.mark.django_db(transaction=True)


# --- rename ---------------------------------------------------------------------------------------

def test_conversation_rename_sets_title(api, user):
    conversation = Conversation.objects.create(owner=user, title="old")
    response = api.patch(f"/v1/conversations/{conversation.id}", {"title": "  新的标题 "}, format="json")
    assert response.status_code == 200
    assert response.json()["title"] == "新的标题"
    assert Conversation.objects.get(id=conversation.id).title == "新的标题"


def test_conversation_rename_keeps_the_list_order(api, user):
    older = Conversation.objects.create(owner=user, title="older")
    Conversation.objects.create(owner=user, title="newer")
    api.patch(f"/v1/conversations/{older.id}", {"title": "renamed"}, format="json")
    assert [c["title"] for c in api.get("/v1/conversations").json()] == ["newer", "renamed"]


@pytest.mark.parametrize("body", [{"title": 5}, {"title": None}, {}, ["x"], {"title": "x" * 301}])
def test_conversation_rename_bad_input_is_400(api, user, body):
    conversation = Conversation.objects.create(owner=user, title="old")
    response = api.patch(f"/v1/conversations/{conversation.id}", body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    assert Conversation.objects.get(id=conversation.id).title == "old"


def test_conversation_rename_malformed_json_is_400(api, user):
    conversation = Conversation.objects.create(owner=user, title="old")
    response = api.generic("PATCH", f"/v1/conversations/{conversation.id}", "{nope", content_type="application/json")
    assert response.status_code == 400 and response.json()["code"] == "malformed_json"


def test_conversation_rename_other_users_is_404(api, other_user):
    theirs = Conversation.objects.create(owner=other_user, title="theirs")
    response = api.patch(f"/v1/conversations/{theirs.id}", {"title": "mine now"}, format="json")
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"
    assert Conversation.objects.get(id=theirs.id).title == "theirs"


@pytest.mark.parametrize("conversation_id", ["not-a-uuid", str(uuid.uuid4())])
def test_conversation_get_unknown_is_404(api, conversation_id):
    response = api.get(f"/v1/conversations/{conversation_id}")
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"


def test_conversation_get_other_users_is_404(api, other_user):
    theirs = Conversation.objects.create(owner=other_user, title="theirs")
    assert api.get(f"/v1/conversations/{theirs.id}").status_code == 404


# --- delete ---------------------------------------------------------------------------------------

def test_conversation_delete_removes_everything(api, user):
    conversation = Conversation.objects.create(owner=user, title="doomed")
    run = Run.objects.create(conversation=conversation, engine="mock", status=Run.Status.SUCCEEDED)
    Message.objects.create(conversation=conversation, run=run, role="user", content="hi")
    RunEvent.objects.create(run=run, seq=1, event="agent.start", at="2026-01-01T00:00:00Z", payload={})
    ToolRule.objects.create(effect="allow", tool="bash", scope="conversation", conversation_id=conversation.id, owner=user)
    kept = Conversation.objects.create(owner=user, title="kept")
    response = api.delete(f"/v1/conversations/{conversation.id}")
    assert response.status_code == 204
    assert list(Conversation.objects.values_list("id", flat=True)) == [kept.id]
    assert not Run.objects.exists() and not Message.objects.exists() and not RunEvent.objects.exists()
    assert not ToolRule.objects.filter(conversation_id=conversation.id).exists()
    assert api.delete(f"/v1/conversations/{conversation.id}").status_code == 404


def test_conversation_delete_other_users_is_404(api, other_user):
    theirs = Conversation.objects.create(owner=other_user, title="theirs")
    response = api.delete(f"/v1/conversations/{theirs.id}")
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"
    assert Conversation.objects.filter(id=theirs.id).exists()


def test_conversation_delete_bad_id_is_404(api):
    response = api.delete("/v1/conversations/not-a-uuid")
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"


async def test_conversation_delete_cancels_its_live_run(chat):
    reader = await chat.chat({"input": WRITE_TOOL, "agentRole": "coder"})
    await reader.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    run_id = reader.response["x-run-id"]
    conversation_id = reader.response["x-conversation-id"]
    response = await chat.client.request("DELETE", f"/v1/conversations/{conversation_id}", headers=chat.headers)
    assert response.status_code == 204
    ended = await reader.until(lambda f: f.event == "agent.end")
    assert ended.payload["status"] == "cancelled"
    from asgiref.sync import sync_to_async

    assert not await sync_to_async(lambda: Run.objects.filter(id=run_id).exists())()
    assert not await sync_to_async(lambda: ToolConfirmation.objects.exists())()


# --- search ---------------------------------------------------------------------------------------

def test_conversation_search_matches_title_and_content(api, user, other_user):
    by_title = Conversation.objects.create(owner=user, title="Quarterly 复盘")
    by_content = Conversation.objects.create(owner=user, title="misc")
    Message.objects.create(conversation=by_content, role="assistant", content="the 复盘 notes are in data/")
    Conversation.objects.create(owner=user, title="unrelated")
    theirs = Conversation.objects.create(owner=other_user, title="their 复盘")
    found = {c["id"] for c in api.get("/v1/conversations", {"q": "复盘"}).json()}
    assert found == {str(by_title.id), str(by_content.id)}
    assert str(theirs.id) not in found
    assert {c["id"] for c in api.get("/v1/conversations", {"q": "QUARTERLY"}).json()} == {str(by_title.id)}
    assert len(api.get("/v1/conversations", {"q": "  "}).json()) == 3


def test_conversation_search_overlong_query_is_400(api):
    response = api.get("/v1/conversations", {"q": "x" * 201})
    assert response.status_code == 400 and response.json()["code"] == "invalid_input"


# --- timeline fields ------------------------------------------------------------------------------

def test_run_timeline_has_provider_route_note_and_cost(api, user):
    conversation = Conversation.objects.create(owner=user)
    run = Run.objects.create(conversation=conversation, engine="mock", provider="local", model="mock-1",
                             route_note="claude has no API key: using mock", cost="0.0042", status="succeeded")
    body = api.get(f"/v1/agent/runs/{run.id}/timeline").json()
    assert body["provider"] == "local"
    assert body["routeNote"] == "claude has no API key: using mock"
    assert body["cost"] == "0.004200"


def test_run_timeline_other_users_is_404(api, other_user):
    conversation = Conversation.objects.create(owner=other_user)
    run = Run.objects.create(conversation=conversation, engine="mock")
    assert api.get(f"/v1/agent/runs/{run.id}/timeline").status_code == 404
