"""The provider management tools over MCP (provider_list, provider_status, provider_recommend)."""
from __future__ import annotations

import json
import pytest

from mcp.server.mcpserver.exceptions import ToolError

from chat_app.provider_mcp import build_provider_server

pytestmark = pytest.mark.django_db(transaction=True)


def _text(result) -> str:
    content = result[0] if isinstance(result, tuple) else result
    items = getattr(content, "content", content)
    return "".join(getattr(c, "text", "") for c in items)


async def test_mcp_provider_tools_list_status_recommend(three, user):
    server = build_provider_server(user=user)
    names = {t.name for t in await server.list_tools()}
    assert {"provider_list", "provider_status", "provider_recommend"} <= names
    listed = json.loads(_text(await server.call_tool("provider_list", {})))
    assert {"a", "b", "c"} <= {p["name"] for p in listed}
    assert "secret" not in json.dumps(listed)
    status = json.loads(_text(await server.call_tool("provider_status", {"name": "a"})))
    assert status["status"] == "healthy" and "recentErrors" in status and "rateLimited" in status
    rec = json.loads(_text(await server.call_tool("provider_recommend", {"task": "Fix the lint errors",
                                                                          "agent_role": "dev_efficiency_analyst"})))
    assert rec["provider"] == "a" and rec["rationale"].startswith("a/model-a") and rec["fallbacks"]


async def test_mcp_provider_tools_bad_input_is_a_tool_error(three):
    server = build_provider_server()
    for name, args in (("provider_status", {"name": "nope"}),
                       ("provider_recommend", {"task": "x", "provider": "nope", "agent_role": "dev_efficiency_analyst"})):
        with pytest.raises(ToolError, match="nope"):
            await server.call_tool(name, args)


async def test_mcp_providers_command_serves_the_tools_over_stdio(tmp_path):
    import subprocess
    import sys as _sys
    from pathlib import Path

    from tests.conftest import subprocess_env
    from tools_app.mcp_client import McpToolset
    from tools_app.registry import ToolContext

    repo = Path(__file__).resolve().parents[2]
    env = subprocess_env(database=tmp_path / "mcp.sqlite3", workspaces=tmp_path / "ws", extra={"LOG_LEVEL": "WARNING"})
    subprocess.run([_sys.executable, str(repo / "manage.py"), "migrate", "--noinput", "-v0"], env=env, check=True,
                   timeout=120)
    config = {"name": "providers", "command": [_sys.executable, str(repo / "manage.py"), "mcp_providers"], "env": env}
    async with McpToolset([config]) as tools:
        assert {"mcp__providers__provider_list", "mcp__providers__provider_status",
                "mcp__providers__provider_recommend"} <= set(tools)
        result = await tools["mcp__providers__provider_list"].run(input={}, context=ToolContext(workspace=tmp_path))
        assert not result.is_error
        assert {p["name"] for p in json.loads(result.output)} >= {"anthropic", "ollama"}
