"""Health, cooldown and failover against scripted Anthropic-compatible servers."""
from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from agents_app.providers import health
from chat_app import services
from chat_app.models import Run
from tests.conftest import wait_for
from tests.fakes.anthropic_server import http_error, mid_stream_error, text_reply

from .conftest import anthropic_provider, model

pytestmark = pytest.mark.django_db(transaction=True)
AGENT = "dev_efficiency_analyst"  # a claude agent


async def _run(user, text="hello", **kwargs):
    created = await services.run_start(user=user, input=text, agent_role=AGENT, **kwargs)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    run = await Run.objects.aget(id=created.run.id)
    return created, events, run


def _attempts(events):
    return [e.payload for e in events if e.event == "provider.attempt"]


async def test_failover_from_529_before_output_records_both_attempts(user, three):
    three["a"].script(http_error(529))
    three["b"].script(text_reply(["from ", "b"]))
    created, events, run = await _run(user)
    assert created.run.provider == "a" and "fallbacks: b/model-b" in created.run.route_note
    assert run.status == "succeeded" and run.provider == "b" and run.model == "model-b"
    text = "".join(e.payload["text"] for e in events if e.event == "agent.delta")
    assert text == "from b"
    attempts = _attempts(events)
    assert [(a["provider"], a["model"], a["status"]) for a in attempts] == [
        ("a", "model-a", "failed"), ("b", "model-b", "succeeded")]
    assert attempts[0]["errorCode"] == "provider_overloaded" and attempts[0]["next"] == "b/model-b"
    assert all(isinstance(a["durationMs"], float) for a in attempts)
    # The SDK did not retry the 529 on a (ANTHROPIC_MAX_RETRIES=2): the router is the one retry loop.
    assert len(three["a"].requests_to("/v1/messages")) == 1
    assert three["b"].last_request.json["model"] == "model-b"
    assert three["b"].last_request.api_key == "key-b_key-secret"
    # The timeline keeps them.
    timeline = await sync_to_async(lambda: list(run.events.filter(event="provider.attempt").values_list("payload", flat=True)))()
    assert [t["provider"] for t in timeline] == ["a", "b"]


async def test_no_failover_after_output(user, three):
    three["a"].script(mid_stream_error(text_reply(["Hel", "lo"]), after=None))
    created, events, run = await _run(user)
    assert run.status == "failed" and run.provider == "a"
    text = "".join(e.payload["text"] for e in events if e.event == "agent.delta")
    assert text == "Hel"  # what a sent, once; nothing from another provider
    assert not three["b"].requests_to("/v1/messages") and not three["c"].requests_to("/v1/messages")
    end = events[-1].payload
    assert end["errorCode"] == "provider_overloaded" and "No failover" in end["error"]


async def test_no_failover_after_a_tool_ran(user, three):
    from tests.fakes.anthropic_server import tool_use_reply

    three["a"].script(tool_use_reply("list_files", {"path": "."}), http_error(529))
    created, events, run = await _run(user)
    assert run.status == "failed"
    assert not three["b"].requests_to("/v1/messages")
    assert any(e.event == "tool.state" for e in events)


async def test_last_candidate_keeps_sdk_retries(user, servers, load, settings):
    settings.ANTHROPIC_MAX_RETRIES = 1
    await sync_to_async(load)(providers=[anthropic_provider("a", servers["a"].url, model("model-a"))])
    servers["a"].script(http_error(529, retry_after_ms=1), text_reply("second try"))
    created, events, run = await _run(user)
    assert run.status == "succeeded" and events[-1].payload["text"] == "second try"
    assert len(servers["a"].requests_to("/v1/messages")) == 2
    assert not _attempts(events)  # no failover happened


async def test_dead_provider_is_marked_unhealthy_and_skipped(user, servers, load, dead_url, api):
    await sync_to_async(load)(providers=[anthropic_provider("dead", dead_url, model("model-x"), priority=1, api_key_env="A_KEY"),
                    anthropic_provider("b", servers["b"].url, model("model-b"), priority=20)])
    created, events, run = await _run(user)
    assert run.status == "succeeded" and run.provider == "b"
    assert "skipped dead (unhealthy: unreachable" in created.run.route_note
    status = await sync_to_async(lambda: {p["name"]: p for p in api.get("/v1/providers").json()["providers"]})()
    assert status["dead"]["status"] == "unhealthy" and status["b"]["status"] == "healthy"
    assert status["b"]["latencyMs"] is not None


async def test_429_with_retry_after_cools_down_then_comes_back(user, three, api):
    three["a"].script(http_error(429, retry_after=1))
    _, events, run = await _run(user)
    assert run.status == "succeeded" and run.provider == "b"
    assert _attempts(events)[0]["errorCode"] == "rate_limited" and _attempts(events)[0]["retryAfter"] == 1.0
    status = await sync_to_async(lambda: {p["name"]: p for p in api.get("/v1/providers").json()["providers"]})()
    assert status["a"]["status"] == "cooling_down" and status["a"]["rateLimited"] is True
    assert status["a"]["cooldownUntil"] and status["a"]["recentErrors"] == 1
    # While cooling down, a is skipped.
    created, _, run = await _run(user)
    assert run.provider == "b" and "skipped a (cooling down until" in created.run.route_note
    assert len(three["a"].requests_to("/v1/messages")) == 1
    # After Retry-After, a takes runs again.
    await wait_for(lambda: health.cooldown_until("a") is None, timeout=5)
    created, _, run = await _run(user)
    assert run.provider == "a" and run.status == "succeeded" and "skipped" not in created.run.route_note


async def test_quota_429_is_not_retried(user, three):
    three["a"].script(http_error(429, "You exceeded your current quota, please check your plan and billing details."))
    _, events, run = await _run(user)
    assert run.status == "failed" and events[-1].payload["errorCode"] == "quota_exhausted"
    assert not three["b"].requests_to("/v1/messages")


async def test_repeated_failures_cool_a_provider_down(user, three, settings):
    settings.PROVIDER_FAILURE_THRESHOLD = 2
    for _ in range(2):
        three["a"].script(http_error(500, should_retry=False))
        _, _, run = await _run(user)
        assert run.provider == "b"
    assert health.cooldown_until("a") is not None
    created, _, _ = await _run(user)
    assert "skipped a (cooling down" in created.run.route_note and "2 failures in a row" in created.run.route_note


async def test_all_candidates_failing_ends_with_readable_error(user, three):
    for name in ("a", "b", "c"):
        three[name].script(http_error(529, should_retry=False, times=3))
    _, events, run = await _run(user)
    assert run.status == "failed" and events[-1].payload["errorCode"] == "provider_overloaded"
    assert [a["provider"] for a in _attempts(events)] == ["a", "b", "c"]
    assert "(attempt 3 of 3, on c/model-c)" in events[-1].payload["error"]


async def test_ollama_provider_override_runs_on_ollama(user, servers, load, ollama_server):
    await sync_to_async(load)(providers=[anthropic_provider("a", servers["a"].url, model("model-a")),
                    {"name": "local-ollama", "kind": "ollama", "base_url": ollama_server.url,
                     "models": [model("llama-x", tier="fast")]}])
    created, events, run = await _run(user, provider="local-ollama")
    assert created.run.engine == "ollama" and run.provider == "local-ollama" and run.status == "succeeded"
    assert ollama_server.chat_requests() and not servers["a"].requests_to("/v1/messages")
    assert run.cost == 0


async def test_dead_ollama_provider_is_unhealthy(user, servers, load, dead_url, api):
    await sync_to_async(load)(providers=[{"name": "local-ollama", "kind": "ollama", "base_url": dead_url, "models": [model("m")]}])
    status = await sync_to_async(lambda: {p["name"]: p for p in api.get("/v1/providers").json()["providers"]})()
    assert status["local-ollama"]["status"] == "unhealthy"
