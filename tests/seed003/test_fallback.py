"""Seed 003 "Fallback to mock client": no key → the mock engine, a warning once, visible in health."""
from __future__ import annotations

import logging

import pytest

from agents_app.engines import get_engine
from chat_app import services

from .conftest import ANALYST

pytestmark = pytest.mark.django_db(transaction=True)


async def test_fallback_to_mock_client_logs_warning(user, caplog):
    caplog.set_level(logging.WARNING, logger="orchestrator.router")
    created = await services.run_start(user=user, input="hello", agent_role=ANALYST)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert created.run.engine == "mock" and created.run.provider == "local"
    assert events[-1].payload["status"] == "succeeded"
    assert events[-1].payload["text"] == f"Mock reply from {ANALYST}: hello"
    assert "claude unavailable (no ANTHROPIC_API_KEY" in events[0].payload["routeNote"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("engine claude is unavailable" in w and "fall back to the mock engine" in w for w in warnings)

    caplog.clear()
    again = await services.run_start(user=user, input="again", agent_role=ANALYST)
    [e async for e in services.run_subscribe(run_id=str(again.run.id))]
    assert again.run.engine == "mock"
    assert not any("fall back" in r.getMessage() for r in caplog.records)  # once per process


def test_fallback_to_mock_client_visible_in_health(client, settings, agents):
    body = client.get("/health").json()
    claude = body["engines"]["claude"]
    assert claude["live"] is False and claude["fallback"] == "mock" and "ANTHROPIC_API_KEY" in claude["reason"]
    assert body["engines"]["mock"]["live"] is True

    settings.ANTHROPIC_API_KEY = "set"
    body = client.get("/api/v1/health").json()
    assert body["engines"]["claude"] == {"live": True, "provider": "anthropic"}


def test_agent_sdk_engine_registered_only_when_importable():
    try:
        import claude_agent_sdk  # noqa: F401
    except ImportError:
        assert get_engine("claude_agent_sdk") is None
    else:
        assert get_engine("claude_agent_sdk") is not None
