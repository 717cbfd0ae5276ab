"""``manage.py acp`` fed raw lines: every JSON-RPC error code, notifications, the seed-002 aliases."""
from __future__ import annotations

import sys

import pytest

from .conftest import CLAUDE_AGENT, REPO, raw_agent

pytestmark = pytest.mark.timeout(120)

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}


def _is_error(code):
    return lambda m: "error" in m and m["error"]["code"] == code


async def test_acp_raw_error_codes_and_keeps_serving(acp_setup):
    async with raw_agent(acp_setup) as agent:
        await agent.send("this is not json")
        assert (await agent.next(_is_error(-32700)))["id"] is None
        await agent.send("[1, 2]")
        await agent.send('"a string"')
        await agent.send({"id": 5, "method": "initialize", "params": {}})  # no "jsonrpc"
        await agent.send({"jsonrpc": "2.0", "id": 6, "method": 42})
        await agent.send({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": "x"})
        await agent.next(lambda m: _is_error(-32600)(m) and m["id"] == 7)  # answered in order
        assert [m["id"] for m in agent.received if _is_error(-32600)(m)] == [None, None, 5, 6, 7]
        await agent.send(INIT)
        assert (await agent.response(1))["result"]["protocolVersion"] == 1
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "session/teleport", "params": {}})
        assert (await agent.response(2))["error"]["code"] == -32601
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "session/new", "params": {"cwd": 12}})
        assert (await agent.response(3))["error"]["code"] == -32602
        await agent.send({"jsonrpc": "2.0", "id": 4, "method": "session/prompt",
                          "params": {"sessionId": "nope", "prompt": [{"type": "image", "data": "", "mimeType": "image/png"}]}})
        assert (await agent.response(4))["error"]["code"] == -32602
        # Notifications are never answered, not even unknown or broken ones.
        await agent.send({"jsonrpc": "2.0", "method": "session/teleport", "params": {}})
        await agent.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {}})
        await agent.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "unknown"}})
        await agent.send({"jsonrpc": "2.0", "id": 8, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}})
        assert "sessionId" in (await agent.response(8))["result"]
        answered = [m.get("id") for m in agent.received if "method" not in m]
        assert answered.count(None) == 3 and sorted(i for i in answered if i is not None) == [1, 2, 3, 4, 5, 6, 7, 8]
        assert not [m for m in agent.received if "method" in m]  # nothing else was sent


async def test_acp_raw_internal_error(acp_setup):
    # The database disappears under a running agent: a request that needs it fails with -32603.
    async with raw_agent(acp_setup, "--agent", CLAUDE_AGENT) as agent:
        await agent.send(INIT)
        await agent.response(1)
        acp_setup.query("DROP TABLE chat_app_conversation")
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}})
        assert (await agent.response(2))["error"]["code"] == -32603
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {"protocolVersion": 1}})
        assert (await agent.response(3))["result"]["protocolVersion"] == 1


async def test_acp_raw_seed_aliases_and_notifications(acp_setup):
    async with raw_agent(acp_setup, "--agent", CLAUDE_AGENT) as agent:
        await agent.send({"jsonrpc": "2.0", "id": 1, "method": "acp/initialize", "params": {"protocolVersion": 2}})
        refused = await agent.response(1)
        assert refused["error"]["code"] == -32602 and refused["error"]["data"]["supportedVersions"] == [1]
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "acp/initialize", "params": {
            "protocolVersion": 1, "_meta": {"notifications": ["session/progress", "session/output", "permission/request"]}}})
        assert (await agent.response(2))["result"]["_meta"]["notifications"] == [
            "permission/request", "session/output", "session/progress"]
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "session/create", "params": {}})
        session_id = (await agent.response(3))["result"]["sessionId"]
        # The seed's plain-string task; a tool that asks: permission/request, answered by permission/response.
        await agent.send({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": {
            "sessionId": session_id, "prompt": '/tool write_file {"path": "s.txt", "content": "seed"}'}})
        ask = await agent.next(lambda m: m.get("method") == "permission/request")
        assert ask["params"]["sessionId"] == session_id and ask["params"]["toolCall"]["kind"] == "edit"
        assert {o["kind"] for o in ask["params"]["options"]} == {"allow_once", "allow_always", "reject_once", "reject_always"}
        await agent.send({"jsonrpc": "2.0", "method": "permission/response", "params": {
            "requestId": ask["params"]["requestId"], "outcome": {"outcome": "selected", "optionId": "allow_once"}}})
        done = await agent.response(4)
        assert done["result"]["stopReason"] == "end_turn"
        methods = [m.get("method") for m in agent.received if "method" in m]
        assert "session/update" in methods and "session/progress" in methods and "session/output" in methods
        progress = [m["params"] for m in agent.received if m.get("method") == "session/progress"]
        assert progress[0]["percent"] == 0 and progress[-1]["percent"] == 100 and progress[-1]["status"] == "succeeded"
        outputs = [m["params"] for m in agent.received if m.get("method") == "session/output"]
        assert any(o["type"] == "tool_output" and o["status"] == "succeeded" for o in outputs)
        assert "".join(o["content"] for o in outputs if o["type"] == "text").startswith("Mock reply")
        # A permission/response request for nothing waiting is bad params; the session goes on.
        await agent.send({"jsonrpc": "2.0", "id": 5, "method": "permission/response", "params": {"requestId": "none"}})
        assert (await agent.response(5))["error"]["code"] == -32602
    assert (acp_setup.workspaces / CLAUDE_AGENT / "s.txt").read_text() == "seed"


async def test_acp_raw_no_seed_notifications_unless_asked(acp_setup):
    async with raw_agent(acp_setup, "--agent", CLAUDE_AGENT) as agent:
        await agent.send(INIT)
        await agent.response(1)
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}})
        session_id = (await agent.response(2))["result"]["sessionId"]
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {
            "sessionId": session_id, "prompt": [{"type": "text", "text": "hello"}]}})
        assert (await agent.response(3))["result"]["stopReason"] == "end_turn"
        assert {m.get("method") for m in agent.received if "method" in m} == {"session/update"}


async def test_acp_session_mcp_servers_are_started(acp_setup):
    """A local client is the process owner: the stdio MCP server it names in session/new runs."""
    server = {"name": "calc", "command": sys.executable, "args": [str(REPO / "tests" / "fakes" / "mcp_server.py")],
              "env": [{"name": "PYTHONPATH", "value": str(REPO)}]}
    async with raw_agent(acp_setup, "--agent", CLAUDE_AGENT) as agent:
        await agent.send(INIT)
        await agent.response(1)
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                          "params": {"cwd": "/tmp", "mcpServers": [server]}})
        session_id = (await agent.response(2))["result"]["sessionId"]
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": {
            "sessionId": session_id, "prompt": [{"type": "text", "text": '/tool mcp__calc__add {"a": 2, "b": 3}'}]}})
        ask = await agent.next(lambda m: m.get("method") == "session/request_permission")
        await agent.send({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}})
        assert (await agent.response(3, timeout=60))["result"]["stopReason"] == "end_turn"
        updates = [m["params"]["update"] for m in agent.received if m.get("method") == "session/update"]
        done = [u for u in updates if u.get("sessionUpdate") == "tool_call_update" and u.get("status") == "completed"]
        assert done and done[0]["content"][0]["content"]["text"] == "5"
        # A bad MCP server shape is bad params.
        await agent.send({"jsonrpc": "2.0", "id": 4, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": [
            {"type": "sse", "name": "old", "url": "http://127.0.0.1:1/sse", "headers": []}]}})
        assert (await agent.response(4))["error"]["code"] == -32602
