"""CHAT-070: the AI SDK UI message stream (``?format=vercel-ai``), checked with the ``ai`` package itself."""
from __future__ import annotations

import json

import pytest

from chat_app.models import Conversation, Message
from tests.agent_chat.conftest import WRITE_TOOL, parse_sse, parse_with_ai_sdk

pytestmark = pytest.mark.django_db(transaction=True)

VERCEL = "?format=vercel-ai"


def _parts(raw: str) -> list[dict]:
    return [json.loads(f.data) for f in parse_sse(raw) if f.data and f.data != "[DONE]"]


def _types(raw: str) -> list[str]:
    return [p["type"] for p in _parts(raw)]


def _ui_message(text: str, id: str = "m1", role: str = "user") -> dict:
    return {"id": id, "role": role, "parts": [{"type": "text", "text": text}]}


async def _approve_when_asked(chat, reader) -> dict:
    request = await reader.until(lambda f: f.data and f.data != "[DONE]" and f.json["type"] == "tool-approval-request")
    await reader.until(lambda f: f.comment == "ping", timeout=3)  # keep-alive while waiting
    status, _ = await chat.json("POST", f"/v1/tool-confirmations/{request.json['approvalId']}/approve")
    assert status == 200
    return request.json


async def test_chat070_vercel_stream_with_tool_approval_parsed_by_ai_package(chat, ai_sdk, settings):
    settings.SSE_PING_INTERVAL = 0.05
    reader = await chat.chat({"input": f"{WRITE_TOOL}\nall done", "agentRole": "coder"}, query=VERCEL)
    assert reader.response["x-vercel-ai-ui-message-stream"] == "v1"
    assert reader.response["Content-Type"].startswith("text/event-stream")
    run_id, conversation_id = reader.response["X-Run-Id"], reader.response["X-Conversation-Id"]
    approval = await _approve_when_asked(chat, reader)
    await reader.rest()
    raw = reader.raw
    assert raw.endswith("data: [DONE]\n\n")

    types = _types(raw)
    assert types[:3] == ["start", "data-conversation", "start-step"]
    assert types[-2:] == ["finish-step", "finish"]
    assert types.index("tool-input-start") < types.index("tool-input-available") < types.index(
        "tool-approval-request") < types.index("tool-output-available")
    parts = _parts(raw)
    assert parts[0] == {"type": "start", "messageId": run_id,
                        "messageMetadata": {"runId": run_id, "conversationId": conversation_id}}
    assert parts[1] == {"type": "data-conversation", "data": {"conversationId": conversation_id}}
    states = [p["data"]["status"] for p in parts if p["type"] == "data-tool-state"]
    assert states == ["pending", "awaiting_input", "running", "succeeded"]
    awaiting = next(p for p in parts if p["type"] == "data-tool-state" and p["data"]["status"] == "awaiting_input")
    assert awaiting["data"]["confirmationId"] == approval["approvalId"]
    assert awaiting["id"] == approval["toolCallId"] == awaiting["data"]["toolCallId"]
    assert parts[-1]["finishReason"] == "stop" and parts[-1]["messageMetadata"]["status"] == "succeeded"

    result = parse_with_ai_sdk(ai_sdk, raw)
    assert result["invalid"] == [] and result["errors"] == [] and result["done"]
    assert [c["type"] for c in result["chunks"]] == types  # every chunk passed uiMessageChunkSchema
    message = result["message"]
    assert message["id"] == run_id and message["role"] == "assistant"
    assert message["metadata"]["conversationId"] == conversation_id
    tool = next(p for p in message["parts"] if p["type"] == "dynamic-tool")
    assert tool["toolName"] == "write_file" and tool["state"] == "output-available"
    assert tool["input"] == {"path": "notes.txt", "content": "hello from the tool"}
    assert tool["approval"]["id"] == approval["approvalId"]
    assert "notes.txt" in tool["output"]
    text = "".join(p["text"] for p in message["parts"] if p["type"] == "text")
    stored = await Message.objects.aget(run_id=run_id, role="assistant")
    assert text == stored.content and "all done" in text
    data_parts = {p["type"]: p for p in message["parts"] if p["type"].startswith("data-")}
    assert data_parts["data-conversation"]["data"] == {"conversationId": conversation_id}
    # One data-tool-state part per tool call, updated in place to its last state.
    assert data_parts["data-tool-state"]["data"]["status"] == "succeeded"


async def test_chat070_vercel_failed_run_ends_with_error_part(chat, ai_sdk):
    reader = await chat.chat({"input": "/fail upstream exploded", "agentRole": "coder"}, query=VERCEL)
    await reader.rest()
    parts = _parts(reader.raw)
    assert [p["type"] for p in parts] == ["start", "data-conversation", "start-step", "error", "finish-step", "finish"]
    assert "upstream exploded" in parts[3]["errorText"]
    assert parts[-1]["finishReason"] == "error" and "upstream exploded" in parts[-1]["messageMetadata"]["error"]
    result = parse_with_ai_sdk(ai_sdk, reader.raw)
    assert result["invalid"] == [] and result["done"]
    assert any("upstream exploded" in e for e in result["errors"])  # the SDK's onError saw it


async def test_chat070_vercel_denied_tool(chat, ai_sdk):
    reader = await chat.chat({"input": WRITE_TOOL, "agentRole": "coder"}, query=VERCEL)
    request = await reader.until(lambda f: f.data and f.json["type"] == "tool-approval-request")
    await chat.json("POST", f"/v1/tool-confirmations/{request.json['approvalId']}/deny")
    await reader.rest()
    assert "tool-output-denied" in _types(reader.raw)
    result = parse_with_ai_sdk(ai_sdk, reader.raw)
    assert result["invalid"] == [] and result["errors"] == []
    tool = next(p for p in result["message"]["parts"] if p["type"] == "dynamic-tool")
    assert tool["state"] == "output-denied"


async def test_chat070_vercel_cancelled_run(chat, ai_sdk):
    reader = await chat.chat({"input": "/sleep 30", "agentRole": "coder"}, query=VERCEL)
    await reader.until(lambda f: f.data and f.json["type"] == "start-step")
    await chat.json("POST", f"/v1/agent/runs/{reader.response['X-Run-Id']}/cancel")
    await reader.rest()
    parts = _parts(reader.raw)
    assert [p["type"] for p in parts][-3:] == ["finish-step", "abort", "finish"]
    assert parts[-1]["finishReason"] == "other"
    result = parse_with_ai_sdk(ai_sdk, reader.raw)
    assert result["invalid"] == [] and result["done"]


async def test_chat070_ai_sdk_request_body_starts_and_continues_a_conversation(chat, ai_sdk):
    first = await chat.chat({"id": "client-chat-1", "messages": [_ui_message("remember the plums")]}, query=VERCEL)
    await first.rest()
    conversation_id = first.response["X-Conversation-Id"]
    assert _parts(first.raw)[1] == {"type": "data-conversation", "data": {"conversationId": conversation_id}}
    reply = parse_with_ai_sdk(ai_sdk, first.raw)["message"]

    # The client now uses the conversation id as the chat id and sends the whole history.
    messages = [_ui_message("remember the plums"), reply, _ui_message("/recall", id="m2")]
    second = await chat.chat({"id": conversation_id, "messages": messages, "agentRole": "coder"}, query=VERCEL)
    await second.rest()
    assert second.response["X-Conversation-Id"] == conversation_id
    assert "data-conversation" not in _types(second.raw)
    text = "".join(p["text"] for p in parse_with_ai_sdk(ai_sdk, second.raw)["message"]["parts"] if p["type"] == "text")
    assert "user: remember the plums" in text
    assert await Message.objects.filter(conversation_id=conversation_id, role="user").acount() == 2


async def test_chat070_ai_sdk_body_unknown_chat_id_starts_new_conversation_with_sent_history(chat, user):
    messages = [_ui_message("earlier question", id="a"), _ui_message("earlier answer", id="b", role="assistant"),
                _ui_message("/recall", id="c")]
    reader = await chat.chat({"id": "not-a-conversation", "messages": messages, "agentRole": "coder"})
    frames = [f for f in await reader.rest() if f.data]
    assert frames[0].event == "conversation.created"  # the seed-001 dialect takes this body too
    final = next(f.payload["content"] for f in frames if f.event == "agent.message")
    assert "user: earlier question" in final and "assistant: earlier answer" in final
    assert await Conversation.objects.filter(owner=user).acount() == 1


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": "hi"},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "robot", "parts": []}]},
    {"messages": [{"role": "user", "parts": [{"type": "file", "url": "x", "mediaType": "text/plain"}]}]},
    {"messages": [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}], "agentRole": 7},
])
async def test_chat070_ai_sdk_body_errors_are_json_400(chat, body):
    response = await chat.post_json(f"/v1/agent/chat{VERCEL}", body)
    assert response.status_code == 400 and response.json()["code"] == "invalid_input"


async def test_chat070_ai_sdk_approval_response_decides_and_streams_the_rest(chat, ai_sdk, agents):
    # The client saw the approval request, then lost the stream (closed the tab, network).
    reader = await chat.chat({"id": "c1", "messages": [_ui_message(f"{WRITE_TOOL}\nfinished")]}, query=VERCEL)
    request = await reader.until(lambda f: f.data and f.json["type"] == "tool-approval-request")
    await reader.close()
    assistant = parse_with_ai_sdk(ai_sdk, reader.raw)["message"]
    tool = next(p for p in assistant["parts"] if p["type"] == "dynamic-tool")
    assert tool["state"] == "approval-requested"

    # What useChat's addToolApprovalResponse({id, approved: true}) puts in the next request.
    tool.update(state="approval-responded", approval={"id": request.json["approvalId"], "approved": True})
    conversation_id = reader.response["X-Conversation-Id"]
    body = {"id": conversation_id, "messages": [_ui_message(f"{WRITE_TOOL}\nfinished"), assistant]}
    resumed = await chat.chat(body, query=VERCEL)
    await resumed.rest()
    assert resumed.response["X-Run-Id"] == reader.response["X-Run-Id"]
    types = _types(resumed.raw)
    assert types[0] == "start" and "tool-input-start" not in types and "start-step" in types
    assert "tool-output-available" in types and types[-1] == "finish"
    result = parse_with_ai_sdk(ai_sdk, resumed.raw, message=assistant)
    assert result["invalid"] == [] and result["errors"] == []
    final_tool = next(p for p in result["message"]["parts"] if p["type"] == "dynamic-tool")
    assert final_tool["state"] == "output-available"
    assert (agents["orchestrator"].workspace_path / "notes.txt").exists()  # the default agent ran it

    # Sending the same decision again: the first decision won.
    again = await chat.post_json(f"/v1/agent/chat{VERCEL}", body)
    assert again.status_code == 409 and again.json()["code"] == "confirmation_already_decided"


async def test_chat070_ai_sdk_denial_response_with_reason(chat, ai_sdk):
    reader = await chat.chat({"messages": [_ui_message(WRITE_TOOL)]}, query=VERCEL)
    request = await reader.until(lambda f: f.data and f.json["type"] == "tool-approval-request")
    await reader.close()
    assistant = parse_with_ai_sdk(ai_sdk, reader.raw)["message"]
    for part in assistant["parts"]:
        if part["type"] == "dynamic-tool":
            part.update(state="approval-responded",
                        approval={"id": request.json["approvalId"], "approved": False, "reason": "no writes"})
    resumed = await chat.chat({"messages": [_ui_message(WRITE_TOOL), assistant]}, query=VERCEL)
    await resumed.rest()
    assert "tool-output-denied" in _types(resumed.raw)
    status, denied = await chat.json("GET", "/v1/tool-confirmations?status=denied")
    assert denied[0]["reason"] == "no writes"


async def test_chat070_ai_sdk_approval_of_other_users_confirmation_is_404(chat, other_chat):
    reader = await chat.chat({"input": WRITE_TOOL, "agentRole": "coder"})
    awaiting = await reader.until(lambda f: f.event == "tool.state" and f.payload["status"] == "awaiting_input")
    part = {"type": "dynamic-tool", "toolName": "write_file", "toolCallId": awaiting.payload["toolCallId"],
            "state": "approval-responded", "input": {},
            "approval": {"id": awaiting.payload["confirmationId"], "approved": True}}
    response = await other_chat.post_json(f"/v1/agent/chat{VERCEL}", {
        "messages": [_ui_message("x"), {"id": "a", "role": "assistant", "parts": [part]}]})
    assert response.status_code == 404 and response.json()["code"] == "confirmation_not_found"
    await chat.json("POST", f"/v1/tool-confirmations/{awaiting.payload['confirmationId']}/deny")
    await reader.rest()


async def test_chat070_vercel_reconnect_to_run_events(chat, ai_sdk):
    reader = await chat.chat({"input": "one two three four five", "agentRole": "coder"}, query=VERCEL)
    await reader.rest()
    replay = await chat.events(reader.response["X-Run-Id"], query=VERCEL)
    await replay.rest()
    def merged(types):  # how the text is cut into deltas depends on how fast it was read
        return [t for i, t in enumerate(types) if not (t == "text-delta" and i and types[i - 1] == "text-delta")]

    assert merged(_types(replay.raw)) == merged([t for t in _types(reader.raw) if t != "data-conversation"])
    result = parse_with_ai_sdk(ai_sdk, replay.raw)
    assert result["invalid"] == [] and result["errors"] == []
