"""``mcp_filesystem`` and ``mcp_trader``: HTTP bridges to MCP servers (seed 004).

Each bridge POSTs ``{"tool": ..., "args": ...}`` to ``<url>/invoke`` and returns the response
body as text; any failure comes back as ``ERROR(mcp:<url>,<tool>): <error>``. The URL is the
agent's tool config (``{"mcp_trader": {"url": ...}}``) or else a setting.

``mcp_trader`` needs approval by default: its tools can place orders, an action with effects
outside this service that cannot be taken back. ``mcp_filesystem`` does not: it is the same
kind of file access the workspace tools give without it.
"""
from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import requests

from .. import conf
from ..registry import Tool, ToolContext, ToolError, ToolResult
from ..sandbox import truncate_text
from ._base import tool_errors_as_results

_SCHEMA_ARGS = {"type": "object", "description": "Arguments for that MCP tool, as a JSON object."}


class McpBridgeTool(Tool):
    """Base for the HTTP bridges; not offered itself."""

    register = False
    url_setting: ClassVar[str] = ""
    default_url: ClassVar[str] = ""
    default_tool: ClassVar[str] = ""

    @tool_errors_as_results
    async def run(self, *, input: dict[str, Any], context: ToolContext) -> ToolResult:
        tool = input.get("tool") or self.default_tool
        args = input.get("args")
        if args is None:
            args = {}
        if not isinstance(tool, str):
            raise ToolError("'tool' must be a string")
        if not isinstance(args, dict):
            raise ToolError("'args' must be a JSON object")
        url = self.server_url(context)
        timeout = float(conf.setting("MCP_BRIDGE_TIMEOUT", 30))
        try:
            text = await asyncio.to_thread(_invoke, url, tool, args, timeout)
        except Exception as exc:  # seed 004: every failure is reported, none raised
            return ToolResult(f"ERROR(mcp:{url},{tool}): {exc}", is_error=True, metadata={"url": url, "tool": tool})
        text, truncated = truncate_text(text, int(conf.setting("TOOL_OUTPUT_LIMIT", 50_000)))
        return ToolResult(text, metadata={"url": url, "tool": tool, "truncated": truncated})

    def server_url(self, context: ToolContext) -> str:
        configured = (context.config.get(self.name) or {}).get("url")
        return str(configured or conf.setting(self.url_setting, self.default_url))


class McpFilesystemTool(McpBridgeTool):
    name = "mcp_filesystem"
    url_setting = "MCP_FILESYSTEM_URL"
    default_url = "http://localhost:8001"
    default_tool = "list_files"
    description = (
        "Call a tool on the filesystem MCP server. `tool` names the server's tool (default "
        "'list_files'); `args` is a JSON object of its arguments. Returns the server's response "
        "text, or 'ERROR(mcp:<url>,<tool>): <error>' if the call failed."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "tool": {"type": "string", "description": "Name of the MCP tool to call, e.g. 'list_files'."},
            "args": _SCHEMA_ARGS,
        },
        "required": ["tool"],
        "additionalProperties": False,
    }


class McpTraderTool(McpBridgeTool):
    name = "mcp_trader"
    url_setting = "MCP_TRADER_URL"
    default_url = "http://localhost:8002"
    default_tool = "backtest"
    # Trading tools act on real accounts; a person approves each call unless the agent opts out.
    requires_approval = True
    description = (
        "Call a tool on the trading MCP server (backtests, market data, orders). `tool` names the "
        "server's tool (default 'backtest'); `args` is a JSON object of its arguments. Returns the "
        "server's response text, or 'ERROR(mcp:<url>,<tool>): <error>' if the call failed. Calls "
        "may need a person's approval because they can place real orders."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "tool": {"type": "string", "description": "Name of the MCP tool to call, e.g. 'backtest'."},
            "args": _SCHEMA_ARGS,
        },
        "required": ["tool"],
        "additionalProperties": False,
    }


def _invoke(url: str, tool: str, args: dict[str, Any], timeout: float) -> str:
    with requests.Session() as session:
        # MCP servers are configured endpoints: no proxies or .netrc from the environment.
        session.trust_env = False
        resp = session.post(url.rstrip("/") + "/invoke", json={"tool": tool, "args": args}, timeout=timeout)
        resp.raise_for_status()
        return resp.text
