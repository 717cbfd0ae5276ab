"""Seed 001 CHAT-010/020 REST, seed-000 basics, auth, ownership isolation and JSON errors."""
from __future__ import annotations

import json

import pytest

from chat_app.models import Conversation, Message

pytestmark = pytest.mark.django_db


def test_conversation_create_empty_body_returns_fields(api):
    response = api.post("/v1/conversations")
    assert response.status_code == 200
    body = response.json()
    assert set(body) >= {"id", "title", "createdAt", "updatedAt"}
    assert Conversation.objects.filter(id=body["id"]).exists()


def test_conversation_create_with_title(api):
    response = api.post("/v1/conversations", {"title": "Sprint review"}, format="json")
    assert response.status_code == 200 and response.json()["title"] == "Sprint review"


def test_conversation_create_wrong_type_is_400_json(api):
    response = api.post("/v1/conversations", {"title": ["not", "a", "string"]}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    assert "title" in response.json()["message"]


def test_conversation_create_malformed_json_is_400(api):
    response = api.generic("POST", "/v1/conversations", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "malformed_json"


def test_conversation_create_unknown_agent_is_404(api):
    response = api.post("/v1/conversations", {"agentRole": "nobody"}, format="json")
    assert response.status_code == 404 and response.json()["code"] == "agent_not_found"


def test_conversation_list_orders_by_updated_desc(api, user):
    first = api.post("/v1/conversations", {"title": "first"}, format="json").json()
    api.post("/v1/conversations", {"title": "second"}, format="json")
    Conversation.objects.get(id=first["id"]).save()  # touch: now the most recently updated
    titles = [c["title"] for c in api.get("/v1/conversations").json()]
    assert titles == ["first", "second"]


def test_conversation_list_is_per_user(api, other_api):
    api.post("/v1/conversations", {"title": "mine"}, format="json")
    assert other_api.get("/v1/conversations").json() == []


def test_messages_ordered_by_created_ascending(api, user):
    conversation = Conversation.objects.create(owner=user)
    for i in range(3):
        Message.objects.create(conversation=conversation, role="user" if i % 2 == 0 else "assistant", content=f"m{i}")
    response = api.get(f"/v1/conversations/{conversation.id}/messages")
    assert response.status_code == 200
    assert [m["content"] for m in response.json()] == ["m0", "m1", "m2"]
    assert set(response.json()[0]) >= {"id", "role", "content", "createdAt", "conversationId"}


def test_messages_of_other_users_conversation_is_404(other_api, user):
    conversation = Conversation.objects.create(owner=user)
    response = other_api.get(f"/v1/conversations/{conversation.id}/messages")
    assert response.status_code == 404
    assert response.json()["code"] == "conversation_not_found"


def test_messages_invalid_id_is_404_not_500(api):
    assert api.get("/v1/conversations/not-a-uuid/messages").status_code == 404


def test_timeline_unknown_run_has_code(api):
    response = api.get("/v1/agent/runs/00000000-0000-0000-0000-000000000000/timeline")
    assert response.status_code == 404
    assert response.json()["code"] == "run_timeline_not_found"


def test_api_requires_auth_401_json(client, agents):
    response = client.get("/v1/conversations")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_api_bad_token_401(client, agents):
    response = client.get("/v1/conversations", HTTP_AUTHORIZATION="Token nope")
    assert response.status_code == 401 and response.json()["code"] == "authentication_failed"


def test_api_accepts_bearer_token(client, token):
    response = client.get("/v1/conversations", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200


def test_api_method_not_allowed_405_json(api):
    response = api.delete("/v1/conversations")
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"


def test_unknown_path_404_json(api):
    response = api.get("/v1/nothing-here")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_oversized_body_413_json(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("/v1/conversations", {"title": "x" * 5000}, format="json")
    assert response.status_code == 413 and response.json()["code"] == "request_too_large"


def test_health_lists_agents_tools_and_engines(client, agents):
    for path in ("/health", "/api/v1/health"):
        body = client.get(path).json()
        assert body["status"] == "ok"
        assert body["agent_count"] == 4
        assert {"bash", "read_file", "write_file", "web_fetch"} <= set(body["tools"])
        assert body["engines"]["claude"]["live"] is False and body["engines"]["claude"]["fallback"] == "mock"
        assert body["engines"]["mock"]["live"] is True


def test_agents_list_has_seed000_fields(api):
    agents = {a["role"]: a for a in api.get("/api/v1/agents").json()}
    assert set(agents) == {"orchestrator", "coder", "researcher", "dev_efficiency_analyst"}
    analyst = agents["dev_efficiency_analyst"]
    assert analyst["name"] == "研发效能分析师"
    assert analyst["workspace"].endswith("dev_efficiency_analyst")
    assert {"role", "name", "description", "workspace", "engine", "model"} <= set(analyst)


def test_openapi_schema_title_and_version(client, agents):
    response = client.get("/api/schema", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["info"]["title"] == "AI Agent Orchestrator"
    assert schema["info"]["version"] == "2.0.0"
    assert "/v1/conversations" in schema["paths"]


def test_docs_served_without_cdn(client, agents):
    response = client.get("/docs")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html


def test_token_cache_revocation_takes_effect_at_once(settings, user, token):
    """Cached token lookups (AUTH_TOKEN_CACHE_SECONDS) still honour a deleted token or a
    deactivated user on the next request."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    settings.AUTH_TOKEN_CACHE_SECONDS = 60
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/v1/conversations").status_code == 200
    assert client.get("/v1/conversations").status_code == 200  # from the cache
    user.is_active = False
    user.save()
    assert client.get("/v1/conversations").status_code == 401
    user.is_active = True
    user.save()
    assert client.get("/v1/conversations").status_code == 200
    Token.objects.filter(key=token).get().delete()
    assert client.get("/v1/conversations").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_an_expired_token_is_reloaded_in_the_background_and_a_revocation_elsewhere_then_refused(
        settings, user, token, caplog):
    """Past AUTH_TOKEN_CACHE_SECONDS the cached user is served once more while a background
    thread reloads it; a token deleted meanwhile (as by another process: no signal here) is
    dropped by that reload, and the next request is refused. The token never reaches the log."""
    import time

    from django.db import connection
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from orchestrator_site import auth

    settings.AUTH_TOKEN_CACHE_SECONDS = 60
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/v1/conversations").status_code == 200
    with connection.cursor() as cursor:  # as another process would: no delete signal here
        cursor.execute(f"DELETE FROM {Token._meta.db_table} WHERE key = %s", [token])
    assert client.get("/v1/conversations").status_code == 200  # within the TTL: still cached
    expires, cached = auth._TOKENS._entries[token]
    auth._TOKENS._entries[token] = (time.monotonic() - 1, cached)
    assert client.get("/v1/conversations").status_code == 200  # expired: served once more, reloading
    auth._TOKENS.drain()
    deadline = time.monotonic() + 10
    while token in auth._TOKENS._entries and time.monotonic() < deadline:
        auth._TOKENS.drain()
    assert token not in auth._TOKENS._entries
    assert client.get("/v1/conversations").status_code == 401
    assert "reloading auth token" in caplog.text
    assert token not in caplog.text


def test_agent_cache_sees_an_admin_edit_and_a_claude_md_edit(settings, agents):
    from agents_app.selectors import agent_for_run

    settings.AGENT_CACHE_SECONDS = 60
    agent = agents["coder"]
    _, spec = agent_for_run(role="coder")
    assert agent_for_run(role="coder")[1] is spec  # cached
    agent.system_prompt = "You are edited."
    agent.save()
    _, edited = agent_for_run(role="coder")
    assert edited.system_prompt.startswith("You are edited.")
    agent.workspace_path.mkdir(parents=True, exist_ok=True)
    (agent.workspace_path / "CLAUDE.md").write_text("Workspace rule one.")
    assert "Workspace rule one." in agent_for_run(role="coder")[1].system_prompt


def test_each_request_gets_its_own_copy_of_a_cached_token_user(django_user_model):
    """The token cache hands out copies: what one request sets on its user (a permission cache, a
    related object, the model state) reaches neither the cached user nor another request's copy."""
    from orchestrator_site.auth import _copy_user

    user = django_user_model.objects.create_user("copied", password="x")
    user._state.fields_cache["marker"] = "cached"
    first, second = _copy_user(user), _copy_user(user)
    assert type(first) is type(user) and first.pk == user.pk and first.username == "copied"
    assert first == user and first.is_authenticated and first._state.db == user._state.db
    first._perm_cache = {"app.change_thing"}
    first._state.fields_cache["marker"] = "changed"
    first._state.adding = True
    first.username = "renamed"
    assert not hasattr(user, "_perm_cache") and not hasattr(second, "_perm_cache")
    assert user._state.fields_cache["marker"] == second._state.fields_cache["marker"] == "cached"
    assert user._state.adding is False and second._state.adding is False
    assert user.username == second.username == "copied"
