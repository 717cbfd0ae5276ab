"""CHAT-070: the same SSE contract whichever engine the router picks (mock, claude, ollama).

Each engine plays one scenario: the model asks for ``write_file`` (which needs approval), the
person approves through the REST API, the tool runs, the model answers. Claude runs against the
scripted Anthropic server and Ollama against the scripted Ollama server, through their real
clients; nothing is mocked inside an SDK.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from agents_app.engines import get_engine
from chat_app.models import RunEvent
from tests.agent_chat.conftest import WRITE_TOOL, events_of, parse_sse, parse_with_ai_sdk, tool_states
from tests.fakes import anthropic_server as claude_fake
from tests.fakes import ollama_server as ollama_fake

pytestmark = pytest.mark.django_db(transaction=True)

TOOL_INPUT = {"path": "notes.txt", "content": "hello from the tool"}
KEY_EVENTS = ["conversation.created", "agent.start", "tool.state", "tool.state", "tool.state", "tool.state",
              "agent.message", "agent.end"]


@dataclass
class EngineScenario:
    name: str
    input: str
    fail_input: str
    # Text the failed run's readable error must contain.
    fail_text: str
    # Re-scripts the provider so that the next request fails.
    make_provider_fail: Callable[[], Any] = lambda: None


def _setup_mock(request) -> EngineScenario:
    return EngineScenario("mock", f"{WRITE_TOOL}\nall done", "/fail provider unavailable", "provider unavailable")


def _setup_claude(request) -> EngineScenario:
    server = request.getfixturevalue("claude")
    server.script(
        claude_fake.tool_use_reply("write_file", TOOL_INPUT, text_before=["I will ", "write it."]),
        claude_fake.text_reply(["All ", "done."]),
    )

    def fail() -> None:
        server.clear_script()
        server.script(claude_fake.http_error(500, "upstream is down", should_retry=False))

    return EngineScenario("claude", "please write the notes", "please fail", "upstream is down", fail)


def _setup_ollama(request) -> EngineScenario:
    settings = request.getfixturevalue("settings")
    server = request.getfixturevalue("ollama_server")
    settings.OLLAMA_URL = server.url
    settings.OLLAMA_MODEL = "llama-test:8b"
    settings.OLLAMA_TIMEOUT = 5.0
    server.script(
        ollama_fake.action("Write the notes.", "use_tool", tool="write_file", args=TOOL_INPUT),
        ollama_fake.action("Written.", "final", answer="All done."),
    )

    def fail() -> None:
        server.clear_script()
        server.script(ollama_fake.model_not_found("llama-test:8b"))

    return EngineScenario("ollama", "please write the notes", "please fail", "llama-test:8b", fail)


SETUPS: dict[str, Callable[[Any], EngineScenario]] = {"mock": _setup_mock, "claude": _setup_claude,
                                                      "ollama": _setup_ollama}


def _engine_param(name: str):
    marks = []
    if get_engine(name) is None:
        marks.append(pytest.mark.skip(reason=f"the {name} engine is not installed"))
    return pytest.param(name, marks=marks, id=name)


ENGINES = [_engine_param(name) for name in SETUPS]


@pytest.fixture
def scenario(request, agents) -> EngineScenario:
    return SETUPS[request.param](request)


def _key_events(frames) -> list[str]:
    return [f.event for f in events_of(frames) if f.event not in ("agent.delta", "context.patch", "ping")]


@pytest.mark.parametrize("scenario", ENGINES, indirect=True)
async def test_chat070_same_sse_contract_on_every_engine(chat, scenario, agents):
    reader = await chat.chat({"input": scenario.input, "agentRole": "coder", "engine": scenario.name})
    awaiting = await reader.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    assert awaiting.payload["name"] == "write_file" and awaiting.payload["input"] == TOOL_INPUT
    status, _ = await chat.json("POST", f"/v1/tool-confirmations/{awaiting.payload['confirmationId']}/approve")
    assert status == 200
    frames = events_of(await reader.rest())

    assert _key_events(frames) == KEY_EVENTS
    assert tool_states(frames) == ["pending", "awaiting_input", "running", "succeeded"]
    logged = [f for f in frames if f.event not in ("ping", "conversation.created")]
    ids = [int(f.id) for f in logged]
    assert ids == sorted(set(ids)) and ids[0] == 1  # in order, no duplicate (merged deltas skip seqs)
    stored = await RunEvent.objects.filter(run_id=logged[0].payload["runId"]).acount()
    assert ids[-1] == stored
    start = logged[0].payload
    assert start["engine"] == scenario.name and start["agentRole"] == "coder"
    names = [f.event for f in logged]
    assert "agent.delta" in names and names.index("agent.delta") < names.index("agent.message")
    message = next(f.payload for f in logged if f.event == "agent.message")
    assert "done" in message["content"].lower()
    assert logged[-1].payload["status"] == "succeeded" and logged[-1].payload["messageId"] == message["messageId"]
    assert (agents["coder"].workspace_path / "notes.txt").read_text() == "hello from the tool"
    status, messages = await chat.json("GET", f"/v1/conversations/{reader.response['X-Conversation-Id']}/messages")
    assert [m["role"] for m in messages] == ["user", "tool", "assistant"]
    assert messages[-1]["content"] == message["content"]


@pytest.mark.parametrize("scenario", ENGINES, indirect=True)
async def test_chat070_vercel_semantics_on_every_engine(chat, scenario, ai_sdk):
    reader = await chat.chat({"input": scenario.input, "agentRole": "coder", "engine": scenario.name},
                             query="?format=vercel-ai")
    request = await reader.until(lambda f: f.data and f.data != "[DONE]" and f.json["type"] == "tool-approval-request")
    await chat.json("POST", f"/v1/tool-confirmations/{request.json['approvalId']}/approve")
    await reader.rest()
    parts = [json.loads(f.data) for f in parse_sse(reader.raw) if f.data and f.data != "[DONE]"]
    conversation = next(p for p in parts if p["type"] == "data-conversation")
    assert conversation["data"] == {"conversationId": reader.response["X-Conversation-Id"]}
    awaiting = next(p for p in parts if p["type"] == "data-tool-state" and p["data"]["status"] == "awaiting_input")
    assert awaiting["data"]["confirmationId"] == request.json["approvalId"]
    assert parts[-1]["type"] == "finish" and parts[-1]["finishReason"] == "stop"
    result = parse_with_ai_sdk(ai_sdk, reader.raw)
    assert result["invalid"] == [] and result["errors"] == [] and result["done"]
    tool = next(p for p in result["message"]["parts"] if p["type"] == "dynamic-tool")
    assert tool["state"] == "output-available" and tool["approval"]["id"] == request.json["approvalId"]


@pytest.mark.parametrize("scenario", ENGINES, indirect=True)
async def test_chat030_provider_failure_ends_failed_on_every_engine(chat, scenario):
    scenario.make_provider_fail()
    reader = await chat.chat({"input": scenario.fail_input, "agentRole": "coder", "engine": scenario.name})
    frames = events_of(await reader.rest())
    assert reader.response.status_code == 200
    assert _key_events(frames)[-2:] == ["error", "agent.end"]
    error, end = frames[-2].payload, frames[-1].payload
    assert error["code"] and error["message"]
    assert end["status"] == "failed" and scenario.fail_text in end["error"]
    assert f"engine {scenario.name}" in end["error"]  # readable: says which engine failed
