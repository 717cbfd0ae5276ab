"""mcp_filesystem / mcp_trader: POST <url>/invoke against a scripted server (seed 004)."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.fakes.mcp_invoke_server import McpInvokeServer
from tools_app import conf
from tools_app.registry import ToolContext
from tools_app.tools.mcp_bridge import McpFilesystemTool, McpTraderTool


@pytest.fixture
def mcp_server() -> Iterator[McpInvokeServer]:
    with McpInvokeServer() as server:
        yield server


def _context(workspace: Path, **config: Any) -> ToolContext:
    return ToolContext(workspace=workspace, config=config)


@pytest.mark.asyncio
async def test_mcp_filesystem_success_returns_response_text(mcp_server: McpInvokeServer, workspace: Path) -> None:
    mcp_server.respond("list_files", body={"files": ["a.txt", "b.txt"]})
    context = _context(workspace, mcp_filesystem={"url": mcp_server.url + "/"})
    result = await McpFilesystemTool().run(input={"tool": "list_files", "args": {"path": "."}}, context=context)
    assert not result.is_error
    assert result.output == '{"files": ["a.txt", "b.txt"]}'
    [request] = mcp_server.requests
    assert (request.method, request.path) == ("POST", "/invoke")
    assert request.json == {"tool": "list_files", "args": {"path": "."}}


@pytest.mark.asyncio
async def test_mcp_bridges_default_tool_and_args(mcp_server: McpInvokeServer, workspace: Path) -> None:
    context = _context(workspace, mcp_filesystem={"url": mcp_server.url}, mcp_trader={"url": mcp_server.url})
    await McpFilesystemTool().run(input={}, context=context)
    await McpTraderTool().run(input={"args": {"symbol": "BTC"}}, context=context)
    assert [r.json for r in mcp_server.requests] == [
        {"tool": "list_files", "args": {}},
        {"tool": "backtest", "args": {"symbol": "BTC"}},
    ]


@pytest.mark.asyncio
async def test_mcp_trader_url_from_setting(mcp_server: McpInvokeServer, workspace: Path, tool_settings: dict[str, Any]) -> None:
    tool_settings["MCP_TRADER_URL"] = mcp_server.url
    mcp_server.respond("backtest", body={"pnl": 12.5})
    result = await McpTraderTool().run(input={"tool": "backtest", "args": {}}, context=_context(workspace))
    assert not result.is_error
    assert result.output == '{"pnl": 12.5}'


def test_mcp_bridge_url_precedence(workspace: Path, tool_settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    tool_settings["MCP_FILESYSTEM_URL"] = "http://fs.from-setting:1"
    assert McpFilesystemTool().server_url(_context(workspace)) == "http://fs.from-setting:1"
    configured = _context(workspace, mcp_filesystem={"url": "http://fs.from-config:2"})
    assert McpFilesystemTool().server_url(configured) == "http://fs.from-config:2"
    monkeypatch.setattr(conf, "setting", lambda name, default: default)  # nothing set anywhere
    assert McpFilesystemTool().server_url(_context(workspace)) == "http://localhost:8001"
    assert McpTraderTool().server_url(_context(workspace)) == "http://localhost:8002"


@pytest.mark.asyncio
async def test_mcp_bridge_server_error_is_reported(mcp_server: McpInvokeServer, workspace: Path) -> None:
    mcp_server.respond("crash", status=500, body="boom")
    context = _context(workspace, mcp_filesystem={"url": mcp_server.url})
    result = await McpFilesystemTool().run(input={"tool": "crash", "args": {}}, context=context)
    assert result.is_error
    assert result.output.startswith(f"ERROR(mcp:{mcp_server.url},crash): 500 Server Error")


@pytest.mark.asyncio
async def test_mcp_bridge_unreachable_server_is_reported(workspace: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = await McpTraderTool().run(input={"tool": "quote", "args": {}}, context=_context(workspace, mcp_trader={"url": url}))
    assert result.is_error
    assert result.output.startswith(f"ERROR(mcp:{url},quote): ")


@pytest.mark.asyncio
async def test_mcp_bridge_rejects_non_object_args(mcp_server: McpInvokeServer, workspace: Path) -> None:
    context = _context(workspace, mcp_filesystem={"url": mcp_server.url})
    result = await McpFilesystemTool().run(input={"tool": "list_files", "args": ["not", "an", "object"]}, context=context)
    assert result.is_error and "'args'" in result.output
    assert mcp_server.requests == []


def test_mcp_trader_requires_approval_and_filesystem_does_not() -> None:
    assert McpTraderTool.requires_approval is True
    assert McpFilesystemTool.requires_approval is False
