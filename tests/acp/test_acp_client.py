"""``manage.py acp`` driven by the package's own client side (``acp.spawn_agent_process``)."""
from __future__ import annotations

import acp
import pytest
from acp import RequestError

from tests.fakes.anthropic_server import max_tokens_reply, text_reply, tool_use_reply
from tests.fakes.ollama_server import action

from .conftest import CLAUDE_AGENT, acp_agent, wait_until

pytestmark = pytest.mark.timeout(120)


async def _start(conn, cwd="/tmp"):
    init = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
    session = await conn.new_session(cwd=cwd, mcp_servers=[])
    return init, session.session_id


async def test_acp_initialize_and_new_session(acp_setup):
    async with acp_agent(acp_setup) as (conn, _client):
        init = await conn.initialize(protocol_version=7)  # a version this agent does not speak
        assert init.protocol_version == 1
        assert init.agent_capabilities.load_session is True
        assert init.agent_capabilities.prompt_capabilities.embedded_context is True
        assert init.agent_info.name == "agent-orchestrator"
        session = await conn.new_session(cwd="/tmp/project", mcp_servers=[])
    rows = acp_setup.query("SELECT c.id, u.username, a.role FROM chat_app_conversation c "
                           "JOIN auth_user u ON u.id = c.owner_id JOIN agents_app_agent a ON a.id = c.agent_id")
    assert [(r[0].replace("-", ""), r[1], r[2]) for r in rows] == [(session.session_id.replace("-", ""), "acp", "orchestrator")]


async def test_acp_prompt_streams_claude_reply(acp_setup, with_claude):
    with_claude.script(text_reply(["Hel", "lo ", "from Claude"]))
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[
            acp.text_block("Say hello"),
            acp.resource_link_block("notes.md", "file:///tmp/notes.md"),
            acp.resource_block(acp.embedded_text_resource("file:///tmp/a.py", "print(1)")),
        ])
    assert response.stop_reason == "end_turn"
    assert client.text(session_id=session_id) == "Hello from Claude"
    sent = with_claude.requests[-1].json
    user_text = sent["messages"][-1]["content"]
    assert "Say hello" in user_text and "file:///tmp/notes.md" in user_text and "print(1)" in user_text
    # An ordinary run, owned by the ACP user, with its timeline.
    runs = acp_setup.query("SELECT id, status, engine FROM chat_app_run")
    assert [(r[1], r[2]) for r in runs] == [("succeeded", "claude")]
    events = [r[0] for r in acp_setup.query("SELECT event FROM chat_app_runevent ORDER BY seq")]
    assert events[0] == "agent.start" and events[-1] == "agent.end"


async def test_acp_prompt_max_tokens_stop_reason(acp_setup, with_claude):
    with_claude.script(max_tokens_reply("Cut"))
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, _client):
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("long please")])
    assert response.stop_reason == "max_tokens"


async def test_acp_model_flag_overrides_model(acp_setup, with_claude):
    with_claude.script(text_reply("ok"))
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT, "--model", "claude-haiku-test") as (conn, _client):
        _, session_id = await _start(conn)
        await conn.prompt(session_id=session_id, prompt=[acp.text_block("hi")])
    assert with_claude.requests[-1].json["model"] == "claude-haiku-test"
    assert acp_setup.query("SELECT model FROM chat_app_run") == [("claude-haiku-test",)]


async def test_acp_claude_tool_call_updates(acp_setup, with_claude):
    with_claude.script(tool_use_reply("read_file", {"path": "notes.txt"}, id="toolu_1"), text_reply("Read it."))
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("read notes")])
    assert response.stop_reason == "end_turn"
    start = client.of("tool_call")[0]
    assert (start.tool_call_id, start.status, start.kind, start.raw_input) == ("toolu_1", "pending", "read", {"path": "notes.txt"})
    assert start.locations[0].path.endswith("/notes.txt")
    statuses = [u.status for u in client.of("tool_call_update") if u.tool_call_id == "toolu_1"]
    assert statuses == ["in_progress", "failed"]  # no such file in the workspace: the error is the content
    last = client.of("tool_call_update")[-1]
    assert last.content and "notes.txt" in last.content[0].content.text
    assert not client.permission_requests  # read_file is allowed by default


async def test_acp_ollama_thoughts_and_plan(acp_setup, with_ollama):
    with_ollama.script(
        action("I should look at the file first", "use_tool", tool="read_file", args={"path": "x.txt"}),
        action("Now I can answer", "final", answer="All done"),
    )
    async with acp_agent(acp_setup) as (conn, client):  # the default agent: the Ollama orchestrator
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("do it")])
    assert response.stop_reason == "end_turn"
    assert "I should look at the file first" in client.text("agent_thought_chunk")
    assert "Now I can answer" in client.text("agent_thought_chunk")
    assert client.text() == "All done"
    plans = client.of("plan")
    assert [e.status for e in plans[0].entries] == ["in_progress"]
    assert "read_file" in plans[0].entries[0].content
    assert [e.status for e in plans[-1].entries] == ["completed", "completed"]
    assert [u.status for u in client.of("tool_call_update")] == ["in_progress", "failed"]


async def test_acp_permission_allowed_once(acp_setup):
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):  # mock engine (no key)
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block(
            '/tool write_file {"path": "a.txt", "content": "hello"}')])
    assert response.stop_reason == "end_turn"
    [(asked_session, tool_call, options)] = client.permission_requests
    assert asked_session == session_id and tool_call.kind == "edit"
    assert {o.kind for o in options} == {"allow_once", "allow_always", "reject_once", "reject_always"}
    assert [u.status for u in client.of("tool_call_update")] == ["in_progress", "completed"]
    assert (acp_setup.workspaces / CLAUDE_AGENT / "a.txt").read_text() == "hello"
    assert acp_setup.query("SELECT status FROM tools_app_toolconfirmation") == [("approved",)]
    assert acp_setup.query("SELECT count(*) FROM tools_app_toolrule WHERE scope = 'conversation'") == [(0,)]


async def test_acp_permission_rejected_turn_continues(acp_setup):
    client = None
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        client.answer = lambda tool_call: "reject_once"
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block(
            '/tool write_file {"path": "a.txt", "content": "hello"}')])
    assert response.stop_reason == "end_turn"
    last = client.of("tool_call_update")[-1]
    assert last.status == "failed" and "denied" in last.content[0].content.text
    assert "Tool write_file error" in client.text()  # the model was told, and answered
    assert not (acp_setup.workspaces / CLAUDE_AGENT / "a.txt").exists()


async def test_acp_permission_allow_always_not_asked_again(acp_setup):
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        client.answer = lambda tool_call: "allow_always"
        _, session_id = await _start(conn)
        write = '/tool write_file {"path": "a.txt", "content": "one"}'
        assert (await conn.prompt(session_id=session_id, prompt=[acp.text_block(write)])).stop_reason == "end_turn"
        assert len(client.permission_requests) == 1
        again = '/tool write_file {"path": "b.txt", "content": "two"}'
        assert (await conn.prompt(session_id=session_id, prompt=[acp.text_block(again)])).stop_reason == "end_turn"
        assert len(client.permission_requests) == 1  # the conversation rule decided the second call
        # Another session is a different conversation: it is asked again.
        other = (await conn.new_session(cwd="/tmp", mcp_servers=[])).session_id
        await conn.prompt(session_id=other, prompt=[acp.text_block(again)])
        assert len(client.permission_requests) == 2
    rules = acp_setup.query("SELECT effect, tool, scope, conversation_id FROM tools_app_toolrule "
                            "WHERE scope = 'conversation' ORDER BY id")
    assert [(r[0], r[1], r[2], r[3].replace("-", "")) for r in rules][0] == (
        "allow", "write_file", "conversation", session_id.replace("-", ""))


async def test_acp_permission_cancelled_outcome_cancels_turn(acp_setup):
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        client.answer = lambda tool_call: "cancelled"
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block(
            '/tool write_file {"path": "a.txt", "content": "x"}')])
    assert response.stop_reason == "cancelled"
    assert acp_setup.query("SELECT status FROM chat_app_run") == [("cancelled",)]


async def test_acp_cancel_mid_prompt_keeps_partial_output(acp_setup):
    import asyncio

    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        _, session_id = await _start(conn)
        prompt = asyncio.create_task(conn.prompt(session_id=session_id, prompt=[acp.text_block(
            "/drip 200 0.05\n" + "word " * 100)]))
        await wait_until(lambda: len(client.of("agent_message_chunk")) >= 2)
        await conn.cancel(session_id=session_id)
        response = await asyncio.wait_for(prompt, 20)
        assert response.stop_reason == "cancelled"
        partial = client.text()
        # The session stays usable.
        again = await conn.prompt(session_id=session_id, prompt=[acp.text_block("still there?")])
        assert again.stop_reason == "end_turn"
    statuses = acp_setup.query("SELECT status FROM chat_app_run ORDER BY started_at")
    assert statuses == [("cancelled",), ("succeeded",)]
    deltas = acp_setup.query("SELECT e.payload FROM chat_app_runevent e JOIN chat_app_run r ON r.id = e.run_id "
                             "WHERE r.status = 'cancelled' AND e.event = 'agent.delta'")
    assert deltas and partial and "Mock reply from".startswith(partial[:15])
    assert len(partial) < len("Mock reply from dev_efficiency_analyst: ") + 500


async def test_acp_load_session_replays_history(acp_setup):
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, client):
        _, session_id = await _start(conn)
        await conn.prompt(session_id=session_id, prompt=[acp.text_block(
            'first question\n/tool write_file {"path": "a.txt", "content": "x"}')])
    async with acp_agent(acp_setup) as (conn, client):
        await conn.initialize(protocol_version=1)
        listed = await conn.list_sessions()
        assert session_id in [s.session_id for s in listed.sessions]
        await conn.load_session(cwd="/tmp", session_id=session_id, mcp_servers=[])
        kinds = client.kinds(session_id)
        assert kinds[0] == "user_message_chunk" and "tool_call" in kinds and "agent_message_chunk" in kinds
        assert "first question" in client.text("user_message_chunk")
        [call] = client.of("tool_call")
        assert call.status == "completed" and call.title.startswith("write_file")
        assert client.text().startswith("Mock reply")
        # The loaded session takes prompts, with the old turn as history.
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("/recall")])
        assert response.stop_reason == "end_turn"
        assert "first question" in client.text()


async def test_acp_load_session_of_another_user_is_refused(acp_setup):
    async with acp_agent(acp_setup) as (conn, _client):
        _, session_id = await _start(conn)
    acp_setup.query("INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, "
                    "is_staff, is_active, date_joined) VALUES ('!', 0, 'mallory', '', '', '', 0, 1, '2025-01-01')")
    async with acp_agent(acp_setup, "--user", "mallory") as (conn, client):
        await conn.initialize(protocol_version=1)
        with pytest.raises(RequestError) as refused:
            await conn.load_session(cwd="/tmp", session_id=session_id, mcp_servers=[])
        assert refused.value.code == -32002
        with pytest.raises(RequestError) as unknown:
            await conn.prompt(session_id=session_id, prompt=[acp.text_block("hi")])
        assert unknown.value.code == -32602
        assert client.updates == []
        assert session_id not in [s.session_id for s in (await conn.list_sessions()).sessions]


async def test_acp_allowed_tools_refuses_others(acp_setup):
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT, "--allowed-tools", "read_file") as (conn, client):
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block('/tool bash {"command": "ls"}')])
    assert response.stop_reason == "end_turn"
    assert not client.permission_requests  # refused before any approval
    last = client.of("tool_call_update")[-1]
    assert last.status == "failed" and "not in the allowed tools" in last.content[0].content.text
    assert acp_setup.query("SELECT json_extract(payload, '$.status') FROM chat_app_runevent "
                           "WHERE event = 'tool.state' ORDER BY seq DESC LIMIT 1") == [("denied",)]


async def test_acp_allowed_tools_limits_what_claude_is_offered(acp_setup, with_claude):
    with_claude.script(text_reply("ok"))
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT, "--allowed-tools", "read_file,web_*") as (conn, _client):
        _, session_id = await _start(conn)
        await conn.prompt(session_id=session_id, prompt=[acp.text_block("hi")])
    offered = sorted(t["name"] for t in with_claude.requests[-1].json["tools"])
    assert offered == ["read_file", "web_fetch"]


async def test_acp_failed_run_is_an_error_answer(acp_setup):
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, _client):
        _, session_id = await _start(conn)
        with pytest.raises(RequestError) as failed:
            await conn.prompt(session_id=session_id, prompt=[acp.text_block("/fail broken on purpose")])
        assert failed.value.code == -32603 and "broken on purpose" in str(failed.value)
        assert failed.value.data["errorCode"] == "mock_failure"
        # Still serving.
        assert (await conn.prompt(session_id=session_id, prompt=[acp.text_block("ok")])).stop_reason == "end_turn"


async def test_acp_prompt_refusal_stop_reason(acp_setup, with_claude):
    with_claude.script(text_reply("I can't help with that.", stop_reason="refusal"))
    async with acp_agent(acp_setup, "--agent", CLAUDE_AGENT) as (conn, _client):
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("something bad")])
    assert response.stop_reason == "refusal"


async def test_acp_ollama_step_limit_is_max_turn_requests(acp_setup, with_ollama):
    acp_setup.query("UPDATE agents_app_agent SET max_steps = 1 WHERE role = 'orchestrator'")
    with_ollama.script(action("look first", "use_tool", tool="read_file", args={"path": "x.txt"}))
    async with acp_agent(acp_setup) as (conn, client):
        _, session_id = await _start(conn)
        response = await conn.prompt(session_id=session_id, prompt=[acp.text_block("do it")])
    assert response.stop_reason == "max_turn_requests"
    assert "MAX STEPS" in client.text()
