"""Routing rules, the explicit overrides and their rationale; ACP --provider."""
from __future__ import annotations

import pytest

from agents_app.models import Agent
from agents_app.router import route_run
from core.errors import ApplicationError, InvalidInput

from .conftest import anthropic_provider, model

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalogue(servers, load):
    """The seed's picture: fast/cheap, long-context, code, balanced and top models on three providers."""
    load(providers=[
        anthropic_provider("a", servers["a"].url, model("haiku", tier="fast", tags=["cheap"], input_price=1, output_price=5),
                           model("sonnet", tier="balanced", input_price=3, output_price=15),
                           model("opus", tier="top", input_price=5, output_price=25), priority=10),
        anthropic_provider("b", servers["b"].url, model("kimi", tier="balanced", tags=["long_context"], context_window=262144,
                                                        input_price=0.6, output_price=2.5), priority=20),
        anthropic_provider("c", servers["c"].url, model("deepseek", tier="balanced", tags=["code"], input_price=0.3,
                                                        output_price=1.2),
                           model("glm", tier="fast", tags=["cheap", "code"], input_price=0.6, output_price=2.2), priority=30),
    ])
    return servers


@pytest.fixture
def agent(agents) -> Agent:
    return agents["dev_efficiency_analyst"]


@pytest.mark.parametrize("task, expected, reason", [
    ("Fix the lint errors in utils.py", ("a", "haiku"), "rule simple (keyword 'lint') -> tier fast"),
    ("Please format this file", ("a", "haiku"), "rule simple (keyword 'format') -> tier fast"),
    ("Refactor the payment module", ("c", "deepseek"), "rule code (keyword 'refactor') -> tag code"),
    ("Plan the migration to Postgres", ("a", "opus"), "rule top (keyword 'plan') -> tier top"),
    ("Review this pull request", ("a", "opus"), "rule top (keyword 'review') -> tier top"),
    ("Research vector databases", ("a", "opus"), "rule top (keyword 'research') -> tier top"),
    ("Implement the change across multiple files", ("a", "sonnet"), "rule complex (keyword 'multiple files') -> tier balanced"),
])
def test_route_rules_pick_model_with_rationale(catalogue, agent, task, expected, reason):
    route = route_run(agent=agent, task=task)
    assert (route.provider, route.model) == expected
    assert route.note.startswith(f"{expected[0]}/{expected[1]}") and reason in route.note
    assert route.engine == "claude"


def test_route_long_context_takes_long_context_model(catalogue, agent):
    route = route_run(agent=agent, task="Summarise this log:\n" + "x" * 240_000)
    assert (route.provider, route.model) == ("b", "kimi")
    assert "rule long_context (~60" in route.note and "tokens >= 50000) -> tag long_context" in route.note


def test_route_long_context_counts_history(catalogue, agent):
    history = [{"role": "user", "content": "y" * 210_000}]
    route = route_run(agent=agent, task="and now?", history=history)
    assert route.model == "kimi"


def test_route_no_rule_uses_agent_model_when_served(catalogue, agent):
    agent.model = "sonnet"
    route = route_run(agent=agent, task="hello there")
    assert (route.provider, route.model) == ("a", "sonnet") and "no rule matched: agent model sonnet" in route.note


def test_route_keywords_match_whole_words_only(catalogue, agent):
    route = route_run(agent=agent, task="The formatter's information is planar")  # no 'format', 'plan'
    assert "no rule matched" in route.note


def test_route_fallbacks_are_other_providers(catalogue, agent):
    route = route_run(agent=agent, task="Refactor the payment module")
    assert route.fallbacks[0][0] != "c" and {p for p, _ in route.fallbacks} <= {"a", "b"}
    assert "fallbacks: " in route.note


def test_route_provider_override_beats_rules(catalogue, agent):
    route = route_run(agent=agent, task="Fix the lint errors", provider="b")
    assert (route.provider, route.model) == ("b", "kimi")
    assert route.note.startswith("b/kimi; provider b requested") and route.fallbacks == ()


def test_route_model_override_beats_rules(catalogue, agent):
    route = route_run(agent=agent, task="Plan everything", model="glm")
    assert (route.provider, route.model) == ("c", "glm") and "model glm requested" in route.note


def test_route_unknown_provider_is_invalid(catalogue, agent):
    with pytest.raises(InvalidInput) as exc:
        route_run(agent=agent, task="x", provider="nope")
    assert exc.value.code == "unknown_provider" and "a" in exc.value.extra["providers"]


def test_route_unknown_model_is_invalid(catalogue, agent):
    with pytest.raises(InvalidInput) as exc:
        route_run(agent=agent, task="x", model="gpt-17")
    assert exc.value.code == "unknown_model"


def test_route_pinned_provider_without_key_is_unavailable(catalogue, agent, monkeypatch):
    monkeypatch.delenv("B_KEY")
    with pytest.raises(ApplicationError) as exc:
        route_run(agent=agent, task="x", provider="b")
    assert exc.value.status == 503 and exc.value.code == "provider_unavailable"


def test_route_provider_without_key_is_left_out(catalogue, agent, monkeypatch):
    monkeypatch.delenv("A_KEY")
    route = route_run(agent=agent, task="Fix the lint errors")
    assert (route.provider, route.model) == ("c", "glm")


def test_route_rules_from_the_file_replace_the_defaults(servers, load, agent):
    load(providers=[anthropic_provider("a", servers["a"].url, model("small", tier="fast"), model("big", tier="top"))],
         rules=[{"name": "docs", "keywords": ["docstring"], "tier": "top"}])
    assert route_run(agent=agent, task="write a docstring").model == "big"
    # The default 'simple' rule is gone: no rule matches 'lint' now.
    assert "no rule matched" in route_run(agent=agent, task="lint it").note


def test_route_without_providers_keeps_env_configuration(agents, settings):
    settings.ANTHROPIC_API_KEY = "k"
    settings.ANTHROPIC_MODEL = "claude-env"
    agent = agents["dev_efficiency_analyst"]
    route = route_run(agent=agent, task="Fix the lint errors")
    assert (route.engine, route.provider, route.model) == ("claude", "anthropic", agent.model or "claude-env")
    assert route.fallbacks == ()


def test_route_without_any_key_falls_back_to_mock(agents):
    route = route_run(agent=agents["dev_efficiency_analyst"], task="hi")
    assert route.engine == "mock" and route.note.startswith("claude unavailable (")


def test_acp_provider_option_is_checked_against_the_registry(catalogue, monkeypatch):
    from django.core.management.base import CommandError

    from chat_app.management.commands.acp import _check_provider

    _check_provider("b")
    with pytest.raises(CommandError, match="Unknown provider 'zzz'; known: a, b, c"):
        _check_provider("zzz")
    monkeypatch.delenv("C_KEY")
    with pytest.raises(CommandError, match="C_KEY is not set"):
        _check_provider("c")


@pytest.mark.django_db(transaction=True)
async def test_acp_provider_option_pins_the_provider(catalogue, user):
    from asgiref.sync import sync_to_async

    from chat_app import services
    from chat_app.models import Run

    # What ACP's session/prompt does with --provider: options["provider"].
    created = await services.run_start(user=user, input="Fix the lint errors", agent_role="dev_efficiency_analyst",
                                       options={"provider": "b"})
    [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    run = await Run.objects.aget(id=created.run.id)
    assert run.provider == "b" and run.model == "kimi" and run.status == "succeeded"
    assert await sync_to_async(lambda: catalogue["b"].requests_to("/v1/messages"))()


def test_route_short_model_name_picks_the_catalogued_model(catalogue, agent):
    route = route_run(agent=agent, task="Plan everything", model="haiku")
    assert (route.provider, route.model) == ("a", "haiku")
    route = route_run(agent=agent, task="x", model="kim")
    assert route.model == "kimi" and "model kim (kimi) requested" in route.note


def test_route_ollama_without_listed_models_uses_the_agents_model(servers, load, agents, ollama_server, settings):
    load(providers=[{"name": "ollama", "kind": "ollama", "base_url": ollama_server.url}])
    agent = agents["coder"]  # an ollama agent
    route = route_run(agent=agent, task="Fix the lint errors")
    assert route.engine == "ollama" and route.provider == "ollama"
    assert route.model == (agent.model or settings.OLLAMA_MODEL)
    assert "no rule matched: agent model" in route.note
