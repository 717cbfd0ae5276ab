"""Seed 003 "Claude Client Error Handling": timeout, invalid key, provider errors wrapped with context."""
from __future__ import annotations

import logging

import pytest
from asgiref.sync import sync_to_async

from agents_app.models import Agent
from chat_app import services
from chat_app.models import Conversation, Message, Run
from tests.fakes.anthropic_server import http_error, mid_stream_error, stall, text_reply

from .conftest import ANALYST, MODEL, open_stream, stream_path

pytestmark = pytest.mark.django_db(transaction=True)

CONTEXT = f"[agent {ANALYST} (engine claude, model {MODEL}, provider anthropic)]"


async def _run(**kwargs):
    created = await services.run_start(**kwargs)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    return created, events


async def _roles(conversation_id) -> list[str]:
    return await sync_to_async(list)(
        Message.objects.filter(conversation_id=conversation_id).order_by("created_at", "id").values_list("role", flat=True))


async def test_sdk_timeout_preserves_conversation_for_retry(user, settings):
    settings.RUN_TIMEOUT = 0.3
    created, events = await _run(user=user, input="/sleep 5\nslow", agent_role="coder")
    assert [e.event for e in events][-2:] == ["error", "agent.end"]
    assert events[-2].payload["code"] == "run_timeout"
    assert events[-2].payload["message"] == "Run timed out after 0.3 s. [agent coder (engine mock, model mock-1, provider local)]"
    assert events[-1].payload == {**events[-1].payload, "status": "failed", "errorCode": "run_timeout"}
    run = await Run.objects.aget(id=created.run.id)
    assert run.status == "failed" and "timed out" in run.error
    cid = str(created.conversation.id)
    assert await _roles(cid) == ["user"]  # no partial answer; the user's message stays

    settings.RUN_TIMEOUT = 30
    _, retry = await _run(user=user, input="/recall", conversation_id=cid)
    assert retry[-1].payload["status"] == "succeeded"
    assert "user: /sleep 5\nslow" in retry[-1].payload["text"]  # the timed-out turn is still context
    assert await _roles(cid) == ["user", "user", "assistant"]


async def test_sdk_timeout_while_provider_stalls(user, claude):
    """The provider stops mid-answer; the run timeout (per request here) ends it cleanly."""
    claude.script(stall(text_reply(["par", "tial"]), after=4), text_reply("Second try."))
    created, events = await _run(user=user, input="hi", agent_role=ANALYST, options={"timeout": 0.5})
    assert any(e.event == "agent.delta" for e in events)  # some text had streamed
    assert events[-1].payload["errorCode"] == "run_timeout"
    assert events[-1].payload["error"] == f"Run timed out after 0.5 s. {CONTEXT}"
    cid = str(created.conversation.id)
    assert await _roles(cid) == ["user"]
    claude.release_stalls()
    _, retry = await _run(user=user, input="try again", conversation_id=cid)
    assert retry[-1].payload["text"] == "Second try."


async def test_api_key_invalid_descriptive_error(user, token, claude, caplog, agents):
    caplog.set_level(logging.WARNING)
    claude.script(http_error(401))
    conversation = await Conversation.objects.acreate(owner=user, title="t", agent=agents[ANALYST])
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "hi"})
    events = await stream.events()
    await stream.close()
    assert [e.event for e in events] == ["init", "error"]
    error = events[-1].data
    assert error["code"] == "authentication_failed"
    assert "rejected the API key" in error["message"] and "ANTHROPIC_API_KEY" in error["message"]
    assert error["message"].endswith(CONTEXT)
    logged = [r.getMessage() for r in caplog.records]
    assert any("authentication_failed" in m for m in logged)  # logged for debugging
    assert any(f"agent {ANALYST}" in m and "rejected the API key" in m for m in logged)
    assert "test-key" not in " ".join(logged) + error["message"]  # the key itself is never shown


async def test_sdk_internal_error_wrapped_with_context(user, token, claude, agents):
    claude.script(http_error(500, "kaboom", should_retry=False))
    _, events = await _run(user=user, input="hi", agent_role=ANALYST)
    error = next(e.payload for e in events if e.event == "error")
    assert error["code"] == "provider_error"
    assert "kaboom" in error["message"] and error["message"].endswith(CONTEXT)
    assert events[-1].payload["status"] == "failed" and events[-1].payload["error"] == error["message"]

    # A failure after HTTP 200 (an ``error`` event mid-stream) reaches a seed-003 caller too.
    claude.script(mid_stream_error(text_reply(["a", "b"]), error_type="overloaded_error"))
    conversation = await Conversation.objects.acreate(owner=user, title="t", agent=agents[ANALYST])
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body={"content": "hi"})
    frames = await stream.events()
    await stream.close()
    assert frames[-1].event == "error" and frames[-1].data["code"] == "provider_overloaded"
    assert frames[-1].data["message"].endswith(CONTEXT)
    assert not await Message.objects.filter(conversation=conversation, role="assistant").aexists()


async def test_invalid_request_mcp_config_wrapped_with_context(user):
    """A registered MCP server saved around the admin's validation fails the run readably."""
    from tools_app.models import AgentMcpServer, McpServer

    server = await McpServer.objects.acreate(name="broken", transport="stdio", command=[])
    await AgentMcpServer.objects.acreate(agent=await Agent.objects.aget(role="coder"), server=server, always=True)
    _, events = await _run(user=user, input="hi", agent_role="coder", engine="mock")
    error = next(e.payload for e in events if e.event == "error")
    assert error["code"] == "invalid_mcp_config"
    assert error["message"].endswith("[agent coder (engine mock, model mock-1, provider local)]")
