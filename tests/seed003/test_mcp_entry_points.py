"""No other way in lets a request body start an MCP server or reach an address: only the seed-003
stream takes ``mcpServers`` (``test_mcp_policy.py``); the others take no run options, and MCP
fields in their bodies are ignored. Each run here completes normally and starts nothing."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator

from chat_app.models import Run
from orchestrator_site.asgi import application
from tests.agent_chat.conftest import ChatClient

pytestmark = pytest.mark.django_db(transaction=True)


def _extra(marker: Path) -> dict:
    spec = {"name": "x", "command": ["sh", "-c", f"touch {shlex.quote(str(marker))}"]}
    return {"mcpServers": [spec], "mcp_servers": [spec], "options": {"mcp_servers": [spec], "tool_config": {}},
            "tool_config": {"mcp_trader": {"url": "http://169.254.169.254/"}}}


HTTP_BODIES = {
    "/api/v1/chat/stream": {"agent_role": "coder", "message": "hi"},
    "/v1/agent/chat": {"input": "hi", "agentRole": "coder"},
    "/v1/agent/chat?format=vercel-ai": {"messages": [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}],
                                        "agentRole": "coder"},
    "/chat": {"messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("path", list(HTTP_BODIES))
async def test_entry_point_ignores_mcp_fields_in_the_body(token, agents, tmp_path, path):
    marker = tmp_path / "pwned"
    response = await ChatClient(token).post_json(path, {**HTTP_BODIES[path], **_extra(marker)})
    await response.read()
    assert response.status_code == 200, response.content[:500]
    run = await Run.objects.aget()
    assert run.status == "succeeded", run.error
    assert not marker.exists()


async def test_ws_chat_ignores_mcp_fields_in_the_message(token, agents, tmp_path):
    marker = tmp_path / "pwned"
    comm = WebsocketCommunicator(application, f"/ws/chat?token={token}", headers=[(b"origin", b"http://testserver")])
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_json_to({"agent_role": "coder", "message": "hi", **_extra(marker)})
    while (event := await comm.receive_json_from(timeout=10))["type"] not in ("done", "error"):
        pass
    await comm.disconnect()
    assert event["type"] == "done", event
    assert not marker.exists()
