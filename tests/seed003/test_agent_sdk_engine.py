"""The optional ``claude_agent_sdk`` engine, end to end: the real SDK and its bundled Claude Code
CLI talk to the scripted Anthropic server. Skipped when the ``agent-sdk`` extra is not installed."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agents_app.models import Agent
from chat_app import services
from tests.fakes.anthropic_server import http_error, stall, text_reply, tool_use_reply

from .conftest import aregister_mcp_server

pytest.importorskip("claude_agent_sdk")

pytestmark = pytest.mark.django_db(transaction=True)

ROLE = "coder"


@pytest.fixture
def agent_sdk(claude, monkeypatch, tmp_path):
    """The coder agent on the agent-SDK engine; the CLI keeps its sessions in a throwaway HOME."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    monkeypatch.setenv("DISABLE_TELEMETRY", "1")
    (tmp_path / "home").mkdir()
    Agent.objects.filter(role=ROLE).update(engine="claude_agent_sdk", allowed_tools=[])
    return claude


async def _run(**kwargs):
    created = await services.run_start(**kwargs)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    return created, events


async def test_agent_sdk_execute_prompt_returns_response_and_session_id(user, agent_sdk):
    agent_sdk.script(text_reply(["Hel", "lo"]))
    created, events = await _run(user=user, input="hi", agent_role=ROLE)
    assert created.run.engine == "claude_agent_sdk"
    assert [e.payload["text"] for e in events if e.event == "agent.delta"] == ["Hel", "lo"]
    end = events[-1].payload
    assert end["status"] == "succeeded", end
    assert end["text"] == "Hello"
    uuid.UUID(end["sessionId"])  # Claude Code's own session id


async def test_agent_sdk_resume_passes_session_and_carries_context(user, agent_sdk):
    agent_sdk.script(text_reply("Hi Ada."), text_reply("You are Ada."))
    first, first_events = await _run(user=user, input="I am Ada.", agent_role=ROLE)
    session_id = first_events[-1].payload["sessionId"]
    _, events = await _run(user=user, input="Who am I?", conversation_id=str(first.conversation.id))
    assert events[-1].payload["status"] == "succeeded", events[-1].payload
    assert events[-1].payload["sessionId"] == session_id
    sent = agent_sdk.requests_to("/v1/messages")[-1].json["messages"]
    flat = repr(sent)
    assert "I am Ada." in flat and "Hi Ada." in flat and "Who am I?" in flat


async def test_agent_sdk_mcp_servers_reach_model_and_run(user, agent_sdk, mcp_stdio):
    await aregister_mcp_server({**mcp_stdio, "requires_approval": False}, agent_role=ROLE)
    agent_sdk.script(tool_use_reply("mcp__calc__add", {"a": 2, "b": 3}, id="toolu_sdk"), text_reply("5 it is"))
    _, events = await _run(user=user, input="add", agent_role=ROLE)
    assert events[-1].payload["status"] == "succeeded", events[-1].payload
    first, second = agent_sdk.requests_to("/v1/messages")[:2]
    assert "mcp__calc__add" in {t["name"] for t in first.json.get("tools", [])}
    results = [b for m in second.json["messages"] if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result"]
    assert results and "5" in repr(results[-1]["content"])
    states = [(e.payload["name"], e.payload["status"]) for e in events if e.event == "tool.state"]
    assert states == [("mcp__calc__add", "running"), ("mcp__calc__add", "succeeded")]


async def test_agent_sdk_invalid_key_descriptive_error(user, agent_sdk):
    agent_sdk.script(http_error(401, times=5))
    _, events = await _run(user=user, input="hi", agent_role=ROLE)
    errors = [e.payload for e in events if e.event == "error"]
    assert errors, [(e.event, e.payload) for e in events]
    error = errors[0]
    assert error["code"] == "authentication_failed", error
    assert "[agent coder (engine claude_agent_sdk" in error["message"]
    assert "rejected the API key" in error["message"]


async def test_agent_sdk_cancel_stops_the_cli(user, agent_sdk):
    from chat_app.models import Message
    from tests.conftest import wait_for

    agent_sdk.script(stall(text_reply(["slow", "ly"]), after=3))
    created = await services.run_start(user=user, input="hi", agent_role=ROLE)
    await wait_for(lambda: agent_sdk.requests_to("/v1/messages"), timeout=20)
    assert _cli_children()
    run = await services.run_cancel(user=user, run_id=str(created.run.id))
    assert run.status == "cancelled"
    assert not await Message.objects.filter(conversation=created.conversation, role="assistant").aexists()
    await wait_for(lambda: not _cli_children(), timeout=20)  # the CLI process is gone, not orphaned


def _cli_children() -> list[int]:
    """Child processes of this test process running the Claude Code CLI (zombies too: not yet reaped)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, _, rest = text.partition(") ")
        fields = rest.split()
        if "claude" in name and int(fields[1]) == os.getpid():
            out.append(int(stat.parent.name))
    return out
