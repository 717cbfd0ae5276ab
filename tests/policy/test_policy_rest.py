"""REST: ``/v1/conversations/:id/tool-rules`` and ``remember`` on the approve/deny endpoints."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

import uuid

import pytest

from chat_app.models import Conversation, Run
from tools_app.models import ToolConfirmation, ToolRule

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user, analyst):
    return Conversation.objects.create(owner=user, agent=analyst)


def _rules_url(conversation_id) -> str:
    return f"/v1/conversations/{conversation_id}/tool-rules"


def test_conversation_tool_rules_create_list_delete(api, conversation, user):
    assert api.get(_rules_url(conversation.id)).json() == []
    response = api.post(_rules_url(conversation.id), {"effect": "allow", "tool": "bash", "argument": "git status*"},
                        format="json")
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"id", "effect", "tool", "argument", "scope", "name", "createdAt"}
    assert (body["effect"], body["tool"], body["argument"], body["scope"]) == ("allow", "bash", "git status*",
                                                                             "conversation")
    assert body["name"] == f"conversation rule #{body['id']}: allow bash git status*"
    named = api.post(_rules_url(conversation.id), {"effect": "deny", "tool": "web_fetch", "argument": "*.evil.com",
                                                    "name": "no evil"}, format="json").json()
    assert named["name"] == "no evil"
    listed = api.get(_rules_url(conversation.id)).json()
    assert [r["id"] for r in listed] == [body["id"], named["id"]]
    rule = ToolRule.objects.get(id=body["id"])
    assert rule.owner == user and rule.conversation_id == conversation.id and rule.agent_id is None

    assert api.delete(f"{_rules_url(conversation.id)}/{body['id']}").status_code == 204
    assert [r["id"] for r in api.get(_rules_url(conversation.id)).json()] == [named["id"]]
    again = api.delete(f"{_rules_url(conversation.id)}/{body['id']}")
    assert again.status_code == 404 and again.json()["code"] == "tool_rule_not_found"


def test_conversation_tool_rules_other_user_gets_404(api, other_api, conversation):
    rule_id = api.post(_rules_url(conversation.id), {"effect": "allow", "tool": "bash"}, format="json").json()["id"]
    responses = [
        other_api.get(_rules_url(conversation.id)),
        other_api.post(_rules_url(conversation.id), {"effect": "allow", "tool": "write_file"}, format="json"),
        other_api.delete(f"{_rules_url(conversation.id)}/{rule_id}"),
    ]
    for response in responses:
        assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"
    assert list(ToolRule.objects.values_list("id", flat=True)) == [rule_id]  # nothing read, added or removed


def test_conversation_tool_rules_rule_of_another_conversation_is_404(api, other_api, conversation, other_user):
    theirs = Conversation.objects.create(owner=other_user)
    their_rule = other_api.post(_rules_url(theirs.id), {"effect": "allow", "tool": "bash"}, format="json").json()
    response = api.delete(f"{_rules_url(conversation.id)}/{their_rule['id']}")
    assert response.status_code == 404 and response.json()["code"] == "tool_rule_not_found"
    assert ToolRule.objects.filter(id=their_rule["id"]).exists()


@pytest.mark.parametrize("conversation_id", [str(uuid.uuid4()), "not-a-uuid"])
def test_conversation_tool_rules_unknown_conversation_is_404(api, conversation_id):
    response = api.get(_rules_url(conversation_id))
    assert response.status_code == 404 and response.json()["code"] == "conversation_not_found"


@pytest.mark.parametrize("body", [
    {"tool": "bash"},
    {"effect": "maybe", "tool": "bash"},
    {"effect": "allow"},
    {"effect": "allow", "tool": 7},
    {"effect": "allow", "tool": "rm -rf"},
    {"effect": "allow", "tool": "bash", "argument": "git status && rm -rf ~"},
    {"effect": "allow", "tool": "read_file", "argument": "/etc/**"},
    {"effect": "allow", "tool": "run_python", "argument": "print*"},
    {"effect": "allow", "tool": "bash", "argument": "x" * 501},
    ["effect", "allow"],
])
def test_conversation_tool_rules_bad_input_is_400(api, conversation, body):
    response = api.post(_rules_url(conversation.id), body, format="json")
    assert response.status_code == 400 and response.json()["code"] == "invalid_input", response.json()
    assert response.json()["message"]
    assert not ToolRule.objects.exists()


def test_conversation_tool_rules_need_authentication(client, conversation):
    response = client.get(_rules_url(conversation.id))
    assert response.status_code == 401


# --- remember on the REST decisions ----------------------------------------------------------------

def _waiting(conversation, command: str) -> ToolConfirmation:
    run = Run.objects.create(conversation=conversation, agent=conversation.agent, engine="mock",
                             lease_expires_at=timezone.now() + timedelta(minutes=5),
                             status=Run.Status.RUNNING)
    return ToolConfirmation.objects.create(run=run, tool_call_id=f"c_{uuid.uuid4().hex[:6]}", tool="bash",
                                           input={"command": command})


def test_tool_confirmation_approve_remember_reports_rule_and_also_decided(api, conversation):
    first, second = _waiting(conversation, "git status"), _waiting(conversation, "git status -s")
    response = api.post(f"/v1/tool-confirmations/{first.id}/approve",
                        {"remember": "conversation", "pattern": "git status*"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "approved" and body["alsoDecided"] == [str(second.id)]
    assert (body["rule"]["effect"], body["rule"]["tool"], body["rule"]["argument"], body["rule"]["scope"]) == (
        "allow", "bash", "git status*", "conversation")
    listed = api.get(_rules_url(conversation.id)).json()
    assert [r["id"] for r in listed] == [body["rule"]["id"]]


def test_tool_confirmation_deny_remember(api, conversation):
    confirmation = _waiting(conversation, "curl x")
    body = api.post(f"/v1/tool-confirmations/{confirmation.id}/deny", {"remember": "conversation"},
                    format="json").json()
    assert body["status"] == "denied" and body["rule"]["effect"] == "deny" and body["alsoDecided"] == []


def test_tool_confirmation_decision_without_remember_has_no_rule(api, conversation):
    body = api.post(f"/v1/tool-confirmations/{_waiting(conversation, 'ls').id}/approve").json()
    assert body["rule"] is None and body["alsoDecided"] == []


def test_tool_confirmation_remember_agent_needs_staff(api, conversation):
    confirmation = _waiting(conversation, "ls")
    response = api.post(f"/v1/tool-confirmations/{confirmation.id}/approve", {"remember": "agent"}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"
    confirmation.refresh_from_db()
    assert confirmation.status == "pending"


@pytest.mark.parametrize("body", [{"remember": "forever"}, {"remember": 1}, {"pattern": "ls*"},
                                  {"remember": "conversation", "pattern": "ls > x"}])
def test_tool_confirmation_remember_bad_input_is_400(api, conversation, body):
    confirmation = _waiting(conversation, "ls")
    response = api.post(f"/v1/tool-confirmations/{confirmation.id}/approve", body, format="json")
    assert response.status_code == 400 and response.json()["code"] == "invalid_input"
    confirmation.refresh_from_db()
    assert confirmation.status == "pending"
