"""Cost per provider and model, GET /v1/usage, budgets and spend limits."""
from __future__ import annotations

from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from genai_prices import Usage, calc_price

from chat_app import services
from chat_app.models import Run
from core.errors import ApplicationError
from tests.fakes.anthropic_server import http_error, mid_stream_error, stall, text_reply

from .conftest import anthropic_provider, model

pytestmark = pytest.mark.django_db(transaction=True)
AGENT = "dev_efficiency_analyst"
USAGE = {"input_tokens": 1000, "output_tokens": 500, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 100}


async def _run(user, text="hello", **kwargs) -> Run:
    created = await services.run_start(user=user, input=text, agent_role=AGENT, **kwargs)
    [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    return await Run.objects.aget(id=created.run.id)


@pytest.fixture
def priced(servers, load):
    """a: prices from the file; deepseek: prices from genai-prices (not in the file)."""
    load(providers=[
        anthropic_provider("a", servers["a"].url, model("model-a", input_price=1.0, output_price=5.0,
                                                        cache_read_price=0.1, cache_write_price=1.25)),
        anthropic_provider("deepseek", servers["b"].url, model("deepseek-flash", tier="fast"), api_key_env="B_KEY",
                           priority=20),
    ])
    return servers


async def test_cost_per_provider_is_tokens_times_price(user, priced, api):
    priced["a"].script(text_reply("one", usage=USAGE), text_reply("two", usage=USAGE))
    priced["b"].script(text_reply("three", usage=USAGE))
    runs = [await _run(user), await _run(user), await _run(user, provider="deepseek")]
    a1, a2, d = runs
    expected_a = (Decimal(1000) * 1 + Decimal(500) * 5 + Decimal(2000) * Decimal("0.1") + Decimal(100) * Decimal("1.25")) / 1_000_000
    assert a1.cost == a2.cost == expected_a.quantize(Decimal("0.000001"))
    assert (a1.input_tokens, a1.output_tokens, a1.cache_read_tokens, a1.cache_write_tokens) == (1000, 500, 2000, 100)
    assert a1.pricing == {"input": "1.0000", "output": "5.0000", "cacheRead": "0.1000", "cacheWrite": "1.2500",
                          "source": "file"}
    genai = calc_price(Usage(input_tokens=3100, cache_read_tokens=2000, cache_write_tokens=100, output_tokens=500),
                       "deepseek-flash", provider_id="deepseek").total_price
    assert d.provider == "deepseek" and d.pricing["source"] == "genai-prices"
    assert abs(d.cost - Decimal(str(genai))) < Decimal("0.000002") and d.cost > 0
    body = (await sync_to_async(api.get)("/v1/usage?group_by=provider")).json()
    groups = {g["key"]: g for g in body["groups"]}
    assert Decimal(groups["a"]["cost"]) == 2 * a1.cost and groups["a"]["runs"] == 2
    assert groups["a"]["inputTokens"] == 2000 and groups["a"]["outputTokens"] == 1000
    assert groups["a"]["cacheReadTokens"] == 4000 and groups["a"]["cacheWriteTokens"] == 200
    assert Decimal(groups["deepseek"]["cost"]) == d.cost
    assert Decimal(body["total"]["cost"]) == 2 * a1.cost + d.cost and body["scope"] == "own"
    # The timeline shows the run's tokens and price too.
    timeline = (await sync_to_async(api.get)(f"/v1/agent/runs/{a1.id}/timeline")).json()
    assert timeline["tokens"] == {"input": 1000, "output": 500, "cacheRead": 2000, "cacheWrite": 100}
    assert timeline["pricing"]["source"] == "file"


async def test_usage_groups_and_dates(user, priced, api):
    priced["a"].script(text_reply("one", usage=USAGE))
    run = await _run(user)
    for group, key in (("model", "model-a"), ("agent", AGENT), ("conversation", str(run.conversation_id)),
                       ("day", run.started_at.date().isoformat())):
        body = (await sync_to_async(api.get)(f"/v1/usage?group_by={group}")).json()
        assert [g["key"] for g in body["groups"]] == [key], group
    today = run.started_at.date().isoformat()
    assert (await sync_to_async(api.get)(f"/v1/usage?from={today}&to={today}")).json()["total"]["runs"] == 1
    assert (await sync_to_async(api.get)("/v1/usage?from=2000-01-01&to=2000-01-02")).json()["total"]["runs"] == 0


async def test_usage_is_the_callers_own_and_staff_sees_all(user, other_user, priced, api, other_api):
    priced["a"].script(text_reply("one", usage=USAGE))
    await _run(user)
    assert (await sync_to_async(other_api.get)("/v1/usage")).json()["groups"] == []
    other_user.is_staff = True
    await other_user.asave()
    body = (await sync_to_async(other_api.get)("/v1/usage")).json()
    assert body["scope"] == "all" and body["total"]["runs"] == 1


@pytest.mark.parametrize("query, code", [
    ("group_by=user", "invalid_group_by"), ("from=yesterday", "invalid_date"), ("to=2025-13-01", "invalid_date"),
    ("from=2025-02-02&to=2025-02-01", "invalid_date"),
])
def test_usage_bad_input_is_400(api, query, code):
    response = api.get(f"/v1/usage?{query}")
    assert response.status_code == 400 and response.json()["code"] == code and response.json()["message"]


def test_usage_needs_authentication(db):
    from rest_framework.test import APIClient

    assert APIClient().get("/v1/usage").status_code in (401, 403)


# --- budgets ---------------------------------------------------------------------------------------

@pytest.fixture
def budgeted(servers, load):
    load(providers=[anthropic_provider("a", servers["a"].url, model("cheap", tier="fast", input_price=0.5, output_price=1),
                                       model("pricey", tier="top", input_price=10, output_price=50))],
         budgets=[{"name": "daily", "period": "day", "max_tokens": 1000, "soft_ratio": 0.5}])
    return servers


async def test_budget_switches_to_cheapest_then_refuses(user, other_user, budgeted, api):
    budgeted["a"].script(text_reply("1", usage={"input_tokens": 300, "output_tokens": 300}),
                         text_reply("2", usage={"input_tokens": 300, "output_tokens": 300}))
    first = await _run(user, text="Plan the quarter")
    assert first.model == "pricey" and "rule top" in first.route_note
    second = await _run(user, text="Plan the quarter")  # 600 of 1000 tokens: past the 50% soft share
    assert second.model == "cheap"
    assert "budget daily: 600 of 1000 tokens this day (60%): cheapest capable model" in second.route_note
    with pytest.raises(ApplicationError) as exc:  # 1200 of 1000
        await services.run_start(user=user, input="Plan the quarter", agent_role=AGENT)
    assert exc.value.status == 429 and exc.value.code == "budget_exceeded"
    response = await sync_to_async(api.post)("/v1/agent/chat", {"input": "Plan", "agentRole": AGENT}, format="json")
    assert response.status_code == 429 and response.json()["code"] == "budget_exceeded"
    assert "budget daily" in response.json()["message"]
    # Each user has their own budget.
    budgeted["a"].script(text_reply("3"))
    assert (await _run(other_user, text="Plan the quarter")).model == "pricey"


async def test_budget_on_cost_refuses(user, servers, load):
    await sync_to_async(load)(
        providers=[anthropic_provider("a", servers["a"].url, model("m", input_price=1000, output_price=1000))],
        budgets=[{"name": "tiny", "period": "month", "max_cost": 0.01}])
    servers["a"].script(text_reply("x", usage={"input_tokens": 100, "output_tokens": 100}))
    run = await _run(user)
    assert run.cost == Decimal("0.200000")
    with pytest.raises(ApplicationError, match="budget tiny"):
        await services.run_start(user=user, input="again", agent_role=AGENT)


async def test_provider_spend_limit_skips_provider_then_refuses(user, servers, load):
    await sync_to_async(load)(providers=[
        anthropic_provider("a", servers["a"].url, model("ma", input_price=1000, output_price=1000), spend_limit=0.1,
                           spend_period="day"),
        anthropic_provider("b", servers["b"].url, model("mb", input_price=1000, output_price=1000), priority=20,
                           spend_limit=0.1),
    ])
    servers["a"].script(text_reply("x", usage={"input_tokens": 100, "output_tokens": 100}))
    servers["b"].script(text_reply("y", usage={"input_tokens": 100, "output_tokens": 100}))
    assert (await _run(user)).provider == "a"
    second = await _run(user)
    assert second.provider == "b" and "skipped a (spend limit 0.1 USD this day reached" in second.route_note
    with pytest.raises(ApplicationError) as exc:
        await services.run_start(user=user, input="third", agent_role=AGENT)
    assert exc.value.status == 429 and exc.value.code == "budget_exceeded"


# --- runs that end without an answer still record what the provider billed ------------------------

def _cost(input_tokens: int, output_tokens: int, cache_read: int, cache_write: int) -> Decimal:
    """At model-a's prices in ``priced`` (per million: input 1, output 5, cache read 0.1, cache write 1.25)."""
    total = (Decimal(input_tokens) + Decimal(output_tokens) * 5 + Decimal(cache_read) * Decimal("0.1")
             + Decimal(cache_write) * Decimal("1.25")) / 1_000_000
    return total.quantize(Decimal("0.000001"))


async def test_a_run_that_fails_mid_stream_records_the_tokens_reported_so_far(user, priced):
    priced["a"].script(mid_stream_error(text_reply(["Hel", "lo"], usage=USAGE)))
    run = await _run(user)
    assert run.status == Run.Status.FAILED
    # message_start reported the input and cache tokens (and 1 output token); the stream broke
    # before message_delta, so that is what is known of the output.
    assert (run.input_tokens, run.output_tokens, run.cache_read_tokens, run.cache_write_tokens) == (1000, 1, 2000, 100)
    assert run.provider == "a" and run.model == "model-a"
    assert run.cost == _cost(1000, 1, 2000, 100) and run.pricing["source"] == "file"


async def test_a_cancelled_run_records_the_tokens_reported_so_far(user, priced):
    reply = stall(text_reply(["Hel", "lo"], usage=USAGE))
    priced["a"].script(reply)
    try:
        created = await services.run_start(user=user, input="hello", agent_role=AGENT)
        events = services.run_subscribe(run_id=str(created.run.id))
        async for event in events:
            if event.event == "agent.delta":
                break
        await services.run_cancel(user=user, run_id=str(created.run.id))
        ended = [e.event async for e in services.run_subscribe(run_id=str(created.run.id))]
        assert ended[-1] == "agent.end"
    finally:
        reply.release.set()
    run = await Run.objects.aget(id=created.run.id)
    assert run.status == Run.Status.CANCELLED
    assert (run.input_tokens, run.output_tokens) == (1000, 1) and run.cost == _cost(1000, 1, 2000, 100)


async def test_a_run_refused_before_any_token_records_no_cost(user, priced):
    priced["a"].script(http_error(400, "bad request"))
    run = await _run(user)
    assert run.status == Run.Status.FAILED
    assert (run.input_tokens, run.output_tokens, run.cost) == (0, 0, 0)
