"""The admin console: agent duplicate, read-only conversations and run timelines, and
confirmation decisions that go through the same service as the owner's (so the run wakes)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents_app.models import Agent
from chat_app.models import Conversation, Message, Run, RunEvent
from core.errors import Forbidden
from tools_app import services as tool_services
from tools_app.models import ToolConfirmation

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model, agents):
    admin = django_user_model.objects.create_superuser(username="root", password="pw-root")
    client.force_login(admin)
    client.admin = admin
    return client


@pytest.fixture
def waiting(user):
    conversation = Conversation.objects.create(owner=user, title="needs a person")
    run = Run.objects.create(conversation=conversation, engine="mock", status=Run.Status.RUNNING,
                             lease_expires_at=timezone.now() + timedelta(minutes=5))
    return [ToolConfirmation.objects.create(run=run, tool_call_id=f"call_{i}", tool="write_file",
                                            input={"path": f"{i}.txt"},
                                            expires_at=timezone.now() + timedelta(minutes=5)) for i in range(2)]


@pytest.fixture
def rings(monkeypatch) -> list[tuple[str, str]]:
    rung: list[tuple[str, str]] = []
    monkeypatch.setattr(tool_services, "_ring_sync", lambda run_id, key: rung.append((run_id, key)))
    return rung


def _action(client, url: str, action: str, ids) -> object:
    return client.post(url, {"action": action, "_selected_action": [str(i) for i in ids]}, follow=True)


def test_admin_approve_selected_decides_and_wakes_each_run(admin_client, waiting, rings, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = _action(admin_client, "/admin/tools_app/toolconfirmation/", "approve_selected", [c.id for c in waiting])
    assert response.status_code == 200
    assert "Approved 2 tool call(s)." in response.content.decode()
    for confirmation in waiting:
        confirmation.refresh_from_db()
        assert confirmation.status == "approved" and confirmation.decided_by == admin_client.admin
    assert sorted(key for _, key in rings) == sorted(str(c.id) for c in waiting)


def test_admin_deny_selected_skips_decided_ones(admin_client, waiting, rings, django_capture_on_commit_callbacks):
    ToolConfirmation.objects.filter(id=waiting[0].id).update(status="approved")
    with django_capture_on_commit_callbacks(execute=True):
        response = _action(admin_client, "/admin/tools_app/toolconfirmation/", "deny_selected", [c.id for c in waiting])
    body = response.content.decode()
    assert "Denied 1 tool call(s)." in body and "Skipped 1" in body
    assert ToolConfirmation.objects.get(id=waiting[1].id).status == "denied"
    assert ToolConfirmation.objects.get(id=waiting[0].id).status == "approved"  # the first decision won
    assert [key for _, key in rings] == [str(waiting[1].id)]


def test_admin_decide_needs_staff(user, waiting):
    with pytest.raises(Forbidden):
        tool_services.tool_confirmation_admin_decide(admin=user, confirmation_id=str(waiting[0].id), approved=True)
    assert ToolConfirmation.objects.get(id=waiting[0].id).status == "pending"


def test_admin_confirmations_cannot_be_added(admin_client):
    assert admin_client.get("/admin/tools_app/toolconfirmation/add/").status_code == 403


def test_admin_duplicate_agent_makes_a_disabled_copy(admin_client, agents):
    coder = agents["coder"]
    _action(admin_client, "/admin/agents_app/agent/", "duplicate_selected", [coder.pk])
    _action(admin_client, "/admin/agents_app/agent/", "duplicate_selected", [coder.pk])
    copies = Agent.objects.filter(role__startswith="coder_copy").order_by("role")
    assert [a.role for a in copies] == ["coder_copy", "coder_copy2"]
    copy = copies[0]
    assert copy.enabled is False and copy.display_name.endswith("(copy)")
    assert copy.system_prompt == coder.system_prompt and copy.allowed_tools == coder.allowed_tools
    assert Agent.objects.get(pk=coder.pk).enabled  # the original is untouched


def test_admin_agent_list_filters_and_search(admin_client):
    body = admin_client.get("/admin/agents_app/agent/", {"q": "研发效能"}).content.decode()
    assert "dev_efficiency_analyst" in body and "coder" not in body.split("result_list")[1]
    assert admin_client.get("/admin/agents_app/agent/", {"engine": "claude"}).status_code == 200


def test_admin_conversation_shows_messages_and_runs_read_only(admin_client, user):
    conversation = Conversation.objects.create(owner=user, title="复盘")
    run = Run.objects.create(conversation=conversation, engine="mock", provider="local", status="succeeded")
    Message.objects.create(conversation=conversation, run=run, role="user", content="what happened in sprint 12?")
    RunEvent.objects.create(run=run, seq=1, event="agent.start", at=timezone.now(), payload={"engine": "mock"})
    page = admin_client.get(f"/admin/chat_app/conversation/{conversation.id}/change/").content.decode()
    assert "what happened in sprint 12?" in page
    assert 'name="messages-0-content"' not in page  # shown, not editable
    timeline = admin_client.get(f"/admin/chat_app/run/{run.id}/change/").content.decode()
    assert "agent.start" in timeline and "&quot;engine&quot;: &quot;mock&quot;" in timeline
    found = admin_client.get("/admin/chat_app/conversation/", {"q": "sprint 12"}).content.decode()
    assert found.count(f"/admin/chat_app/conversation/{conversation.id}/change/") == 1
