"""The providers file and load_providers; GET /v1/providers, /v1/providers/<name>, recommend; /health; admin."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agents_app.models import Budget, Provider, ProviderModel, RoutingRule

from .conftest import anthropic_provider, model

pytestmark = pytest.mark.django_db
REPO = Path(__file__).resolve().parents[2]


def test_load_providers_shipped_file_is_valid_and_idempotent(agents):
    call_command("load_providers", file=str(REPO / "providers.yaml"))
    first = sorted(Provider.objects.values_list("name", "kind", "base_url", "api_key_env"))
    models = ProviderModel.objects.count()
    call_command("load_providers", file=str(REPO / "providers.yaml"))
    assert sorted(Provider.objects.values_list("name", "kind", "base_url", "api_key_env")) == first
    assert ProviderModel.objects.count() == models
    names = {p[0] for p in first}
    assert {"anthropic", "zai", "moonshot", "deepseek", "qwen", "ollama"} <= names
    assert RoutingRule.objects.count() == 5


def test_load_providers_removes_what_the_file_dropped_and_keeps_admin_rows(load, servers):
    Provider.objects.create(name="handmade", kind="anthropic", api_key_env="X")
    load(providers=[anthropic_provider("a", servers["a"].url, model("m1"), model("m2")),
                    anthropic_provider("b", servers["b"].url, model("m3"))],
         rules=[{"name": "r", "keywords": ["x"], "tier": "fast"}], budgets=[{"name": "d", "max_tokens": 5}])
    load(providers=[anthropic_provider("a", servers["a"].url, model("m1"))])
    assert sorted(Provider.objects.values_list("name", flat=True)) == ["a", "handmade"]
    assert list(ProviderModel.objects.values_list("name", flat=True)) == ["m1"]
    assert not RoutingRule.objects.exists() and not Budget.objects.exists()


@pytest.mark.parametrize("text, message", [
    ("providers: [", "not valid YAML"),
    ("providers: {}\nextra: 1", "unknown top-level key(s) extra"),
    ("providers:\n  - {name: a, kind: anthropic}", "api_key_env is required"),
    ("providers:\n  - {name: a, kind: nope, api_key_env: K}", "'nope' is not one of"),
    ("providers:\n  - {name: a, api_key_env: K, api_key: sk-123}", "unknown key(s) api_key"),
    ("providers:\n  - {name: a, api_key_env: 'not a var'}", "is not an environment variable name"),
    ("providers:\n  - {name: a, api_key_env: K, models: [{name: m, tier: huge}]}", "'huge' is not one of"),
    ("providers:\n  - {name: a, api_key_env: K, models: [{name: m, input_price: -1}]}", "must not be negative"),
    ("providers:\n  - {name: a, api_key_env: K}\n  - {name: a, api_key_env: K}", "listed twice"),
    ("routing:\n  rules:\n    - {name: r, tier: fast}", "needs keywords and/or min_tokens"),
    ("routing:\n  rules:\n    - {name: r, keywords: [x]}", "needs a tier and/or a tag"),
    ("budgets:\n  - {name: b}", "needs max_tokens and/or max_cost"),
    ("budgets:\n  - {name: b, max_tokens: 5, user: nobody}", "no user 'nobody'"),
])
def test_load_providers_bad_file_is_a_readable_error_and_changes_nothing(tmp_path, agents, text, message):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(CommandError, match=None) as exc:
        call_command("load_providers", file=str(path))
    assert message in str(exc.value)
    assert not Provider.objects.exists()


def test_load_providers_missing_file(tmp_path, agents, capsys):
    with pytest.raises(CommandError, match="cannot read"):
        call_command("load_providers", file=str(tmp_path / "none.yaml"))
    call_command("load_providers", file=str(tmp_path / "none.yaml"), if_exists=True)
    assert "No providers file" in capsys.readouterr().out


def test_providers_api_lists_status_without_keys(api, three):
    response = api.get("/v1/providers")
    assert response.status_code == 200
    body = response.json()["providers"]
    by_name = {p["name"]: p for p in body}
    assert {"a", "b", "c", "anthropic", "ollama"} <= set(by_name)
    a = by_name["a"]
    assert a["apiKeyEnv"] == "A_KEY" and a["status"] == "healthy" and a["models"][0]["price"]["input"] == "1.0000"
    for key in ("latencyMs", "recentErrors", "rateLimited", "cooldownUntil", "checkedAt"):
        assert key in a
    assert "secret" not in json.dumps(response.json())  # the keys' values never appear
    assert by_name["anthropic"]["status"] == "unavailable"


def test_providers_api_detail_checks_now_and_unknown_is_404(api, three):
    assert api.get("/v1/providers/a").json()["status"] == "healthy"
    three["a"].models_status = 500
    body = api.get("/v1/providers/a").json()
    assert body["status"] == "unhealthy" and "HTTP 500" in body["reason"]
    response = api.get("/v1/providers/nope")
    assert response.status_code == 404 and response.json()["code"] == "provider_not_found"


def test_providers_api_needs_authentication(db):
    from rest_framework.test import APIClient

    assert APIClient().get("/v1/providers").status_code in (401, 403)
    assert APIClient().post("/v1/providers/recommend", {"task": "x"}, format="json").status_code in (401, 403)


def test_recommend_returns_route_and_rationale(api, three):
    body = api.post("/v1/providers/recommend", {"task": "Fix the lint errors", "agentRole": "dev_efficiency_analyst"},
                    format="json").json()
    assert body["provider"] == "a" and body["engine"] == "claude" and body["rationale"]
    assert body["fallbacks"] == ["b/model-b", "c/model-c"]


@pytest.mark.parametrize("payload, status, code", [
    ({}, 400, None), ([1, 2], 400, "invalid_input"), ({"task": "x", "provider": "nope"}, 400, "unknown_provider"),
    ({"task": "x", "agentRole": "ghost"}, 404, None), ({"task": "x", "model": "nope"}, 400, "unknown_model"),
])
def test_recommend_bad_input(api, three, payload, status, code):
    payload = {"agentRole": "dev_efficiency_analyst", **payload} if isinstance(payload, dict) and payload else payload
    response = api.post("/v1/providers/recommend", payload, format="json")
    assert response.status_code == status and "message" in response.json()
    if code:
        assert response.json()["code"] == code


@pytest.mark.django_db(transaction=True)  # the streaming view reads the token from another thread
def test_agent_chat_unknown_provider_is_400(api, agents):
    response = api.post("/v1/agent/chat", {"input": "hi", "provider": "nope"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "unknown_provider"


def test_health_shows_provider_status_only(client, three):
    body = client.get("/health").json()
    providers = {p["name"]: p for p in body["providers"]}
    assert providers["a"]["status"] == "healthy" and set(providers["a"]) == {
        "name", "kind", "status", "latencyMs", "recentErrors", "rateLimited", "cooldownUntil"}


def test_admin_provider_and_usage_pages(admin_client, three):
    assert admin_client.get("/admin/agents_app/provider/").status_code == 200
    row = Provider.objects.get(name="a")
    page = admin_client.get(f"/admin/agents_app/provider/{row.pk}/change/")
    assert page.status_code == 200 and b"key-a_key-secret" not in page.content
    assert admin_client.get("/admin/chat_app/runusage/").status_code == 200
    assert admin_client.get("/admin/agents_app/routingrule/").status_code == 200
    assert admin_client.get("/admin/agents_app/budget/").status_code == 200


def test_registry_cache_is_cleared_when_a_provider_is_saved(settings, three):
    from agents_app.providers.registry import provider_registry

    settings.AGENT_CACHE_SECONDS = 60
    assert provider_registry().get("d") is None
    row = Provider.objects.create(name="d", kind="anthropic", api_key_env="A_KEY")
    assert provider_registry().get("d") is not None
    row.enabled = False
    row.save()
    assert provider_registry().get("d") is None
    # Implicit providers follow the settings even from the cache.
    settings.ANTHROPIC_API_KEY = "now-set"
    assert provider_registry().get("anthropic").unavailable_reason() is None


def test_file_anthropic_without_its_key_leaves_the_env_provider_in_charge(agents, settings, monkeypatch):
    from agents_app.router import route_run

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    call_command("load_providers", file=str(REPO / "providers.yaml"))
    settings.ANTHROPIC_API_KEY = "gateway-token"  # as ANTHROPIC_AUTH_TOKEN sets it
    settings.ANTHROPIC_MODEL = "saas/claude-sonnet-4.5"
    route = route_run(agent=agents["dev_efficiency_analyst"], task="Fix the lint errors")
    assert (route.engine, route.provider) == ("claude", "anthropic")
    assert route.model == (agents["dev_efficiency_analyst"].model or "saas/claude-sonnet-4.5")
    assert route.candidates[0][0].implicit


def test_file_anthropic_accepts_the_env_model_when_its_key_is_set(agents, settings, monkeypatch):
    from agents_app.router import route_run

    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    call_command("load_providers", file=str(REPO / "providers.yaml"))
    agent = agents["dev_efficiency_analyst"]
    agent.model = "saas/claude-sonnet-4.5"
    route = route_run(agent=agent, task="hello")
    assert (route.provider, route.model) == ("anthropic", "saas/claude-sonnet-4.5")
    assert not route.candidates[0][0].implicit
    assert route_run(agent=agent, task="Fix the lint errors").model == "claude-haiku-4-5"


def test_provider_without_models_list_is_still_healthy(api, three):
    three["a"].models_status = 404
    assert api.get("/v1/providers/a").json()["status"] == "healthy"
    three["a"].models_status = 401
    assert api.get("/v1/providers/a").json()["status"] == "unhealthy"
