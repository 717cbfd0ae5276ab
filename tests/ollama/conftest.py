"""Fixtures for the Ollama engine tests: the trio on the ``ollama`` engine, the fake servers."""
from __future__ import annotations

import socket
from typing import Any, Iterator

import pytest

from tests.fakes.mcp_invoke_server import McpInvokeServer
from tools_app.models import ToolRule

MODEL = "llama-test:8b"


@pytest.fixture
def ollama(settings, ollama_server):
    """The scripted Ollama server, configured as OLLAMA_URL with a short timeout."""
    settings.OLLAMA_URL = ollama_server.url
    settings.OLLAMA_MODEL = MODEL
    settings.OLLAMA_TIMEOUT = 5.0
    return ollama_server


@pytest.fixture
def trio(agents, ollama) -> dict[str, Any]:
    """orchestrator, coder and researcher on the ollama engine; run_python/mcp_trader allowed
    by agent rules (no person asked)."""
    for role in ("orchestrator", "coder", "researcher"):
        agent = agents[role]
        agent.engine = "ollama"
        agent.save()
        for tool in ("run_python", "mcp_trader"):
            ToolRule.objects.create(scope="agent", agent=agent, effect="allow", tool=tool)
    return agents


@pytest.fixture
def mcp_server(settings) -> Iterator[McpInvokeServer]:
    """One scripted MCP ``/invoke`` server behind both bridges."""
    server = McpInvokeServer()
    settings.MCP_FILESYSTEM_URL = server.url
    settings.MCP_TRADER_URL = server.url
    settings.MCP_BRIDGE_TIMEOUT = 5.0
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def chat(token):
    """An ASGI client (per-request thread, like daphne) holding the user's token."""
    from tests.agent_chat.conftest import ChatClient

    return ChatClient(token)


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def run_turn(user: Any, text: str, *, role: str = "orchestrator", timeout: float = 30.0, **kwargs: Any):
    """Start a run through the run service and read all its events; returns (created, events)."""
    import asyncio

    from chat_app import services

    created = await services.run_start(user=user, input=text, agent_role=role, **kwargs)

    async def collect():
        return [e async for e in services.run_subscribe(run_id=str(created.run.id))]

    return created, await asyncio.wait_for(collect(), timeout)


def steps_of(events) -> list[dict]:
    """The seed-004 step events (ContextPatch kind "step") of a run."""
    return [e.payload["data"] for e in events if e.event == "context.patch" and e.payload["kind"] == "step"]


def tool_events(events, status: str | None = None) -> list[dict]:
    return [e.payload for e in events if e.event == "tool.state" and (status is None or e.payload["status"] == status)]


def answer_of(events) -> str:
    end = events[-1]
    assert end.event == "agent.end", end
    assert end.payload["status"] == "succeeded", end.payload
    return end.payload["text"]


def user_query(request) -> str:
    """The user message a recorded /api/chat request carried."""
    return request.json["messages"][-1]["content"]
