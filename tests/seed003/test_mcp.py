"""Seed 003 "MCP server configuration": registered MCP servers (an agent's ``always`` ones and
those a request names) reach the model and run.

The MCP servers are real ones (``tests/fakes/mcp_server.py``, built on the ``mcp`` SDK's
``MCPServer``), over stdio and streamable HTTP; the model is the scripted Anthropic server. Who may
use which server is in ``test_mcp_policy.py``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from agents_app.models import Agent
from chat_app import services
from chat_app.models import Conversation, Message
from tests.fakes.anthropic_server import text_reply, tool_use_reply
from tools_app.mcp_client import McpConfigError, McpToolset, mcp_tool_name, validate_mcp_servers
from tools_app.models import ToolRule
from tools_app.registry import ToolContext, all_tools
from tools_app.services import tool_confirmation_decide

from tools_app.mcp_policy import mcp_servers_for_run

from .conftest import ANALYST, aregister_mcp_server, open_stream, stream_path

pytestmark = pytest.mark.django_db(transaction=True)


async def _set_agent(role: str, **fields) -> None:
    await Agent.objects.filter(role=role).aupdate(**fields)


def _tool_result(request) -> dict:
    last = request.json["messages"][-1]
    assert last["role"] == "user"
    (block,) = [b for b in last["content"] if b["type"] == "tool_result"]
    return block


async def test_mcp_server_configuration_tools_reach_model_and_run(user, claude, mcp_stdio):
    """The agent's registered stdio server, approval required by default: approve, "5" goes back to the model."""
    await aregister_mcp_server(mcp_stdio)
    claude.script(tool_use_reply("mcp__calc__add", {"a": 2, "b": 3}, id="toolu_add"), text_reply("2 + 3 = 5"))
    created = await services.run_start(user=user, input="add 2 and 3", agent_role=ANALYST)
    events = []
    async for event in services.run_subscribe(run_id=str(created.run.id)):
        events.append(event)
        if event.event == "tool.state" and event.payload["status"] == "awaiting_input":
            await sync_to_async(tool_confirmation_decide)(
                user=user, confirmation_id=event.payload["confirmationId"], approved=True)

    first, second = claude.requests_to("/v1/messages")
    offered = {t["name"]: t for t in first.json["tools"]}
    assert offered["mcp__calc__add"]["input_schema"]["required"] == ["a", "b"]
    assert offered["mcp__calc__add"]["description"] == "Add two integers and return the sum."
    assert {"mcp__calc__echo", "mcp__calc__fail", "bash"} <= set(offered)
    result = _tool_result(second)
    assert result["tool_use_id"] == "toolu_add" and result["content"] == "5" and not result["is_error"]

    states = [e.payload["status"] for e in events if e.event == "tool.state"]
    assert states == ["pending", "awaiting_input", "running", "succeeded"]
    assert events[-1].payload["status"] == "succeeded" and events[-1].payload["text"] == "2 + 3 = 5"
    tool_message = await Message.objects.aget(conversation=created.conversation, role="tool")
    assert tool_message.content == "5" and tool_message.metadata["name"] == "mcp__calc__add"


async def test_mcp_tool_approval_override_skips_confirmation(user, claude, mcp_stdio):
    await aregister_mcp_server(mcp_stdio)
    await ToolRule.objects.acreate(scope="agent", agent=await Agent.objects.aget(role=ANALYST), effect="allow",
                                   tool="mcp__calc__add")
    claude.script(tool_use_reply("mcp__calc__add", {"a": 40, "b": 2}), text_reply("42"))
    created = await services.run_start(user=user, input="add", agent_role=ANALYST)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert [e.payload["status"] for e in events if e.event == "tool.state"] == ["pending", "running", "succeeded"]
    assert _tool_result(claude.requests_to("/v1/messages")[1])["content"] == "42"


async def test_mcp_tool_denied_is_not_run(user, claude, mcp_stdio):
    await aregister_mcp_server(mcp_stdio)
    claude.script(tool_use_reply("mcp__calc__add", {"a": 1, "b": 1}), text_reply("ok, I will not"))
    created = await services.run_start(user=user, input="add", agent_role=ANALYST)
    async for event in services.run_subscribe(run_id=str(created.run.id)):
        if event.event == "tool.state" and event.payload["status"] == "awaiting_input":
            await sync_to_async(tool_confirmation_decide)(
                user=user, confirmation_id=event.payload["confirmationId"], approved=False)
    result = _tool_result(claude.requests_to("/v1/messages")[1])
    assert result["is_error"] and "denied" in result["content"]


async def test_mcp_server_config_requires_approval_false_and_error_result(user, claude, mcp_stdio):
    """Server-level ``requires_approval: false``; a tool that fails comes back as is_error."""
    await aregister_mcp_server({**mcp_stdio, "requires_approval": False})
    claude.script(tool_use_reply("mcp__calc__fail", {}), text_reply("it failed"))
    created = await services.run_start(user=user, input="fail", agent_role=ANALYST)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    assert [e.payload["status"] for e in events if e.event == "tool.state"] == ["pending", "running", "failed"]
    result = _tool_result(claude.requests_to("/v1/messages")[1])
    assert result["is_error"] and "fail" in result["content"]
    assert events[-1].payload["status"] == "succeeded"


@pytest.mark.parametrize("named", ["calc", {"name": "calc"}])
async def test_mcp_per_request_http_server_through_stream(user, token, claude, mcp_http, agents, named):
    """A request names a registered HTTP server (trusted: it is on 127.0.0.1; with headers) that
    the agent may use on request, on the seed-003 endpoint."""
    await aregister_mcp_server({"name": "calc", "url": mcp_http.url, "headers": {"X-Team": "blue"},
                                "requires_approval": ["add"], "trusted": True}, always=False)
    conversation = await Conversation.objects.acreate(owner=user, title="t", agent=agents[ANALYST])
    claude.script(tool_use_reply("mcp__calc__header", {"name": "x-team"}), text_reply("done"))
    body = {"content": "which team?", "mcpServers": [named]}
    stream = await open_stream(stream_path(str(conversation.id)), token=token, body=body)
    events = await stream.events(timeout=20)
    await stream.close()
    assert [e.data["status"] for e in events if e.event == "tool_use"] == ["pending", "running", "succeeded"]
    assert [e.data for e in events if e.event == "tool_use"][-1]["output"] == "blue"
    assert _tool_result(claude.requests_to("/v1/messages")[1])["content"] == "blue"
    assert events[-1].event == "done"
    # The request's servers were for that request only: a run that names none gets none.
    assert await sync_to_async(mcp_servers_for_run)(user=user, agent=agents[ANALYST], requested=None) == []


async def test_mcp_server_that_cannot_start_fails_the_run_readably(user, claude):
    await aregister_mcp_server({"name": "ghost", "command": ["/nonexistent/mcp-server"]})
    created = await services.run_start(user=user, input="hi", agent_role=ANALYST)
    events = [e async for e in services.run_subscribe(run_id=str(created.run.id))]
    error = next(e.payload for e in events if e.event == "error")
    assert error["code"] == "mcp_connect_failed"
    assert "ghost" in error["message"] and "/nonexistent/mcp-server" in error["message"]
    assert "[agent dev_efficiency_analyst (engine claude" in error["message"]
    assert claude.requests == []  # the model was never called


async def test_mcp_toolset_lists_and_calls_over_stdio_and_http(mcp_stdio, mcp_http):
    ctx = ToolContext(workspace=Path("."))
    for config in (mcp_stdio, {"name": "calc", "url": mcp_http.url, "trusted": True}):
        async with McpToolset([config]) as tools:
            assert set(tools) == {f"mcp__calc__{n}" for n in ("add", "echo", "env", "header", "fail")}
            add = tools["mcp__calc__add"]
            assert add.requires_approval is True
            assert add.spec()["name"] == "mcp__calc__add"
            result = await add.run(input={"a": 2, "b": 3}, context=ctx)
            assert (result.output, result.is_error) == ("5", False)
            bad = await add.run(input={"a": "x"}, context=ctx)
            assert bad.is_error
        # Not in the global registry: MCP tools exist only while their server is connected.
        assert "mcp__calc__add" not in all_tools()


async def test_mcp_toolset_passes_env_to_stdio_server(mcp_stdio):
    config = {**mcp_stdio, "env": {**mcp_stdio["env"], "CALC_GREETING": "hej"}}
    async with McpToolset([config]) as tools:
        result = await tools["mcp__calc__env"].run(input={"name": "CALC_GREETING"}, context=ToolContext(workspace=Path(".")))
        assert result.output == "hej"
        # The server does not inherit this process's secrets.
        leaked = await tools["mcp__calc__env"].run(input={"name": "DJANGO_SETTINGS_MODULE"}, context=ToolContext(workspace=Path(".")))
        assert leaked.output == ""


async def test_mcp_toolset_closes_servers_after_a_partial_failure(mcp_stdio):
    from agents_app.engines import EngineError

    with pytest.raises(EngineError) as info:
        async with McpToolset([mcp_stdio, {"name": "down", "url": "http://127.0.0.1:9/mcp", "trusted": True}]):
            pass
    assert info.value.code == "mcp_connect_failed" and "down (http http://127.0.0.1:9/mcp)" in info.value.message
    assert _mcp_server_children() == []  # the stdio server that did start was stopped again


def _mcp_server_children() -> list[int]:
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rpartition(") ")[2].split()[1])
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"tests.fakes.mcp_server" in cmdline:
            out.append(int(proc.name))
    return out


@pytest.mark.parametrize("config, problem", [
    ("x", "must be a list"),
    ([{"command": ["x"]}], "'name'"),
    ([{"name": "a b", "command": ["x"]}], "'name'"),
    ([{"name": "a"}], "exactly one of"),
    ([{"name": "a", "command": ["x"], "url": "http://h"}], "exactly one of"),
    ([{"name": "a", "command": []}], "must not be empty"),
    ([{"name": "a", "command": [1]}], "'command'"),
    ([{"name": "a", "command": ["x"], "env": {"K": 1}}], "'env'"),
    ([{"name": "a", "url": "ftp://h"}], "'url'"),
    ([{"name": "a", "url": "http://h", "headers": ["x"]}], "'headers'"),
    ([{"name": "a", "url": "http://h", "env": {}}], "stdio"),
    ([{"name": "a", "command": ["x"], "type": "http"}], "type 'http'"),
    ([{"name": "a", "command": ["x"], "requires_approval": "yes"}], "requires_approval"),
    ([{"name": "a", "command": ["x"], "timeout": 0}], "timeout"),
    ([{"name": "a", "command": ["x"], "comand": ["y"]}], "unknown key"),
    ([{"name": "a", "command": ["x"]}, {"name": "a", "url": "http://h"}], "used twice"),
    ([{"name": "a", "command": ["x"], "trusted": True}], "'trusted' is for HTTP"),
    ([{"name": "a", "url": "http://h", "trusted": "yes"}], "'trusted' must be"),
    ([{"name": "a\n", "command": ["x"]}], "'name'"),
])
def test_mcp_config_validation_rejects_bad_shapes(config, problem):
    with pytest.raises(McpConfigError, match=problem.replace("(", r"\(")):
        validate_mcp_servers(config)


def test_mcp_config_validation_normalises_claude_sdk_style():
    assert validate_mcp_servers([{"name": "fs", "type": "stdio", "command": "npx", "args": ["-y", "srv"]}]) == [
        {"name": "fs", "command": ["npx", "-y", "srv"], "env": {}, "requires_approval": True}]
    assert validate_mcp_servers(None) == []
    assert validate_mcp_servers([{"name": "d", "url": "http://h/mcp"}]) == [
        {"name": "d", "url": "http://h/mcp", "headers": {}, "trusted": False, "requires_approval": True}]


def test_mcp_tool_names_follow_the_registry_rule():
    assert mcp_tool_name("calc", "add") == "mcp__calc__add"
    assert mcp_tool_name("My-Server", "get.Thing") == "mcp__my_server__get_thing"
    long = mcp_tool_name("s" * 40, "t" * 40)
    assert len(long) == 64 and long.startswith("mcp__sss")
    assert long != mcp_tool_name("s" * 40, "t" * 39 + "u")
