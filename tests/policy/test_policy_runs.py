"""End to end on the offline mock engine: what the policy does to real runs, on every transport."""
from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator

from chat_app.models import Message
from orchestrator_site.asgi import application
from tests.agent_chat.conftest import events_of, parse_sse, parse_with_ai_sdk, tool_states
from tools_app.models import ToolConfirmation, ToolRule

from .conftest import ROLE, bash

pytestmark = pytest.mark.django_db(transaction=True)

VERCEL = "?format=vercel-ai"


def _awaiting(frame) -> bool:
    return frame.event == "tool.state" and frame.payload["status"] == "awaiting_input"


def _states(frames) -> list[dict]:
    return [f.payload for f in events_of(frames) if f.event == "tool.state"]


async def _run(chat, text: str, conversation_id: str | None = None):
    body = {"input": text, "agentRole": ROLE, **({"conversationId": conversation_id} if conversation_id else {})}
    reader = await chat.chat(body)
    return reader, await reader.rest()


async def test_policy_run_allow_rule_runs_without_a_confirmation(chat, analyst):
    rule = await ToolRule.objects.acreate(scope="agent", agent=analyst, effect="allow", tool="bash",
                                          argument="echo *", name="echo is fine")
    reader, frames = await _run(chat, bash("echo policy-ok"))
    assert tool_states(frames) == ["pending", "running", "succeeded"]
    states = _states(frames)
    assert "policy" not in states[0]  # pending: nothing decided yet
    assert all(s["policy"] == {"effect": "allow", "rule": "echo is fine", "ruleId": rule.id} for s in states[1:])
    assert "policy-ok" in states[-1]["output"]
    assert not await ToolConfirmation.objects.aexists()


async def test_policy_run_read_only_tool_default_allows(chat, analyst):
    (analyst.workspace_path / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
    (analyst.workspace_path / "notes.txt").write_text("hello")
    _, frames = await _run(chat, '/tool read_file {"path": "notes.txt"}')
    assert tool_states(frames) == ["pending", "running", "succeeded"]
    assert _states(frames)[-1]["policy"] == {"effect": "allow", "rule": "default for read_file", "ruleId": None}


async def test_policy_run_deny_never_asks_and_the_model_sees_the_refusal(chat, analyst):
    await ToolRule.objects.acreate(scope="global", effect="deny", tool="bash", argument="rm *", name="no rm")
    await ToolRule.objects.acreate(scope="agent", agent=analyst, effect="allow", tool="bash")
    analyst.workspace_path.mkdir(parents=True, exist_ok=True)
    (analyst.workspace_path / "keep.txt").write_text("x")
    reader, frames = await _run(chat, bash("ls && rm -f keep.txt"))
    assert tool_states(frames) == ["pending", "denied"]
    denied = _states(frames)[-1]
    assert denied["policy"]["effect"] == "deny" and denied["policy"]["rule"] == "no rm"
    assert "no rm" in denied["error"] and "confirmationId" not in denied
    answer = next(f.payload["content"] for f in events_of(frames) if f.event == "agent.message")
    assert "Refused by policy rule 'no rm'" in answer  # what the model was given back
    assert (analyst.workspace_path / "keep.txt").exists()
    assert not await ToolConfirmation.objects.aexists()
    tool_message = await Message.objects.aget(run_id=reader.response["X-Run-Id"], role="tool")
    assert tool_message.metadata["status"] == "denied" and tool_message.metadata["policy"]["rule"] == "no rm"


async def test_policy_run_ask_waits_and_records_the_policy(chat, analyst):
    reader = await chat.chat({"input": bash("echo hi"), "agentRole": ROLE})
    awaiting = (await reader.until(_awaiting)).payload
    assert awaiting["policy"] == {"effect": "ask", "rule": "default for bash", "ruleId": None}
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve")
    frames = await reader.rest()
    assert [s["policy"]["effect"] for s in _states(frames)[1:]] == ["ask", "ask", "ask"]


async def test_policy_timeline_carries_the_policy(chat, analyst):
    rule = await ToolRule.objects.acreate(scope="agent", agent=analyst, effect="allow", tool="bash")
    reader, _ = await _run(chat, bash("echo timeline"))
    status, timeline = await chat.json("GET", f"/v1/agent/runs/{reader.response['X-Run-Id']}/timeline")
    assert status == 200
    states = [e["payload"] for e in timeline["events"] if e["event"] == "tool.state"]
    assert [s["status"] for s in states] == ["pending", "running", "succeeded"]
    assert states[-1]["policy"] == {"effect": "allow", "rule": rule.name, "ruleId": rule.id}


async def test_policy_remembered_decision_skips_the_next_prompt_in_that_conversation_only(chat, analyst):
    reader = await chat.chat({"input": bash("echo first"), "agentRole": ROLE})
    awaiting = (await reader.until(_awaiting)).payload
    conversation_id = reader.response["X-Conversation-Id"]
    status, decided = await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/approve",
                                      {"remember": "conversation", "pattern": "echo *"})
    assert status == 200 and decided["rule"]["scope"] == "conversation"
    assert tool_states(await reader.rest()) == ["pending", "awaiting_input", "running", "succeeded"]

    # The same conversation: no prompt, and the state says which rule let it run.
    _, frames = await _run(chat, bash("echo second"), conversation_id)
    assert tool_states(frames) == ["pending", "running", "succeeded"]
    assert _states(frames)[-1]["policy"] == {"effect": "allow", "rule": decided["rule"]["name"],
                                             "ruleId": decided["rule"]["id"]}
    # A command the pattern does not cover still asks there.
    reader = await chat.chat({"input": bash("ls"), "agentRole": ROLE, "conversationId": conversation_id})
    awaiting = (await reader.until(_awaiting)).payload
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/deny")
    await reader.rest()

    # Another conversation: asked again.
    reader = await chat.chat({"input": bash("echo second"), "agentRole": ROLE})
    assert reader.response["X-Conversation-Id"] != conversation_id
    awaiting = (await reader.until(_awaiting)).payload
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting['confirmationId']}/deny")
    await reader.rest()


async def test_policy_remembered_decision_releases_another_waiting_run(chat, analyst):
    first = await chat.chat({"input": bash("echo one"), "agentRole": ROLE})
    one = (await first.until(_awaiting)).payload
    conversation_id = first.response["X-Conversation-Id"]
    second = await chat.chat({"input": bash("echo two"), "agentRole": ROLE, "conversationId": conversation_id})
    two = (await second.until(_awaiting)).payload
    status, decided = await chat.json("POST", f"/v1/tool-confirmations/{one['confirmationId']}/approve",
                                      {"remember": "conversation", "pattern": "echo *"})
    assert decided["alsoDecided"] == [two["confirmationId"]]
    for reader in (first, second):
        frames = await reader.rest()
        assert tool_states(frames) == ["pending", "awaiting_input", "running", "succeeded"]


async def test_policy_other_user_cannot_read_or_change_conversation_rules(chat, other_chat, analyst):
    reader, _ = await _run(chat, "hello")
    path = f"/v1/conversations/{reader.response['X-Conversation-Id']}/tool-rules"
    status, rule = await chat.json("POST", path, {"effect": "allow", "tool": "bash"})
    assert status == 201
    for status, body in [await other_chat.json("GET", path),
                         await other_chat.json("POST", path, {"effect": "deny", "tool": "bash"})]:
        assert status == 404 and body["code"] == "conversation_not_found"
    response = await other_chat.client.request("DELETE", f"{path}/{rule['id']}", headers=other_chat.headers)
    assert response.status_code == 404
    status, rules = await chat.json("GET", path)
    assert [r["id"] for r in rules] == [rule["id"]]


# --- /ws/chat ------------------------------------------------------------------------------------

async def test_policy_ws_chat_confirm_with_remember(token, analyst):
    comm = WebsocketCommunicator(application, f"/ws/chat?token={token}", headers=[(b"origin", b"http://testserver")])
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_json_to({"agent_role": ROLE, "message": bash("echo via-ws")})
    while True:
        event = await comm.receive_json_from(timeout=10)
        if event.get("status") == "awaiting_input":
            break
    await comm.send_json_to({"type": "confirm", "confirmation_id": event["confirmation_id"], "approved": True,
                             "remember": "conversation", "pattern": "echo *"})
    events = []
    while not events or events[-1]["type"] not in ("done", "error"):
        events.append(await comm.receive_json_from(timeout=10))
    assert events[-1]["type"] == "done"
    rule = await ToolRule.objects.aget()
    assert (rule.scope, rule.effect, rule.tool, rule.argument) == ("conversation", "allow", "bash", "echo *")
    assert str(rule.conversation_id) == events[-1]["conversation_id"]

    # A bad remember is an error event; the socket stays usable.
    await comm.send_json_to({"type": "confirm", "confirmation_id": event["confirmation_id"], "approved": True,
                             "remember": ["agent"]})
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["code"] == "invalid_input"
    await comm.disconnect()


async def test_policy_ws_chat_remember_agent_refused_for_non_staff(token, analyst):
    comm = WebsocketCommunicator(application, f"/ws/chat?token={token}", headers=[(b"origin", b"http://testserver")])
    await comm.connect(timeout=5)
    await comm.send_json_to({"agent_role": ROLE, "message": bash("echo x")})
    while (event := await comm.receive_json_from(timeout=10)).get("status") != "awaiting_input":
        pass
    await comm.send_json_to({"type": "confirm", "confirmation_id": event["confirmation_id"], "approved": True,
                             "remember": "agent"})
    error = await comm.receive_json_from(timeout=5)
    assert error["type"] == "error" and error["code"] == "permission_denied"
    await comm.send_json_to({"type": "confirm", "confirmation_id": event["confirmation_id"], "approved": False})
    while (await comm.receive_json_from(timeout=10))["type"] not in ("done", "error"):
        pass
    await comm.disconnect()


# --- the AI SDK stream ---------------------------------------------------------------------------

def _parts(raw: str) -> list[dict]:
    return [json.loads(f.data) for f in parse_sse(raw) if f.data and f.data != "[DONE]"]


def _ui_message(text: str) -> dict:
    return {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_policy_vercel_approval_response_carries_remember(chat, ai_sdk, analyst):
    text = bash("echo from-ai-sdk")
    reader = await chat.chat({"messages": [_ui_message(text)], "agentRole": ROLE}, query=VERCEL)
    request = await reader.until(lambda f: f.data and f.json["type"] == "tool-approval-request")
    await reader.close()
    conversation_id = reader.response["X-Conversation-Id"]
    assistant = parse_with_ai_sdk(ai_sdk, reader.raw)["message"]
    for part in assistant["parts"]:
        if part["type"] == "dynamic-tool":
            part.update(state="approval-responded", approval={
                "id": request.json["approvalId"], "approved": True, "remember": "conversation", "pattern": "echo *"})
    resumed = await chat.chat({"id": conversation_id, "messages": [_ui_message(text), assistant]}, query=VERCEL)
    await resumed.rest()
    parts = _parts(resumed.raw)
    assert "tool-output-available" in [p["type"] for p in parts]
    rule = await ToolRule.objects.aget()
    assert (rule.scope, str(rule.conversation_id), rule.argument) == ("conversation", conversation_id, "echo *")

    # The next turn in this chat runs the covered command without an approval request.
    again = await chat.chat({"id": conversation_id, "messages": [_ui_message(bash("echo again"))]}, query=VERCEL)
    await again.rest()
    parts = _parts(again.raw)
    assert "tool-approval-request" not in [p["type"] for p in parts]
    states = [p["data"] for p in parts if p["type"] == "data-tool-state"]
    assert [s["status"] for s in states] == ["pending", "running", "succeeded"]
    assert states[-1]["policy"]["ruleId"] == rule.id
    result = parse_with_ai_sdk(ai_sdk, again.raw)
    assert result["invalid"] == [] and result["errors"] == []


async def test_policy_vercel_policy_denial_parses_as_denied_tool(chat, ai_sdk, analyst):
    await ToolRule.objects.acreate(scope="agent", agent=analyst, effect="deny", tool="bash")
    reader = await chat.chat({"messages": [_ui_message(bash("echo no"))], "agentRole": ROLE}, query=VERCEL)
    await reader.rest()
    types = [p["type"] for p in _parts(reader.raw)]
    assert "tool-output-denied" in types and "tool-approval-request" not in types
    result = parse_with_ai_sdk(ai_sdk, reader.raw)
    assert result["invalid"] == [] and result["errors"] == []
    tool = next(p for p in result["message"]["parts"] if p["type"] == "dynamic-tool")
    assert tool["state"] == "output-denied"


@pytest.mark.parametrize("approval", [{"remember": "forever"}, {"remember": "conversation", "pattern": 5}])
async def test_policy_vercel_bad_remember_is_400(chat, analyst, approval):
    part = {"type": "dynamic-tool", "toolName": "bash", "toolCallId": "t1", "state": "approval-responded",
            "input": {}, "approval": {"id": "00000000-0000-0000-0000-000000000000", "approved": True, **approval}}
    response = await chat.post_json(f"/v1/agent/chat{VERCEL}", {
        "messages": [_ui_message("x"), {"id": "a", "role": "assistant", "parts": [part]}]})
    assert response.status_code == 400 and response.json()["code"] == "invalid_input"
