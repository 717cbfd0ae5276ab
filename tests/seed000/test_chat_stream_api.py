"""``POST /api/v1/chat/stream``: framing, headers, validation and errors before the stream."""
from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from chat_app.models import Conversation

from .conftest import ANALYST, post_stream, types

pytestmark = pytest.mark.django_db(transaction=True)


async def test_chat_stream_frames_and_headers_on_mock_engine(token, agents):
    client = AsyncClient()
    response = await client.post("/api/v1/chat/stream", data=json.dumps({"agent_role": "coder", "message": "hello there"}),
                                 content_type="application/json", headers={"Authorization": f"Token {token}"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["X-Accel-Buffering"] == "no"
    assert "no-cache" in response["Cache-Control"]
    assert "Content-Encoding" not in response
    raw = b"".join([c async for c in response.streaming_content]).decode()
    frames = raw.split("\n\n")
    assert frames[-1] == ""
    for frame in frames[:-1]:
        assert frame.startswith("data: {") and "\n" not in frame  # no id:/event: lines
    events = [json.loads(f[len("data: "):]) for f in frames[:-1]]
    assert types(events)[-1] == "done" and set(types(events)[:-1]) == {"content_delta"}
    assert events[-1]["content"] == "Mock reply from coder: hello there"
    conversation = await Conversation.objects.aget(id=events[-1]["conversation_id"])
    assert conversation.title == "hello there"


async def test_chat_stream_accepts_event_stream_accept_header(token, agents):
    client = AsyncClient()
    response = await client.post("/api/v1/chat/stream", data=json.dumps({"agent_role": "coder", "message": "hi"}),
                                 content_type="application/json",
                                 headers={"Authorization": f"Token {token}", "Accept": "text/event-stream"})
    assert response.status_code == 200
    assert [c async for c in response.streaming_content]


async def test_chat_stream_shows_mock_tool_events(token, agents):
    ws = agents["coder"].workspace_path
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "notes.txt").write_text("remember the milk")
    _, events = await post_stream(token, {"agent_role": "coder", "message": '/tool read_file {"path": "notes.txt"}'})
    use, result = [e for e in events if e["type"] in ("tool_use", "tool_result")]
    assert use["name"] == "read_file" and use["input"] == {"path": "notes.txt"}
    assert result["tool_use_id"] == use["id"] and result["output"] == "remember the milk" and result["is_error"] is False


async def test_chat_stream_unknown_role_is_404_listing_roles(token, agents):
    response, body = await post_stream(token, {"agent_role": "nobody", "message": "hi"})
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert body["code"] == "agent_not_found"
    assert set(body["valid_roles"]) == {"coder", "dev_efficiency_analyst", "orchestrator", "researcher"}
    assert "dev_efficiency_analyst" in body["message"]


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"agent_role": ANALYST, "message": "hi", "conversation_history": [{"role": "system", "content": "x"}]},
         "conversation_history"),
        ({"agent_role": ANALYST, "message": "hi", "conversation_history": [{"role": "user", "content": 5}]},
         "conversation_history"),
        ({"agent_role": ANALYST, "message": "hi", "conversation_history": [{"role": "user"}]}, "conversation_history"),
        ({"agent_role": ANALYST, "message": "hi", "conversation_history": ["hello"]}, "conversation_history"),
        ({"agent_role": ANALYST, "message": "hi", "conversation_history": {"role": "user"}}, "conversation_history"),
        ({"agent_role": ANALYST}, "message"),
        ({"agent_role": ANALYST, "message": "   "}, "message"),
        ({"agent_role": ANALYST, "message": ["hi"]}, "message"),
        ({"message": "hi"}, "agent_role"),
        ({"agent_role": 7, "message": "hi"}, "agent_role"),
    ],
)
async def test_chat_stream_malformed_input_is_400_json(token, agents, payload, field):
    response, body = await post_stream(token, payload)
    assert response.status_code == 400
    assert body["code"] == "invalid_input" and field in body["errors"]
    assert not await Conversation.objects.aexists()


async def test_chat_stream_malformed_json_and_non_object_are_400(token, agents):
    response, body = await post_stream(token, None, raw_body="{not json")
    assert response.status_code == 400 and body["code"] == "malformed_json"
    response, body = await post_stream(token, None, raw_body="[1, 2]")
    assert response.status_code == 400 and body["code"] == "invalid_input"


async def test_chat_stream_requires_authentication(agents):
    response = await AsyncClient().post("/api/v1/chat/stream", data=json.dumps({"agent_role": "coder", "message": "x"}),
                                        content_type="application/json")
    assert response.status_code == 401 and json.loads(response.content)["code"] == "not_authenticated"


async def test_chat_stream_failure_is_an_error_event_then_end(token, agents):
    _, events = await post_stream(token, {"agent_role": "coder", "message": "/fail the model broke"})
    assert types(events) == ["error"]
    assert "the model broke" in events[0]["message"] and events[0]["code"] == "mock_failure"


async def test_chat_stream_only_takes_json_bodies(token, agents):
    response = await AsyncClient().post("/api/v1/chat/stream", data={"agent_role": "coder", "message": "x"},
                                        headers={"Authorization": f"Token {token}"})
    assert response.status_code == 415 and json.loads(response.content)["code"] == "unsupported_media_type"


async def test_chat_stream_sends_ping_comments_while_idle(token, agents, settings):
    settings.SSE_PING_INTERVAL = 0.1
    response = await AsyncClient().post("/api/v1/chat/stream", data=json.dumps({"agent_role": "coder", "message": "/sleep 0.5\nhi"}),
                                        content_type="application/json", headers={"Authorization": f"Token {token}"})
    raw = b"".join([c async for c in response.streaming_content]).decode()
    assert ": ping\n\n" in raw and raw.rstrip().endswith("}")
    assert json.loads(raw.rstrip().rsplit("data: ", 1)[1])["type"] == "done"
