"""The router's remembered decision (ROUTE_MEMO_SECONDS): reused only while nothing it read changed."""
from __future__ import annotations

import pytest

from agents_app import router
from agents_app.models import Agent
from agents_app.providers import health
from agents_app.router import route_run

from .conftest import anthropic_provider, model

pytestmark = pytest.mark.django_db


@pytest.fixture
def decisions(settings, monkeypatch) -> list[str]:
    """The registry kept between calls (as in a server), and every full decision counted."""
    settings.AGENT_CACHE_SECONDS = 60
    settings.ROUTE_MEMO_SECONDS = 60
    made: list[str] = []
    decide = router._decide

    def counted(*args, **kwargs):
        route = decide(*args, **kwargs)
        made.append(f"{route.provider}/{route.model}")
        return route

    monkeypatch.setattr(router, "_decide", counted)
    return made


@pytest.fixture
def agent(agents) -> Agent:
    return agents["dev_efficiency_analyst"]


@pytest.fixture
def two(servers, load):
    """a (priority 10) and b (20) both serve 'sonnet' (catalogued: rules apply without a model)."""
    load(providers=[anthropic_provider("a", servers["a"].url, model("sonnet"), model("haiku", tier="fast"), priority=10),
                    anthropic_provider("b", servers["b"].url, model("sonnet"), priority=20)])
    return servers


def test_the_same_request_shape_reuses_the_decision(two, agent, decisions):
    first = route_run(agent=agent, task="hello", model="sonnet")
    # Its first probes of a and b changed what health knows: it decided again on their answers.
    assert decisions == ["a/sonnet", "a/sonnet"]
    again = route_run(agent=agent, task="another question entirely", model="sonnet")
    assert again is first and len(decisions) == 2
    assert route_run(agent=agent, task="hello", model="haiku").model == "haiku"  # another key
    assert decisions[2:] == ["a/haiku"]


def test_a_provider_failure_forgets_it_at_once(two, agent, decisions):
    assert route_run(agent=agent, task="hi", model="sonnet").provider == "a"
    health.provider_failure(name="a", code="provider_unreachable", message="down")
    route = route_run(agent=agent, task="hi", model="sonnet")
    assert route.provider == "b" and "skipped a (cooling down" in route.note
    # While a provider cools down nothing is remembered: its cooldown ends by the clock alone.
    route_run(agent=agent, task="hi", model="sonnet")
    assert decisions[-3:] == ["a/sonnet", "b/sonnet", "b/sonnet"]


def test_a_probe_with_a_new_answer_forgets_it(two, agent, decisions):
    assert route_run(agent=agent, task="hi", model="sonnet").provider == "a"
    two["a"].close()  # a stops answering; its next probe says so
    health.PROBE.forget("a")
    route = route_run(agent=agent, task="hi", model="sonnet")
    assert route.provider == "b" and "unhealthy" in route.note


def test_a_probe_that_runs_out_is_asked_again_once_the_decision_runs_out(two, agent, decisions):
    assert route_run(agent=agent, task="hi", model="sonnet").provider == "a"
    two["a"].close()
    stamp, result = health.PROBE._results["a"]
    health.PROBE._results["a"] = (stamp - 3600, result)  # its PROVIDER_HEALTH_TTL ran out
    assert route_run(agent=agent, task="hi", model="sonnet").provider == "a"  # remembered meanwhile
    for key, (registry, _, route) in list(router._MEMO.items()):
        router._MEMO[key] = (registry, 0.0, route)  # ... for ROUTE_MEMO_SECONDS at most
    route = route_run(agent=agent, task="hi", model="sonnet")
    assert route.provider == "b" and "unhealthy" in route.note


def test_rules_read_the_task_so_a_request_without_a_model_is_decided_each_time(two, agent, decisions):
    assert route_run(agent=agent, task="Fix the lint errors").model == "haiku"  # rule simple -> tier fast
    assert route_run(agent=agent, task="Implement the feature").model == "sonnet"  # rule complex -> balanced
    assert route_run(agent=agent, task="Fix the lint errors").model == "haiku"
    assert len(decisions) == 3


def test_the_context_size_is_part_of_the_key(servers, load, agent, decisions):
    load(providers=[anthropic_provider("a", servers["a"].url, model("small", context_window=1000), priority=10),
                    anthropic_provider("b", servers["b"].url, model("small", context_window=200000), priority=20)])
    short = route_run(agent=agent, task="hi", model="small")
    decisions.clear()
    assert route_run(agent=agent, task="hello", model="small") is short  # fits the same windows
    long = route_run(agent=agent, task="x" * 8000, model="small")  # ~2,000 tokens: a's window no longer fits
    assert long is not short and len(decisions) == 1
    assert short.fallbacks == (("b", "small"),) and long.fallbacks == (("b", "small"),)


def test_a_key_set_in_the_environment_is_seen_at_once(two, agent, decisions, monkeypatch):
    monkeypatch.delenv("A_KEY")
    assert route_run(agent=agent, task="hi", model="sonnet").provider == "b"
    monkeypatch.setenv("A_KEY", "now-set")
    assert route_run(agent=agent, task="hi", model="sonnet").provider == "a"


def test_a_setting_change_or_a_saved_provider_forgets_it(two, agent, decisions, settings):
    from agents_app.models import Provider

    route_run(agent=agent, task="hi", model="sonnet")
    decisions.clear()
    settings.PROVIDER_MAX_ATTEMPTS = 1
    assert route_run(agent=agent, task="hi", model="sonnet").fallbacks == ()
    Provider.objects.get(name="a").save()  # a save clears the registry: a new snapshot, a new key
    route_run(agent=agent, task="hi", model="sonnet")
    route_run(agent=agent, task="hi", model="sonnet")  # remembered again
    assert len(decisions) == 2


def test_budgets_and_spend_limits_are_never_remembered(servers, load, agent, decisions):
    load(providers=[anthropic_provider("a", servers["a"].url, model("sonnet"), spend_limit=5)])
    route_run(agent=agent, task="hi", model="sonnet")
    route_run(agent=agent, task="hi", model="sonnet")
    assert len(decisions) == 2


def test_zero_seconds_turns_it_off(two, agent, decisions, settings):
    settings.ROUTE_MEMO_SECONDS = 0
    route_run(agent=agent, task="hi", model="sonnet")
    route_run(agent=agent, task="hi", model="sonnet")
    assert len(decisions) == 2
